#!/usr/bin/env python3
"""Compares the machine code of every kernel in two cubins, without a GPU or cuobjdump.

    cubin_text.py OLD.cubin NEW.cubin [--only REGEX]

One line per kernel: `same` or `DIFF`, its instruction count in each (16 bytes an instruction on
sm_70 and later), and its name. Exit status 0 when every kernel of either file is byte-identical in
the other, 1 otherwise. Kernel names are matched after removing the anonymous-namespace tag nvcc
puts in them (it changes with the file's contents). What it is for: proving a refactor or a
comment-only change left the kernels' text as it was (docs/KERNELS.md, "Checking kernel text").

Make the cubins from a build's compile line (ninja -t commands <object>) with `-c -o x.o` replaced
by `-cubin -o x.cubin` and one -gencode kept.
"""
import argparse
import re
import struct
import sys

ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+_\d+_[A-Za-z0-9_]+?_[0-9a-f]{8}")


def kernels(path):
    """{normalized name: bytes of its .text section} of an ELF64 little-endian cubin."""
    with open(path, "rb") as f:
        d = f.read()
    if d[:4] != b"\x7fELF" or d[4] != 2 or d[5] != 1:
        sys.exit(f"{path}: not an ELF64 little-endian file (a cubin from nvcc -cubin)")
    shoff = struct.unpack_from("<Q", d, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    sh = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
    names_at = sh[shstrndx][4]
    out = {}
    for name_off, _type, _flags, _addr, off, size, *_ in sh:
        end = d.index(b"\0", names_at + name_off)
        name = d[names_at + name_off : end].decode()
        if name.startswith(".text."):
            out[ANON.sub("ANON", name[len(".text.") :])] = d[off : off + size]
    return out


def main():
    ap = argparse.ArgumentParser(description="Compare the kernels' machine code of two cubins.")
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--only", help="compare only kernels whose (mangled) name matches this regex")
    a = ap.parse_args()
    old, new = kernels(a.old), kernels(a.new)
    names = sorted(set(old) | set(new))
    if a.only:
        names = [n for n in names if re.search(a.only, n)]
    same_all = True
    for n in names:
        o, w = old.get(n), new.get(n)
        same = o is not None and o == w
        same_all &= same
        count = lambda t: "-" if t is None else str(len(t) // 16)
        print(f"{'same' if same else 'DIFF'} {count(o):>6} {count(w):>6}  {n}")
    if not names:
        print("no kernels to compare", file=sys.stderr)
        return 1
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
