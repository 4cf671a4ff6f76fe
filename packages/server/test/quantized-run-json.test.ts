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
    // The deployment mode names the blocks, and the rule that chose it is stated.
    expect(lastJson(stdout).memory.deployment.mode).toBe('resident+quant');
    expect(lastJson(stdout).memory.deployment.rule).toMatch(/^resident when every weight fits the VRAM budget/);
  });

  it('under a VRAM budget the file is paged in its blocks: paged+quant', async () => {
    const gguf = join(tmp, 'q8_0.gguf');
    await convertToGguf({ source: join(FIXTURES, 'models/tiny-shakespeare-qwen3'), out: gguf, type: 'Q8_0' });
    const whole = lastJson((await nerva(['run', '--model', gguf, '--backend', 'cpu', '--prompt-ids', '1,2,3', '--max-tokens', '4', '--temperature', '0', '--json'])).stdout);
    // Half the weights beside the activations and a KV floor (~6.6 MiB at the CLI's default shapes): the rest must stream.
    const budget = Math.floor(whole.memory.weights.total_bytes * 0.5) + 8 * 2 ** 20;
    const paged = lastJson(
      (await nerva(['run', '--model', gguf, '--backend', 'cpu', '--vram-budget', String(budget), '--prompt-ids', '1,2,3', '--max-tokens', '4', '--temperature', '0', '--json'])).stdout,
    );
    expect(paged.memory.deployment.mode).toBe('paged+quant');
    expect(paged.token_ids).toEqual(whole.token_ids);
  });

  it('says a safetensors folder is exact', async () => {
    const { stdout } = await nerva(['run', '--model', join(FIXTURES, 'models/tiny-random-qwen3'), '--backend', 'cpu', '--prompt-ids', '1,2,3', '--max-tokens', '2', '--json']);
    const f = lastJson(stdout).memory.weights.format;
    expect(f).toMatchObject({ file: 'safetensors', exact: true, stored_bytes: { f32: expect.any(Number) } });
    expect(Object.keys(f.stored_bytes)).toEqual(['f32']);
    expect(lastJson(stdout).memory.deployment.mode).toBe('resident');
  });
});
