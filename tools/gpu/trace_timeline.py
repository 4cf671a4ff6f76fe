#!/usr/bin/env python3
"""Reads a device timeline written by an addon built with -DNERVA_TRACE (NERVA_DEVICE_TRACE=FILE)
and prints where the last decode steps' time goes, kernel by kernel.

  python3 tools/gpu/trace_timeline.py FILE [--tokens N] [--json OUT]
  python3 tools/gpu/trace_timeline.py FILE --layer k_attn_partial_rope [--span 130]

Each traced block's thread 0 recorded {kernel tag (source line), SM, block, entry, wait release,
exit} on the GPU's %globaltimer (ns). Blocks are grouped into kernel launches by (tag, grid size)
by block index (a launch's blocks all start before the next launch of the same kernel: PDL
launches a kernel only once every block of the one before has started) and by pauses in block starts. A decode step starts at
its k_embedding launch, or where op decoder_layers gathers the rows itself (embed), at its
k_gemv_bf16_lean_embed launch.

Per launch: `wait` is the first block's release from griddepcontrol.wait (the step's predecessor
complete), `crit` the time to the next launch's release (this kernel's share of the critical
path), `work` the last block exit minus the release, `pre` how early the first block was resident.
"""
import argparse
import glob
import json
import re
import struct
import sys
from collections import defaultdict

SMS = 256
REC = 6  # u64 words a record: tag|sm|block, entry, wait, exit, grid, mark
GAP_NS = 3000


def kernel_names(sources):
    # A kernel's tag is its NERVA_TRACE_KERNEL line, plus N where it is NERVA_TRACE_KERNEL_AT(N)
    # (files whose lines would meet another file's take a base of their own).
    names, where = {}, {}
    for path in sources:
        try:
            lines = open(path).read().split('\n')
        except OSError:
            continue
        for i, l in enumerate(lines):
            m = re.search(r'NERVA_TRACE_KERNEL(?:\(\)|_AT\((\d+)\));', l)
            if m and '#define' not in l:
                for j in range(i, max(-1, i - 41), -1):
                    k = re.search(r'\b(k_\w+)\(', lines[j])
                    if k:
                        tag = int(m.group(1) or 0) + i + 1
                        if tag in names and where[tag] != path:
                            print('trace_timeline: tag %d is %s (%s) and %s (%s): give one a NERVA_TRACE_KERNEL_AT base' %
                                  (tag, names[tag], where[tag], k.group(1), path), file=sys.stderr)
                        names.setdefault(tag, k.group(1))
                        where.setdefault(tag, path)
                        break
    return names


def load(path):
    data = open(path, 'rb').read()
    cap = struct.unpack_from('<I', data, 0)[0]
    counts = struct.unpack_from('<%dI' % SMS, data, 4)
    off = 4 + 4 * SMS
    recs = []
    for sm in range(SMS):
        n = min(counts[sm], cap)
        if n == 0:
            continue
        base = off + sm * cap * REC * 8
        for i in range(n):
            a, t0, tw, te, grid, mark = struct.unpack_from('<%dQ' % REC, data, base + i * REC * 8)
            if t0 == 0:
                continue
            recs.append((a >> 40, (a >> 32) & 0xff, a & 0xffffffff, t0, tw, te, grid, mark))
    return recs, counts, cap


def launches(recs):
    by = defaultdict(list)
    for r in recs:
        by[(r[0], r[6])].append(r)
    out = []
    for key, rs in by.items():
        rs.sort(key=lambda r: r[3])
        cur, seen = [], set()
        for r in rs:
            # A new launch: a block index seen again, or a pause in block starts (the first blocks
            # of a launch may be dispatched well before the rest, so repeats alone misplace them).
            if r[2] in seen or (cur and r[3] - cur[-1][3] > GAP_NS):
                out.append((key, cur))
                cur, seen = [], set()
            cur.append(r)
            seen.add(r[2])
        if cur:
            out.append((key, cur))
    # A launch dispatched in waves may have been cut at a pause: join groups of one kernel that
    # fit together (disjoint blocks, at most the grid).
    out.sort(key=lambda g: g[1][0][3])
    joined, last = [], {}
    for key, rs in out:
        j = last.get(key)
        if j is not None and len(j[1]) + len(rs) <= key[1] and not ({r[2] for r in j[1]} & {r[2] for r in rs}):
            j[1].extend(rs)
            continue
        joined.append((key, rs))
        last[key] = joined[-1]
    out = joined
    res = []
    for (tag, grid), rs in out:
        waits = [r[4] for r in rs if r[4]]
        res.append({
            'tag': tag, 'grid': grid, 'blocks': len(rs),
            'start': min(r[3] for r in rs), 'last_start': max(r[3] for r in rs),
            'wait': min(waits) if waits else None, 'wait_last': max(waits) if waits else None,
            'end': max(r[5] for r in rs), 'recs': rs,
        })
    return res


