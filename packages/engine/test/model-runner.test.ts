import { describe, expect, it } from 'vitest';
import { Engine } from '../src/index.js';
import { join } from 'node:path';
import { DEFAULT_MODEL, MODELS } from './fixtures.js';
import { passes, recordingBackend } from './recording-backend.js';

describe('ModelRunner per-layer pass', () => {
  it('keeps the residual stream complete: o and down add into it, every norm reads it alone, no add after the last layer', async () => {
    const { backend, calls } = recordingBackend();
    const engine = await Engine.create({ model: DEFAULT_MODEL, backend });
    try {
      const layers = engine.spec.numLayers;
      const prompt = engine.encode('ROMEO:\nBut soft, what light through yonder window breaks?');
      // More than 8 rows: the prompt pass takes the per-layer ops, not the fused decode ones.
      expect(prompt.length).toBeGreaterThan(8);
      calls.length = 0;
      await engine.submit(prompt, { temperature: 0, maxTokens: 1, ignoreEos: true }).done;
      const p = passes(calls)[0];
      expect(p[0].rows).toBe(prompt.length);
      const stream = p.find((c) => c.op === 'embedding')!.args.out;
      const norms = p.filter((c) => c.op === 'rmsnorm');
      expect(norms).toHaveLength(2 * layers + 1);
      for (const n of norms) {
        expect(n.args.residual).toBeUndefined();
        expect(n.args.x).toBe(stream);
      }
      const adding = p.filter((c) => c.op === 'matmul' && c.args.accumulate === true);
      expect(adding).toHaveLength(2 * layers);
      for (const c of adding) expect(c.args.out).toBe(stream);
      expect(p.some((c) => c.op === 'add')).toBe(false);
    } finally {
      engine.dispose();
    }
  });
});

describe('ModelRunner activations', () => {
  it('holds no sublayer output apart from the residual stream in a dense model; a sparse MLP keeps its sum buffer', async () => {
    const dense = recordingBackend();
    const engine = await Engine.create({ model: DEFAULT_MODEL, backend: dense.backend });
    try {
      expect(dense.allocs).toContain('act.residual');
      expect(dense.allocs).not.toContain('act.o');
      expect(dense.allocs).not.toContain('act.mlp_out');
      const out = await engine.submit(engine.encode('ROMEO:\n'), { temperature: 0, maxTokens: 2, ignoreEos: true }).done;
      expect(out.tokenIds).toHaveLength(2);
    } finally {
      engine.dispose();
    }
    const sparse = recordingBackend();
    const moe = await Engine.create({ model: join(MODELS, 'tiny-random-qwen3-moe'), backend: sparse.backend });
    try {
      expect(sparse.allocs).toContain('act.mlp_out');
      expect(sparse.allocs).not.toContain('act.o');
    } finally {
      moe.dispose();
    }
  });
});

