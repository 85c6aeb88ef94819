#!/usr/bin/env python3
"""Scans a binary for AVX-512 instructions and checks where they are.

The default build's baseline is x86-64-v3 (AVX2 + FMA): AVX-512 code may appear only in
the per-level kernels (src/backend/cpu/isa_kernel.h), whose functions live in the
namespaces athanor::cpu::avx512 and athanor::cpu::avx512_bf16, and AVX512_BF16
instructions only in the latter. Any other function with an AVX-512 instruction would
die with SIGILL on an AVX2-only CPU (Zen 3, Haswell). Also checks the scan is not
vacuous: the avx512 levels must hold many AVX-512 functions, and the bf16 dot product
must be there.

usage: isa_scan.py BINARY
An AVX-512 instruction is an EVEX-encoded one (first opcode byte 0x62 after any segment or
address-size prefix; in 64-bit mode 0x62 is nothing else) or one naming an opmask
register (%k0-%k7, the VEX-encoded k-instructions)."""
import re
import subprocess
import sys

ALLOWED = ("athanor::cpu::avx512::", "athanor::cpu::avx512_bf16::")
BF16_ONLY = ("athanor::cpu::avx512_bf16::",)
BF16_MNEMONICS = re.compile(r"\b(vdpbf16ps|vcvtne2ps2bf16|vcvtneps2bf16)\b")
PREFIXES = {0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x67}
FUNC = re.compile(r"^[0-9a-f]+ <(.*)>:$")
INSN = re.compile(r"^\s*[0-9a-f]+:\s+((?:[0-9a-f]{2} )+)\s*(.*)$")
OPMASK = re.compile(r"%k[0-7]\b")


def top_level(name):
    """The demangled name without what is inside <...> and (...): the function's own scope."""
    out, depth = [], 0
    for c in name:
        if c in "<(":
            depth += 1
        elif c in ">)" and depth > 0:
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out)


def in_namespaces(name, namespaces):
    own = top_level(name)
    return any(own.startswith(ns) or (" " + ns) in own for ns in namespaces)


def evex(byte_text):
    bs = [int(b, 16) for b in byte_text.split()]
    i = 0
    while i < len(bs) and bs[i] in PREFIXES:
        i += 1
    return i < len(bs) and bs[i] == 0x62


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = subprocess.run(["objdump", "-d", "-w", "-C", sys.argv[1]], check=True, capture_output=True, text=True).stdout
    avx512 = {}  # function -> count of AVX-512 instructions
    bf16 = {}  # function -> count of AVX512_BF16 instructions
    fn = None
    for line in out.splitlines():
        m = FUNC.match(line)
        if m:
            fn = m.group(1)
            continue
        m = INSN.match(line)
        if not m or fn is None:
            continue
        text = m.group(2)
        if evex(m.group(1)) or OPMASK.search(text):
            avx512[fn] = avx512.get(fn, 0) + 1
        if BF16_MNEMONICS.search(text):
            bf16[fn] = bf16.get(fn, 0) + 1
    bad = sorted(f for f in avx512 if not in_namespaces(f, ALLOWED))
    bad_bf16 = sorted(f for f in bf16 if not in_namespaces(f, BF16_ONLY))
    per_ns = {ns: sum(1 for f in avx512 if in_namespaces(f, (ns,))) for ns in ALLOWED}
    print(f"isa_scan: {len(avx512)} functions with AVX-512 instructions "
          f"({per_ns[ALLOWED[0]]} in {ALLOWED[0]}, {per_ns[ALLOWED[1]]} in {ALLOWED[1]}); "
          f"{len(bf16)} with AVX512_BF16 instructions")
    ok = True
    if bad:
        ok = False
        print(f"FAIL: {len(bad)} functions outside the per-level kernels use AVX-512 (SIGILL on an AVX2-only CPU):")
        for f in bad[:40]:
            print(f"  {avx512[f]:5d}  {f}")
    if bad_bf16:
        ok = False
        print(f"FAIL: {len(bad_bf16)} functions outside athanor::cpu::avx512_bf16 use AVX512_BF16 instructions:")
        for f in bad_bf16[:40]:
            print(f"  {bf16[f]:5d}  {f}")
    if per_ns[ALLOWED[0]] < 50 or per_ns[ALLOWED[1]] < 50:
        ok = False
        print("FAIL: too few AVX-512 functions in the per-level kernels: were they compiled for their levels?")
    if not any("dpbf16" in f or "attention" in f for f in bf16):
        ok = False
        print("FAIL: no AVX512_BF16 dot product in the avx512_bf16 attention kernels")
    print("isa_scan: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
