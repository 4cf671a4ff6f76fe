#!/usr/bin/env python3
"""Not a phase: ncu's CSV (--csv --metrics gpu__time_duration.sum) of a run whose last kernels are
decode steps -> per kernel name, calls and microseconds a step over the last STEPS steps of NODES
kernels each (the captured graph's node count).
  kernel_table.py FILE.csv NODES [STEPS]"""
import csv
import sys
from collections import defaultdict


def main() -> None:
    path, nodes = sys.argv[1], int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    rows = []
    with open(path, newline='') as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get('Metric Name') != 'gpu__time_duration.sum':
            continue
        v = float(r['Metric Value'].replace(',', ''))
        unit = r.get('Metric Unit', 'nsecond')
        us = v / 1000 if unit == 'nsecond' else v * 1000 if unit == 'msecond' else v
        rows.append((r['Kernel Name'], us))
    tail = rows[-nodes * steps:]
    agg = defaultdict(lambda: [0, 0.0])
    for name, us in tail:
        short = name.split('(')[0].split('<')[0].replace('void ', '')[:60]
        agg[short][0] += 1
        agg[short][1] += us
    total = sum(a[1] for a in agg.values()) / steps
    print(f'kernels {len(rows)}; last {steps} steps of {nodes}: {total:.1f} us a step (kernels alone, serialized)')
    for k, (c, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f'{us / steps:9.1f} us {c / steps:6.1f} calls  {k}')


main()
