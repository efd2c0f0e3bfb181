//! The bundle file format: magic, format version, header, the plan, kernel sources and
//! PTX/cubin per arch, the weights blob (aligned, mmap-able), checksums.