describe('ModelRunner fused decode pass', () => {
  it('folds every norm into a GEMV: no rmsnorm in a decode step (the final one rides in the LM head)', async () => {
    // Without decoder_layers, decode steps run the per-layer fused ops.
    const { backend, calls } = recordingBackend(['decoder_layers']);
    const engine = await Engine.create({ model: DEFAULT_MODEL, backend });
    try {
      const layers = engine.spec.numLayers;
      const prompt = engine.encode('ROMEO:\n');
      calls.length = 0;
      const out = await engine.submit(prompt, { temperature: 0, maxTokens: 3, ignoreEos: true }).done;
      expect(out.tokenIds).toHaveLength(3);
      // Decode passes are the single-row passes.
      const decode = passes(calls).filter((p) => p[0].rows === 1);
      expect(decode.length).toBeGreaterThanOrEqual(1);
      for (const p of decode) {
        expect(p.filter((c) => c.op === 'rmsnorm')).toHaveLength(0);
        const fused = p.filter((c) => c.op === 'fused_matmul');
        expect(fused).toHaveLength(4 * layers + 1);
        expect(fused.filter((c) => c.normed)).toHaveLength(2 * layers + 1);
        expect(p.filter((c) => c.op === 'rope_append')).toHaveLength(layers);
      }
    } finally {
      engine.dispose();
    }
  });

  it('runs the whole layer stack of a decode step as one decoder_layers op', async () => {
    const { backend, calls } = recordingBackend();
    const engine = await Engine.create({ model: DEFAULT_MODEL, backend });
    try {
      const prompt = engine.encode('ROMEO:\n');
      calls.length = 0;
      await engine.submit(prompt, { temperature: 0, maxTokens: 3, ignoreEos: true }).done;
      const all = passes(calls);
      // The prompt pass (many rows of one sequence) must not take it: that is the op's precondition.
      expect(all[0][0].rows).toBe(prompt.length);
      expect(all[0].some((c) => c.op === 'decoder_layers')).toBe(false);
      const decode = all.filter((p) => p[0].rows === 1);
      expect(decode.length).toBeGreaterThanOrEqual(1);
      // The prompt pass gathers its sampled (last) row; a decode pass samples every row in order,
      // so the LM head reads the residual rows directly, the final norm folded into it.
      expect(all[0].some((c) => c.op === 'gather_rows')).toBe(true);
      for (const p of decode) {
        // The embedding rides in the stack op (capabilities.opFields decoder_layers: embed): no op of its own.
        expect(p.map((c) => c.op).slice(0, 2)).toEqual(['decoder_layers', 'fused_matmul']);
        expect(p[0].args.embed).toBeDefined();
        expect(p[1].normed).toBe(true);
        // No per-layer op besides: the only fused_matmul is the LM head.
        expect(p.filter((c) => c.op === 'fused_matmul')).toHaveLength(1);
        expect(p.some((c) => c.op === 'attention' || c.op === 'rope_append')).toBe(false);
      }
    } finally {
      engine.dispose();
    }
  });

  it('runs op embedding first where the backend does not take embed in decoder_layers, with the same tokens', async () => {
    const folded = recordingBackend();
    const apart = recordingBackend([], { opFields: { sample: ['push', 'advance'] } });
    const a = await Engine.create({ model: DEFAULT_MODEL, backend: folded.backend });
    const b = await Engine.create({ model: DEFAULT_MODEL, backend: apart.backend });
    try {
      const prompt = a.encode('ROMEO:\n');
      const want = await a.submit(prompt, { temperature: 0, maxTokens: 4, ignoreEos: true }).done;
      const got = await b.submit(prompt, { temperature: 0, maxTokens: 4, ignoreEos: true }).done;
      expect(got.tokenIds).toEqual(want.tokenIds);
      const stacks = apart.calls.filter((c) => c.op === 'decoder_layers');
      expect(stacks.length).toBeGreaterThanOrEqual(1);
      expect(stacks.every((c) => c.args.embed === undefined)).toBe(true);
      for (const p of passes(apart.calls).filter((q) => q[0].rows === 1)) expect(p.map((c) => c.op).slice(0, 2)).toEqual(['embedding', 'decoder_layers']);
      expect(folded.calls.some((c) => c.op === 'decoder_layers' && c.args.embed !== undefined)).toBe(true);
    } finally {
      a.dispose();
      b.dispose();
    }
  });

  it("ends a captured decode step with op sample's push and advance where the backend folds them, with the same tokens", async () => {
    const folded = recordingBackend();
    const apart = recordingBackend([], { opFields: { decoder_layers: ['embed'] } });
    const a = await Engine.create({ model: DEFAULT_MODEL, backend: folded.backend });
    const b = await Engine.create({ model: DEFAULT_MODEL, backend: apart.backend });
    try {
      const prompt = a.encode('ROMEO:\n');
      for (const params of [{ temperature: 0 }, { temperature: 0.9, topP: 0.9, seed: 3 }]) {
        const want = await a.submit(prompt, { ...params, maxTokens: 6, ignoreEos: true }).done;
        const got = await b.submit(prompt, { ...params, maxTokens: 6, ignoreEos: true }).done;
        expect(got.tokenIds).toEqual(want.tokenIds);
      }
      const tails = (calls: typeof folded.calls) => calls.filter((c) => c.op === 'sample' && c.args.advance !== undefined);
      // The captured step's tail: one op where folded (push and advance with it) ...
      expect(tails(folded.calls).length).toBeGreaterThanOrEqual(1);
      expect(tails(folded.calls).every((c) => c.args.push !== undefined)).toBe(true);
      expect(folded.calls.some((c) => c.op === 'advance_positions')).toBe(false);
      // ... three ops apart.
      expect(tails(apart.calls)).toHaveLength(0);
      expect(apart.calls.filter((c) => c.op === 'advance_positions').length).toBeGreaterThanOrEqual(1);
      const i = apart.calls.findIndex((c) => c.op === 'advance_positions');
      expect(apart.calls.slice(i - 2, i + 1).map((c) => c.op)).toEqual(['sample', 'ring_push', 'advance_positions']);
    } finally {
      a.dispose();
      b.dispose();
    }
  });
});
