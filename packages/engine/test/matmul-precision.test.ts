import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { convertToGguf } from '@nerva/models';
import { CpuBackend } from '@nerva/cpu-backend';
import { afterEach, describe, expect, it } from 'vitest';
import { Engine, resolveMatmulPrecision, selectBackend } from '../src/index.js';
import { MODELS } from './fixtures.js';

const dir = join(MODELS, 'tiny-random-qwen3');
const prompt = Array.from({ length: 24 }, (_, i) => (i * 37 + 5) % 512);

async function promptLogits(engine: Engine): Promise<Float32Array> {
  const out = await engine.submit(prompt, { maxTokens: 1, temperature: 0, returnPromptLogits: true }).done;
  return out.promptLogits!;
}

/**
 * A CPU backend at matmul precision bf16 that claims bf16 activations (or not) and logs a line a
 * run of the ops `describe` names (undefined: not logged).
 */
function recordingBackend(bf16Act: boolean, log: string[], describe: (op: string, args: Record<string, unknown>) => string | undefined): CpuBackend {
  const inner = new CpuBackend({ matmulPrecision: 'bf16' });
  const caps = Object.freeze({ ...inner.capabilities, activationDtypes: bf16Act ? ['bf16'] : [] });
  return new Proxy(inner, {
    get(target, prop, receiver) {
      if (prop === 'capabilities') return caps;
      if (prop === 'run') {
        return (op: string, args: Record<string, unknown>, stream?: unknown) => {
          const line = describe(op, args);
          if (line !== undefined) log.push(line);
          return (target.run as (...x: unknown[]) => void)(op, args, stream);
        };
      }
      const v = Reflect.get(target, prop, receiver) as unknown;
      return typeof v === 'function' ? (v as (...x: unknown[]) => unknown).bind(target) : v;
    },
  }) as unknown as CpuBackend;
}

