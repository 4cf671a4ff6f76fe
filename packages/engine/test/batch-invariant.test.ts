import { join } from 'node:path';
import { createCpuBackend } from '@nerva/cpu-backend';
import { describe, expect, it } from 'vitest';
import { Engine, selectBackend } from '../src/index.js';
import { MODELS } from './fixtures.js';
import { recordingBackend } from './recording-backend.js';

const MODEL = join(MODELS, 'tiny-random-qwen3');
const PROMPT = Array.from({ length: 21 }, (_, i) => 1 + ((i * 37 + 11) % 400));

describe('batchInvariant (engine side, CPU)', () => {
  it('rejects a non-boolean with a clear error', async () => {
    await expect(Engine.create({ model: MODEL, backend: 'cpu', batchInvariant: 'yes' as unknown as boolean })).rejects.toThrow(/batchInvariant must be a boolean, got "yes"/);
    await expect(selectBackend('cpu', { batchInvariant: 1 as unknown as boolean })).rejects.toThrow(/batchInvariant must be a boolean/);
  });

  it('refuses batchInvariant: true with a backend that does not promise it', async () => {
    const cpu = createCpuBackend();
    try {
      await expect(Engine.create({ model: MODEL, backend: cpu, batchInvariant: true })).rejects.toThrow(/not batch-invariant/);
    } finally {
      cpu.dispose();
    }
  });

  it('prompt steps of several prompts run every matmul as fused_matmul, with the tokens of each request alone', async () => {
    const { backend, calls: ops } = recordingBackend([], { batchInvariant: true });
    const e = await Engine.create({ model: MODEL, backend, maxNumSeqs: 8, maxNumBatchedTokens: 64, enablePrefixCaching: false, batchInvariant: true });
    try {
      const prompts = [PROMPT, PROMPT.slice(0, 9).map((t) => t + 1), PROMPT.slice(3, 17), PROMPT.slice(0, 30)];
      const o = { temperature: 0, maxTokens: 5, ignoreEos: true };
      const alone = [];
      for (const p of prompts) alone.push(await e.submit(p, o).done);
      ops.length = 0;
      const together = await Promise.all(prompts.map((p) => e.submit(p, o).done));
      for (let i = 0; i < prompts.length; i++) expect(together[i].tokenIds, `request ${i}`).toEqual(alone[i].tokenIds);
      // The four prompts (21 + 9 + 14 + 30 = 74 tokens) took steps of more than one prompt (the
      // budget of 64 holds the first three together), and no matmul ran as op matmul.
      expect(ops.filter((c) => c.op === 'fused_matmul' && (c.rows ?? 0) >= 21 + 9).length).toBeGreaterThan(0);
      expect(ops.some((c) => c.op === 'matmul')).toBe(false);
    } finally {
      e.dispose();
      backend.dispose();
    }
  });

  it('the LM head runs as fused_matmul, and forks still equal runs one by one', async () => {
    // The CPU backend claiming batchInvariant (its rows never depend on each other).
    const { backend, calls: ops } = recordingBackend([], { batchInvariant: true });
    const e = await Engine.create({ model: MODEL, backend, maxNumSeqs: 8, enablePrefixCaching: false, batchInvariant: true });
    try {
      const o = { temperature: 0.9, topK: 50, seed: 3, maxTokens: 6, ignoreEos: true };
      const alone = [];
      for (let i = 0; i < 4; i++) alone.push(await e.submit(PROMPT, { ...o, seed: 3 + i }).done);
      ops.length = 0;
      const forks = await Promise.all(e.submitFork(PROMPT, 4, o).map((h) => h.done));
      for (let i = 0; i < 4; i++) expect(forks[i].tokenIds, `fork ${i}`).toEqual(alone[i].tokenIds);
      // The first pass samples the prompt's last row 4 times: the LM head takes 4 rows as fused_matmul.
      const vocab = e.spec.vocabSize;
      expect(ops.some((c) => c.op === 'matmul' && c.rows === 4)).toBe(false);
      expect(ops.filter((c) => c.op === 'fused_matmul' && c.rows === 4).length).toBeGreaterThan(0);
      expect(vocab).toBeGreaterThan(0);
    } finally {
      e.dispose();
      backend.dispose();
    }
  });
});
