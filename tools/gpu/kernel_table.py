#!/usr/bin/env python3
"""Not a phase: ncu's CSV (--csv --metrics gpu__time_duration.sum) of a run whose last kernels are
decode steps -> per kernel name, calls and microseconds a step over the last STEPS steps of NODES
kernels each (the captured graph's node count, fork_kernels.mjs prints it).
  kernel_table.py FILE.csv NODES [STEPS]
  kernel_table.py --nodes FILE.csv   (the forks' decode graph's node count, from the same output)
STEPS (3) must stay below the run's decode steps: fork_kernels.mjs 32 6 makes 5 after its prefill,
whose kernels a window of 6 steps would count."""
import csv
import json
import sys
from collections import defaultdict

UNITS_US = {'ns': 1e-3, 'nsecond': 1e-3, 'us': 1.0, 'usecond': 1.0, 'ms': 1e3, 'msecond': 1e3}


def kernel_times(path):
    """(kernel name, microseconds) per profiled kernel, in launch order."""
    with open(path, newline='') as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own log lines start with ==PROF==
    rows = []
    for r in csv.DictReader(lines):
        if r.get('Metric Name') != 'gpu__time_duration.sum':
            continue
        unit = r.get('Metric Unit', 'ns')
        if unit not in UNITS_US:
            raise ValueError(f'unknown time unit {unit!r}')
        rows.append((r['Kernel Name'], float(r['Metric Value'].replace(',', '')) * UNITS_US[unit]))
    return rows


def table(rows, nodes, steps):
    """Per short kernel name: (calls a step, microseconds a step), largest first, and the step's total."""
    if len(rows) < nodes * steps:
        raise ValueError(f'{len(rows)} kernels profiled, fewer than {steps} steps of {nodes}')
    agg = defaultdict(lambda: [0, 0.0])
    for name, us in rows[-nodes * steps:]:
        short = name.split('(')[0].split('<')[0].replace('void ', '')[:60]
        agg[short][0] += 1
        agg[short][1] += us
    out = sorted(((k, c / steps, us / steps) for k, (c, us) in agg.items()), key=lambda t: -t[2])
    return out, sum(t[2] for t in out)


def graph_nodes(path):
    """The largest decode graph's node count that fork_kernels.mjs printed into the run's output
    ({"graph_nodes": {bucket: nodes}}): the 32-row graph of the forks."""
    found = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith('{"graph_nodes"'):
                found = json.loads(line)['graph_nodes']
    if not found:
        raise ValueError('no graph_nodes line (fork_kernels.mjs prints one at its end)')
    return max(found.values())


def main():
    if len(sys.argv) == 3 and sys.argv[1] == '--nodes':
        try:
            print(graph_nodes(sys.argv[2]))
        except (OSError, ValueError) as e:
            sys.exit(f'kernel_table.py: {e}')
        return
    if len(sys.argv) not in (3, 4) or not all(a.isdigit() and int(a) > 0 for a in sys.argv[2:]):
        sys.exit('usage: kernel_table.py FILE.csv NODES [STEPS] (NODES, STEPS: positive integers)')
    nodes, steps = int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 3
    try:
        rows = kernel_times(sys.argv[1])
        out, total = table(rows, nodes, steps)
    except (OSError, ValueError) as e:
        sys.exit(f'kernel_table.py: {e}')
    print(f'kernels {len(rows)}; last {steps} steps of {nodes}: {total:.1f} us a step (kernels alone, serialized)')
    for name, calls, us in out:
        print(f'{us:9.1f} us {calls:6.1f} calls  {name}')


if __name__ == '__main__':
    main()
