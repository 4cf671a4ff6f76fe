import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { pagedWeights } from '../examples/paged-weights.js';

const here = (p: string) => fileURLToPath(new URL(p, import.meta.url));
const source = readFileSync(here('../examples/paged-weights.ts'), 'utf8');

describe('examples/paged-weights.ts', () => {
  it('is in the package README verbatim', () => {
    expect(readFileSync(here('../README.md'), 'utf8')).toContain(source.trim());
  });

  it('runs: one layer hot, seven streamed through two slots, each pass reading every layer', () => {
    const r = pagedWeights(3);
    expect(r.hot).toEqual(['embed', 'layer.0']);
    expect(r.streamed).toEqual(['layer.1', 'layer.2', 'layer.3', 'layer.4', 'layer.5', 'layer.6', 'layer.7']);
    expect(r.firstValues).toEqual([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7]);
    expect(r.stats).toEqual({ passes: 3, loads: 2 + 3 * 7, h2dBytes: (2 + 3 * 7) * 16384, diskReadBytes: 0, diskReadMs: 0, hits: 21, stalls: 0, hostWaits: 0 });
  });

  it('says in its comments what it prints', () => {
    const r = pagedWeights(1);
    expect(source).toContain(`// plan.notes[0]: '${r.notes[0]}'`);
    expect(r.notes).toHaveLength(1);
  });
});