def clusters(values, gap=3.0):
    """Sorted values (us) cut where consecutive ones are more than `gap` apart: (first, last, count)."""
    out = []
    for v in sorted(values):
        if out and v - out[-1][1] <= gap:
            out[-1] = (out[-1][0], v, out[-1][2] + 1)
        else:
            out.append((v, v, 1))
    return out


def layer_view(recs, names, kernel, span_us):
    """One layer's blocks around the middle launch of `kernel`: when each kernel's blocks became
    resident (entry), were released from griddepcontrol.wait and exited, in us from the anchor's
    first release. Launches of a grid larger than the GPU holds at once show as several clusters."""
    anchor = sorted((l for l in launches(recs) if names.get(l['tag']) == kernel), key=lambda l: l['start'])
    if not anchor:
        sys.exit('trace_timeline: no blocks of %s in the trace' % kernel)
    mid = anchor[len(anchor) // 2]
    t0 = mid['wait'] if mid['wait'] is not None else mid['start']
    # From a tenth of the span before the release (the blocks already resident) to the span after.
    win = [r for r in recs if -0.1 * span_us * 1e3 < r[3] - t0 < span_us * 1e3]
    by = defaultdict(list)
    for r in win:
        by[(names.get(r[0], 'line%d' % r[0]), r[6])].append(r)
    fmt = lambda cs: ' '.join('%.1f..%.1f (%d)' % c for c in cs[:5])
    print('%s launch %d of %d; us from its first release:' % (kernel, len(anchor) // 2, len(anchor)))
    for (name, grid), rs in sorted(by.items(), key=lambda kv: min(r[3] for r in kv[1])):
        print('  %s grid %d: %d blocks' % (name, grid, len(rs)))
        print('    entry  ' + fmt(clusters((r[3] - t0) / 1e3 for r in rs)))
        print('    wait   ' + fmt(clusters((r[4] - t0) / 1e3 for r in rs if r[4])))
        print('    exit   ' + fmt(clusters((r[5] - t0) / 1e3 for r in rs)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('file')
    ap.add_argument('--tokens', type=int, default=4)
    ap.add_argument('--json')
    ap.add_argument('--detail', help='a kernel name: its blocks in the last step')
    ap.add_argument('--layer', help='a kernel name (e.g. the attention): from its middle launch\'s release, every '
                    'block that starts within --span us, grouped by kernel and grid, with when blocks became resident, '
                    'were released and exited (clusters of blocks within 3 us of each other)')
    ap.add_argument('--span', type=float, default=130.0, help='--layer: us after the anchor release (default 130)')
    # Kernels are tagged by their line in their file (plus a base where NERVA_TRACE_KERNEL_AT
    # gives one); a tag two files share is reported.
    ap.add_argument('--src', nargs='*', default=sorted(glob.glob('packages/cuda-backend/native/ops/**/*.cu', recursive=True)),
                    help='kernel sources (default: every file of native/ops)')
    a = ap.parse_args()
    names = kernel_names(a.src)
    recs, counts, cap = load(a.file)
    if a.layer:
        layer_view(recs, names, a.layer, a.span)
        return
    ls = launches(recs)
    ls.sort(key=lambda l: (l['wait'] if l['wait'] is not None else l['start']))
    for l in ls:
        l['name'] = names.get(l['tag'], 'line%d' % l['tag'])
    # The step's first kernel: the embedding, or the first qkv that gathers the rows itself.
    emb = [i for i, l in enumerate(ls) if l['name'] in ('k_embedding', 'k_gemv_bf16_lean_embed')]
    if len(emb) < a.tokens + 1:
        sys.exit('trace_timeline: only %d decode steps in the trace' % (len(emb) - 1))
    # Complete steps: between consecutive step starts, the last one dropped (it may be a
    # trailing partial step) and the oldest ones too (the SM rings overwrote their first blocks).
    steps = []
    for k in range(len(emb) - 1 - a.tokens, len(emb) - 1):
        steps.append(ls[emb[k]:emb[k + 1]])
    summary = []
    per_pos = defaultdict(lambda: defaultdict(list))
    for si, st in enumerate(steps):
        t0 = st[0]['start']
        total = steps[si][-1]['end'] - t0
        nxt = ls[emb[len(emb) - 1 - a.tokens + si + 1]]
        step_span = (nxt['wait'] or nxt['start']) - (st[0]['wait'] or t0)
        print('step %d: %d launches, %.1f us from the first release to the next step\'s; last exit at %.1f us' %
              (si, len(st), step_span / 1e3, total / 1e3))
        for i, l in enumerate(st):
            after = st[i + 1] if i + 1 < len(st) else nxt
            w = l['wait'] if l['wait'] is not None else l['start']
            nw = after['wait'] if after['wait'] is not None else after['start']
            row = {
                'step': si, 'i': i, 'name': l['name'], 'grid': l['grid'], 'blocks': l['blocks'],
                'pre_us': (w - l['start']) / 1e3, 'crit_us': (nw - w) / 1e3, 'work_us': (l['end'] - w) / 1e3,
                'release_lag_us': ((nw - l['end']) / 1e3),
                'last_start_us': (l['last_start'] - w) / 1e3,
                'at_us': (w - (st[0]['wait'] or t0)) / 1e3,
            }
            summary.append(row)
            key = '%s/%d' % (l['name'], l['grid'])
            for f in ('crit_us', 'work_us', 'release_lag_us', 'pre_us', 'last_start_us'):
                per_pos[key][f].append(row[f])
            if si == len(steps) - 1 and (i < 14 or i >= len(st) - 8):
                print('  %3d %-20s grid %6d seen %6d  at %7.2f  pre %5.2f  crit %5.2f  work %5.2f  lag %5.2f  lastStart %5.2f' %
                      (i, l['name'], l['grid'], l['blocks'], row['at_us'], row['pre_us'], row['crit_us'], row['work_us'],
                       row['release_lag_us'], row['last_start_us']))
    print('\nper kernel (launch, grid), mean over %d steps, us per launch; sum = share of a step:' % len(steps))
    print('  %-28s %6s %8s %8s %8s %8s %8s %9s' % ('kernel/grid', 'n', 'crit', 'work', 'lag', 'pre', 'lastSt', 'crit sum'))
    rows = []
    for key, d in per_pos.items():
        n = len(d['crit_us']) / len(steps)
        mean = {f: sum(v) / len(v) for f, v in d.items()}
        rows.append((mean['crit_us'] * n, key, n, mean))
    for tot, key, n, m in sorted(rows, reverse=True):
        print('  %-28s %6.0f %8.2f %8.2f %8.2f %8.2f %8.2f %9.1f' %
              (key, n, m['crit_us'], m['work_us'], m['release_lag_us'], m['pre_us'], m['last_start_us'], tot))
    if a.detail:
        # Blocks of each launch of one kernel in the last step: when they were released and exited.
        print('\nblocks of %s in the last step (us from the launch\'s first release):' % a.detail)
        st = steps[-1]
        for l in st:
            if l['name'] != a.detail:
                continue
            rs = sorted(l['recs'], key=lambda r: r[5])
            w0 = l['wait']
            waits = sorted((r[4] - w0) / 1e3 for r in rs if r[4])
            exits = [(r[5] - w0) / 1e3 for r in rs]
            q = lambda v, f: v[min(len(v) - 1, int(f * len(v)))] if v else float('nan')
            marks = [((r[7] - w0) / 1e3, (r[5] - r[7]) / 1e3) for r in rs if r[7]]
            mk = ''
            if marks:
                # The blocks that spent longest after their mark (e.g. the attention's last split
                # of each head, which merges): mark and mark -> exit.
                tail = sorted(marks, key=lambda m: m[1])[-max(1, len(marks) // 12):]
                mk = ' | mark p50 %.2f; longest after mark: at %.2f, %.2f after' % (
                    q(sorted(m[0] for m in marks), 0.5), sum(m[0] for m in tail) / len(tail), sum(m[1] for m in tail) / len(tail))
            print('  grid %d: release p50 %.2f max %.2f | exit p10 %.2f p50 %.2f p90 %.2f, 2nd last %.2f, last %.2f (block %d)%s' %
                  (l['grid'], q(waits, 0.5), waits[-1] if waits else float('nan'), q(exits, 0.1), q(exits, 0.5), q(exits, 0.9),
                   exits[-2] if len(exits) > 1 else float('nan'), exits[-1], rs[-1][2], mk))
    if a.json:
        json.dump({'steps': summary, 'records': len(recs), 'cap': cap}, open(a.json, 'w'))


if __name__ == '__main__':
    main()
