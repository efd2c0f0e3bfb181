#!/usr/bin/env python3
"""Reads the crash reports in a log (written by tests/crash/mod.rs) and prints, for the faulting
instruction and every stack word that points into code, the library and the offset in it,
symbolized with addr2line where BINARY (the unstripped build of the crashed executable) is
given and the address lies in it.

    python3 scripts/crash_report.py LOG [BINARY]
"""
import re
import subprocess
import sys


def reports(text):
    for block in re.findall(r"=== FUSEC CRASH REPORT\n(.*?)=== END FUSEC CRASH REPORT", text, re.S):
        head, rest = block.split("\nstack\n", 1)
        stack, maps = rest.split("\nmaps\n", 1)
        yield head, [int(w, 16) for w in stack.split()], maps


def code_ranges(maps):
    for line in maps.splitlines():
        parts = line.split()
        if len(parts) < 6 or "x" not in parts[1]:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        yield lo, hi, int(parts[2], 16), parts[5]


def file_to_vaddr(binary):
    """The binary's LOAD segments as (file offset, size, address): addr2line wants addresses."""
    out = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True).stdout
    segments = []
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "LOAD":
            segments.append((int(parts[1], 16), int(parts[4], 16), int(parts[2], 16)))
    return lambda off: next((off - o + v for o, n, v in segments if o <= off < o + n), off)


def main():
    text = open(sys.argv[1], errors="replace").read()
    binary = sys.argv[2] if len(sys.argv) > 2 else None
    vaddr = file_to_vaddr(binary) if binary else None
    for head, words, maps in reports(text):
        print(head.strip())
        ranges = list(code_ranges(maps))
        rip = int(re.search(r"rip (\w+)", head).group(1), 16)
        for label, addr in [("rip", rip)] + [("stack", w) for w in words]:
            for lo, hi, off, path in ranges:
                if lo <= addr < hi:
                    offset = addr - lo + off
                    where = ""
                    if binary and path.split("/")[-1].split("-")[0] == binary.split("/")[-1].split("-")[0]:
                        out = subprocess.run(["addr2line", "-f", "-C", "-i", "-e", binary, hex(vaddr(offset))],
                                             capture_output=True, text=True).stdout.split("\n")
                        where = " ".join(x for x in out[:2] if x)
                    print(f"  {label:5} {path.split('/')[-1]}+{offset:#x} {where}")
        print()


if __name__ == "__main__":
    main()
