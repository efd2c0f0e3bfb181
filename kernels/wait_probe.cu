// The probe of whether a library kernel waits for the kernel before it
// (src/runtime/session/library_probe.rs): launched as the primary of a programmatic edge into
// the library's kernel, it lets that kernel be scheduled at once, spins for `nanoseconds`, and
// only then writes the library call's inputs (up to three regions of 4-byte words, each copied
// from a saved copy). A library kernel that reads its inputs before its wait reads what was
// there before (zeros); one that waits reads the copies.

extern "C" __global__ void fusec_wait_probe(
    const unsigned* s0, unsigned* d0, unsigned long long n0,
    const unsigned* s1, unsigned* d1, unsigned long long n1,
    const unsigned* s2, unsigned* d2, unsigned long long n2,
    unsigned long long nanoseconds)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanoseconds);
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (unsigned long long i = first; i < n0; i += stride) d0[i] = s0[i];
    for (unsigned long long i = first; i < n1; i += stride) d1[i] = s1[i];
    for (unsigned long long i = first; i < n2; i += stride) d2[i] = s2[i];
}
