#!/usr/bin/env python3
"""Not a phase: the instruction mix of a kernel's largest loop, from `cuobjdump -sass` of one
function (the device machine has cuobjdump; this one has none). ab.sh's `ab_sass` writes the dump.
  sass_loop.py FILE.sass [--top N]
Prints the loop's address range, its instruction count and the count of each opcode (the part
before the first '.'), most frequent first: the figures `docs/results/quantization.md` gives for
the quantized GEMV's loop (979 instructions an iteration of four rows, 180 PRMT, 160 FFMA, ...)."""
import argparse
import re
import sys
from collections import Counter

INS = re.compile(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);')
BRA = re.compile(r'\bBRA\b.*?0x([0-9a-f]+)')


def instructions(path):
    """(address, text) of every SASS instruction in the dump, in order."""
    out = []
    with open(path) as f:
        for line in f:
            m = INS.match(line)
            if m:
                out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def largest_loop(ins):
    """(start, end) addresses of the longest backward branch's span, or None."""
    best = None
    for addr, text in ins:
        m = BRA.search(text)
        if m:
            target = int(m.group(1), 16)
            if target < addr and (best is None or addr - target > best[1] - best[0]):
                best = (target, addr)
    return best


def opcode(text):
    op = text.split()[0]
    if op.startswith('@'):  # a predicate guard
        op = text.split()[1]
    return op.split('.')[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('file')
    ap.add_argument('--top', type=int, default=30, help='opcodes to print (30)')
    a = ap.parse_args()
    ins = instructions(a.file)
    if not ins:
        sys.exit(f'sass_loop: no SASS instructions in {a.file} (cuobjdump -sass -fun MANGLED_NAME ADDON)')
    loop = largest_loop(ins)
    if loop is None:
        sys.exit(f'sass_loop: no backward branch in {a.file}: the function has no loop')
    body = [t for addr, t in ins if loop[0] <= addr <= loop[1]]
    print(f'loop 0x{loop[0]:x}..0x{loop[1]:x}: {len(body)} instructions of {len(ins)} in the function')
    for op, n in Counter(opcode(t) for t in body).most_common(a.top):
        print(f'  {n:6d} {op}')


if __name__ == '__main__':
    main()
