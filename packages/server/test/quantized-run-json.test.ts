import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { convertToGguf } from '@nerva/models';
import { afterAll, describe, expect, it } from 'vitest';
import { FIXTURES, lastJson, nerva } from './cli-helpers.js';

const tmp = mkdtempSync(join(tmpdir(), 'nerva-qjson-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe('nerva run --json over a quantized GGUF', () => {
  it('labels the weights non-exact: file, tensor types and the bytes held by dtype', async () => {
    const gguf = join(tmp, 'q4_0.gguf');
    const r = await convertToGguf({ source: join(FIXTURES, 'models/tiny-random-qwen3'), out: gguf, type: 'Q4_0' });
    const want: Record<string, number> = {};
    for (const t of r.tensors) want[t.type] = (want[t.type] ?? 0) + 1;
    const { stdout, stderr } = await nerva(['run', '--model', gguf, '--backend', 'cpu', '--prompt-ids', '1,2,3', '--max-tokens', '4', '--temperature', '0', '--json']);
    const w = lastJson(stdout).memory.weights;
    expect(w.format.file).toBe('gguf');
    expect(w.format.exact).toBe(false);
    // A GGUF tensor per HF tensor here (no stacked experts): the same counts by type.
    expect(w.format.types).toEqual(want);
    expect(w.format.stored_bytes.q4_0).toBeGreaterThan(0);
    expect(Object.values(w.format.stored_bytes as Record<string, number>).reduce((a, b) => a + b, 0)).toBe(w.total_bytes);
    expect(stderr).toContain('quantized weights (Q4_0');
  });

  it('says a safetensors folder is exact', async () => {
    const { stdout } = await nerva(['run', '--model', join(FIXTURES, 'models/tiny-random-qwen3'), '--backend', 'cpu', '--prompt-ids', '1,2,3', '--max-tokens', '2', '--json']);
    const f = lastJson(stdout).memory.weights.format;
    expect(f).toMatchObject({ file: 'safetensors', exact: true, stored_bytes: { f32: expect.any(Number) } });
    expect(Object.keys(f.stored_bytes)).toEqual(['f32']);
  });
});