describe('matmulPrecision', () => {
  const saved = process.env.NERVA_MATMUL;
  afterEach(() => {
    if (saved === undefined) delete process.env.NERVA_MATMUL;
    else process.env.NERVA_MATMUL = saved;
  });

  it("'bf16' reaches the backend, says so in every ledger, and moves a prefill's logits by bf16 rounding only", async () => {
    delete process.env.NERVA_MATMUL;
    const exact = await Engine.create({ model: dir, backend: 'cpu', maxNumBatchedTokens: 64 });
    const bf16 = await Engine.create({ model: dir, backend: 'cpu', matmulPrecision: 'bf16', maxNumBatchedTokens: 64 });
    try {
      expect(exact.matmulPrecision).toBe('exact');
      expect(exact.backend.capabilities.matmulPrecision).toBe('exact');
      expect(bf16.matmulPrecision).toBe('bf16');
      expect(bf16.backend.capabilities.matmulPrecision).toBe('bf16');
      expect(bf16.backend.capabilities.numerics).toBe('exact');
      const a = await promptLogits(exact);
      const b = await promptLogits(bf16);
      // A 24-row prefill runs the many-row matmuls: the activations were rounded.
      expect(b).not.toEqual(a);
      const maxRef = Math.max(...a.map(Math.abs));
      let maxErr = 0;
      for (let i = 0; i < a.length; i++) maxErr = Math.max(maxErr, Math.abs(a[i] - b[i]));
      expect(maxErr).toBeLessThan(5e-2 * maxRef);
      const out = await bf16.submit(prompt, { maxTokens: 2, temperature: 0 }).done;
      expect(out.ledger.summary().notes.some((n) => n.startsWith('matmul precision bf16'))).toBe(true);
      const ex = await exact.submit(prompt, { maxTokens: 2, temperature: 0 }).done;
      expect(ex.ledger.summary().notes.some((n) => n.startsWith('matmul precision'))).toBe(false);
    } finally {
      exact.dispose();
      bf16.dispose();
    }
  });

  it("'bf16' hands the prefill projections bf16 inputs (activationDtypes bf16): the same logits as rounding in each matmul", async () => {
    const outs: Record<string, string[]> = { true: [], false: [] };
    const make = (bf16Act: boolean) =>
      recordingBackend(bf16Act, outs[String(bf16Act)], (op, args) => {
        const b = (op === 'matmul' ? args.x : op === 'rmsnorm' || op === 'silu_mul' ? args.out : undefined) as { dtype: string } | undefined;
        return b ? `${op}:${b.dtype}:${String(args.rows)}` : undefined;
      });
    const on = await Engine.create({ model: dir, backend: make(true), maxNumBatchedTokens: 64 });
    const off = await Engine.create({ model: dir, backend: make(false), maxNumBatchedTokens: 64 });
    try {
      expect(await promptLogits(on)).toEqual(await promptLogits(off));
      // The 24-row prefill: norms and silu_mul wrote bf16, the projections read it; the LM head's row stays f32.
      expect(outs.true).toContain('rmsnorm:bf16:24');
      expect(outs.true).toContain('silu_mul:bf16:24');
      expect(outs.true).toContain('matmul:bf16:24');
      expect(outs.true.filter((c) => c.startsWith('matmul:f32:24'))).toHaveLength(2); // o_proj of each layer reads attention's f32
      expect(outs.false.some((c) => c.includes(':bf16:'))).toBe(false);
    } finally {
      on.dispose();
      off.dispose();
    }
  });

  it("'bf16' keeps f32 inputs for block-quantized weights, which round their activations themselves", async () => {
    // A quantized weight's many-row matmul (CUDA: dequantized tiles into GEMMs) reads f32 x; a
    // bf16 x is for float weights only (CUDA refuses it over blocks). Q8_0 of the fixture: every
    // projection is blocks, so no projection may read bf16, and the logits equal a backend
    // without bf16 activations.
    const tmp = mkdtempSync(join(tmpdir(), 'nerva-mp-'));
    try {
      const gguf = join(tmp, 'q8.gguf');
      await convertToGguf({ source: dir, out: gguf, type: 'Q8_0' });
      const seen: Record<string, string[]> = { true: [], false: [] };
      const make = (bf16Act: boolean) =>
        recordingBackend(bf16Act, seen[String(bf16Act)], (op, args) =>
          op === 'matmul' ? `${(args.weight as { dtype: string }).dtype}<-${(args.x as { dtype: string }).dtype}:${String(args.rows)}` : undefined,
        );
      const on = await Engine.create({ model: gguf, backend: make(true), maxNumBatchedTokens: 64 });
      const off = await Engine.create({ model: gguf, backend: make(false), maxNumBatchedTokens: 64 });
      try {
        expect(await promptLogits(on)).toEqual(await promptLogits(off));
        const many = seen.true.filter((c) => c.endsWith(':24'));
        expect(many.filter((c) => c.startsWith('q8_0<-f32'))).toHaveLength(8); // qkv, o, gate_up, down of each layer
        expect(many.filter((c) => c.includes('<-bf16'))).toEqual([]);
      } finally {
        on.dispose();
        off.dispose();
      }
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });

  it('decode rows (at most 8) are untouched: one-token prompts give the exact logits', async () => {
    const exact = await Engine.create({ model: dir, backend: 'cpu' });
    const bf16 = await Engine.create({ model: dir, backend: 'cpu', matmulPrecision: 'bf16' });
    try {
      const one = async (e: Engine) => (await e.submit([7], { maxTokens: 1, temperature: 0, returnPromptLogits: true }).done).promptLogits!;
      expect(await one(bf16)).toEqual(await one(exact));
    } finally {
      exact.dispose();
      bf16.dispose();
    }
  });

  it('takes its default from NERVA_MATMUL; an unknown value, in the option or the environment, is one clear error', async () => {
    process.env.NERVA_MATMUL = 'bf16';
    const e = await Engine.create({ model: dir, backend: 'cpu' });
    try {
      expect(e.matmulPrecision).toBe('bf16');
    } finally {
      e.dispose();
    }
    // The option wins over the environment.
    const o = await Engine.create({ model: dir, backend: 'cpu', matmulPrecision: 'exact' });
    try {
      expect(o.matmulPrecision).toBe('exact');
    } finally {
      o.dispose();
    }
    process.env.NERVA_MATMUL = 'tf32';
    await expect(Engine.create({ model: dir, backend: 'cpu' })).rejects.toThrow(/NERVA_MATMUL must be exact or bf16, got "tf32"/);
    delete process.env.NERVA_MATMUL;
    await expect(Engine.create({ model: dir, backend: 'cpu', matmulPrecision: 'fp8' as never })).rejects.toThrow(/matmulPrecision must be exact or bf16, got fp8/);
    expect(resolveMatmulPrecision(undefined, {})).toBe('exact');
    expect(resolveMatmulPrecision(undefined, { NERVA_MATMUL: '' })).toBe('exact');
    expect(resolveMatmulPrecision(undefined, { NERVA_MATMUL: 'bf16' })).toBe('bf16');
    expect(resolveMatmulPrecision('exact', { NERVA_MATMUL: 'bf16' })).toBe('exact');
    expect(() => resolveMatmulPrecision('half' as never)).toThrow(RangeError);
  });

  it("a given backend's precision applies, and a request for another is refused", async () => {
    const backend = new CpuBackend({ matmulPrecision: 'bf16' });
    try {
      await expect(Engine.create({ model: dir, backend, matmulPrecision: 'exact' })).rejects.toThrow(/matmulPrecision 'exact' was asked for, but the given backend has 'bf16'/);
      const e = await Engine.create({ model: dir, backend });
      expect(e.matmulPrecision).toBe('bf16');
      e.dispose();
    } finally {
      backend.dispose();
    }
  });

  it('selectBackend creates the CPU backend with the precision (and falls back with it from auto)', async () => {
    const { backend } = await selectBackend('auto', { matmulPrecision: 'bf16' });
    try {
      expect(backend.capabilities.matmulPrecision).toBe('bf16');
    } finally {
      backend.dispose();
    }
  });

  it('pipeline stages run with the precision of the engine', async () => {
    const e = await Engine.create({ model: dir, backend: 'cpu', matmulPrecision: 'bf16', pipelineParallel: 2, stageDevices: [0, 1] });
    const one = await Engine.create({ model: dir, backend: 'cpu', matmulPrecision: 'bf16' });
    try {
      expect(await promptLogits(e)).toEqual(await promptLogits(one));
    } finally {
      e.dispose();
      one.dispose();
    }
  });
});
