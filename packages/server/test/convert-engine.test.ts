import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Engine } from '@nerva/engine';
import { convertToGguf } from '@nerva/models';
import { afterAll, describe, expect, it } from 'vitest';
import { FIXTURES } from './cli-helpers.js';

const MODELS = join(FIXTURES, 'models');
const tmp = mkdtempSync(join(tmpdir(), 'nerva-gguf-engine-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const names = readdirSync(MODELS).filter((d) => !d.startsWith('.'));

interface Case {
  prompt_ids: number[];
  greedy_f64: number[];
}

/** Greedy tokens and first-position logits of `model` on the CPU backend. */
async function greedy(model: string, cases: Case[]): Promise<{ tokens: number[][]; logits: Float32Array[] }> {
  const engine = await Engine.create({ model, backend: 'cpu' });
  try {
    const tokens: number[][] = [];
    const logits: Float32Array[] = [];
    for (const c of cases) {
      const out = await engine.submit(c.prompt_ids, { temperature: 0, maxTokens: c.greedy_f64.length, ignoreEos: true, returnPromptLogits: true }).done;
      tokens.push(out.tokenIds);
      logits.push(out.promptLogits!);
    }
    return { tokens, logits };
  } finally {
    engine.dispose();
  }
}

describe('engine on a converted GGUF (CPU backend)', () => {
  it('covers every fixture model', () => {
    expect(names.length).toBeGreaterThanOrEqual(6);
  });

  it.each(names)('%s: the F32 GGUF generates the same greedy tokens and logits as the safetensors folder', async (name) => {
    const dir = join(MODELS, name);
    const cases = (JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: Case[] }).cases;
    expect(cases.length).toBeGreaterThan(0);
    const out = join(tmp, `${name}.gguf`);
    await convertToGguf({ source: dir, out, type: 'F32' });
    const st = await greedy(dir, cases);
    const gg = await greedy(out, cases);
    expect(gg.tokens).toEqual(st.tokens);
    // The same f32 weights (bf16/f16 sources widen exactly) through the same kernels: identical logits.
    const bytes = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
    for (let i = 0; i < cases.length; i++) expect(bytes(gg.logits[i]).equals(bytes(st.logits[i]))).toBe(true);
  });
});
