import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import type { BufferSpec, DeviceBackend, DeviceBuffer, OpArgs } from '@nerva/core';
import { type PassProfile, selectBackend } from '@nerva/engine';
import { loadModelConfig, parseModelConfig } from '@nerva/models';
import { describe, expect, it } from 'vitest';
import { causalPairs, prefillFlops, prefillFlopsByClass } from '../src/flops.js';
import { CPU_GEMM_SHAPES, measureGemmRate, parseGemmShapes } from '../src/measure.js';
import { nominalBf16Peak, prefillProbe, profileSummary } from '../src/probes/prefill.js';

const run = promisify(execFile);
let root = dirname(fileURLToPath(import.meta.url));
while (!existsSync(join(root, 'pnpm-workspace.yaml'))) root = dirname(root);
const CLI = join(root, 'packages/bench/dist/cli.js');
const FIXTURES = process.env.NERVA_FIXTURES ?? resolve(root, '../shared/fixtures');
const QWEN3 = join(FIXTURES, 'models/tiny-random-qwen3');
const MOE = join(FIXTURES, 'models/tiny-random-qwen3-moe');
const bench = (args: string[]) => run(process.execPath, [CLI, ...args], { cwd: root, env: { ...process.env, NERVA_MATMUL: '' } });

describe('prefillFlops', () => {
  it('counts tiny-random-qwen3 by hand: 2·T·P_layers + 2·H·V (the last row only) and causal attention', async () => {
    const spec = await loadModelConfig(QWEN3);
    // H 64, 4 q heads and 2 kv heads of 32, I 160, 2 layers, V 512.
    const perLayer = 64 * (4 + 2 * 2) * 32 + 4 * 32 * 64 + 3 * 64 * 160; // qkv 16384 + o 8192 + mlp 30720
    expect(perLayer).toBe(55296);
    const f = prefillFlops(spec, 64);
    expect(f.layerMatmulParams).toBe(2 * 55296);
    expect(f.lmHeadParams).toBe(64 * 512);
    expect(f.gemm).toBe(2 * 64 * 110592 + 2 * 64 * 512);
    expect(f.gemm).toBe(14221312);
    // 4 · n_q · d · T(T+1)/2 per layer.
    expect(f.attention).toBe(2 * 4 * 4 * 32 * ((64 * 65) / 2));
    expect(f.attention).toBe(2129920);
    expect(f.total).toBe(f.gemm + f.attention);
    // Logits for every row would cost 2·T·H·V in the head instead.
    expect(prefillFlops(spec, 64, 64).gemm - f.gemm).toBe(2 * 63 * 64 * 512);
  });

  it('counts an MoE layer by its router and the top-k experts a token is routed to', async () => {
    const spec = await loadModelConfig(MOE);
    // H 64, d 16, 8 experts of I_moe 32, top-2: qkv 8192 + o 4096 + router 512 + 2 · 3 · 64 · 32 = 25088.
    const f = prefillFlops(spec, 10);
    expect(f.layerMatmulParams).toBe(2 * 25088);
    expect(f.gemm).toBe(2 * 10 * 50176 + 2 * 64 * 512);
    expect(f.attention).toBe(2 * 4 * 4 * 16 * 55);
  });

  it('the Qwen3-8B shape at 4096 tokens: 6.95e9 layer parameters, 5.69e13 GEMM and 4.95e12 attention FLOPs', () => {
    const spec = parseModelConfig(JSON.parse(readFileSync(resolve(root, '../shared/configs/qwen3-8b.json'), 'utf8')));
    const f = prefillFlops(spec, 4096);
    expect(f.layerMatmulParams).toBe(36 * (4096 * 48 * 128 + 32 * 128 * 4096 + 3 * 4096 * 12288));
    expect(f.layerMatmulParams).toBe(6945767424);
    expect(f.gemm).toBe(2 * 4096 * 6945767424 + 2 * 4096 * 151936);
    expect(f.attention).toBe(36 * 4 * 32 * 128 * ((4096 * 4097) / 2));
  });

  it('splits the FLOPs by the op class that computes them, summing to prefillFlops', () => {
    const spec = parseModelConfig(JSON.parse(readFileSync(resolve(root, '../shared/configs/qwen3-8b.json'), 'utf8')));
    const c = prefillFlopsByClass(spec, 4096);
    const f = prefillFlops(spec, 4096);
    expect(c.gemm_qkv).toBe(2 * 4096 * 36 * 4096 * 48 * 128);
    expect(c.gemm_o).toBe(2 * 4096 * 36 * 4096 * 4096);
    expect(c.gemm_gate_up).toBe(2 * c.gemm_down);
    expect(c.gemm_qkv + c.gemm_o + c.gemm_gate_up + c.gemm_down + c.lm_head).toBe(f.gemm);
    expect(c.attention).toBe(f.attention);
  });

  it('profileSummary sums the steps of a profiled prefill by op class, with gaps and rates', async () => {
    const spec = await loadModelConfig(QWEN3);
    const steps: PassProfile[] = [
      { rows: 32, deviceMs: 10, buckets: { projection: 4, attention: 3 }, ops: { gemm_qkv: 1, gemm_o: 3, attention: 2, rope: 1 } },
      { rows: 32, deviceMs: 8, buckets: { projection: 2, attention: 3 }, ops: { gemm_qkv: 2, attention: 3 } },
    ];
    const p = profileSummary(spec, 64, steps) as Record<string, any>;
    expect(p.steps).toBe(2);
    expect(p.rows).toBe(64);
    expect(p.device_ms).toBe(18);
    expect(p.op_total_ms).toBe(12);
    expect(p.gaps_ms).toBe(6);
    expect(Object.keys(p.ms)).toEqual(['attention', 'gemm_qkv', 'gemm_o', 'rope']);
    expect(p.ms).toEqual({ attention: 5, gemm_qkv: 3, gemm_o: 3, rope: 1 });
    expect(p.buckets_ms).toEqual({ projection: 6, attention: 6 });
    expect(p.share.attention).toBeCloseTo(5 / 12, 3);
    const c = prefillFlopsByClass(spec, 64);
    expect(p.tflops.gemm_qkv).toBeCloseTo(c.gemm_qkv / 3e-3 / 1e12, 6);
    expect(p.tflops.attention).toBeCloseTo(c.attention / 5e-3 / 1e12, 6);
    expect(p.tflops.gemm_down).toBeUndefined();
  });

  it('caps the keys of a sliding-window layer at its window', () => {
    expect(causalPairs(10)).toBe(55);
    expect(causalPairs(10, 4)).toBe(1 + 2 + 3 + 4 + 6 * 4);
    expect(causalPairs(3, 4)).toBe(6);
    const base = JSON.parse(readFileSync(join(QWEN3, 'config.json'), 'utf8'));
    const spec = parseModelConfig({ ...base, use_sliding_window: true, sliding_window: 4, layer_types: ['sliding_attention', 'full_attention'] });
    expect(prefillFlops(spec, 10).attention).toBe(4 * 4 * 32 * (34 + 55));
    expect(() => prefillFlops(spec, 0)).toThrow(/tokens must be a positive integer/);
  });
});

/** A device whose matmul takes 2·M·N·K / rate of event time: the measured rate must be that rate. */
function fakeGemmDevice(flopsPerS: number) {
  let nextId = 1;
  let clockMs = 0;
  const live = new Map<number, DeviceBuffer>();
  const stamps = new Map<number, number>();
  const ops: OpArgs<'matmul'>[] = [];
  const backend = {
    name: 'fake',
    capabilities: { deviceKind: 'cuda', computeTier: 'vram', matmulPrecision: 'bf16' },
    alloc(spec: BufferSpec): DeviceBuffer {
      const b = { id: nextId++, dtype: spec.dtype, length: spec.length, byteLength: spec.length * 4, tier: 'vram' as const, usage: spec.usage ?? 'workspace' };
      live.set(b.id, b);
      return b;
    },
    free: (b: DeviceBuffer) => void live.delete(b.id),
    write: () => {},
    run(op: string, a: OpArgs<'matmul'>) {
      expect(op).toBe('matmul');
      ops.push(a);
      clockMs += ((2 * a.rows * a.inDim * a.outDim) / flopsPerS) * 1000;
    },
    createEvent: () => ({ id: nextId++ }),
    destroyEvent: () => {},
    record: (e: { id: number }) => void stamps.set(e.id, clockMs),
    synchronize: () => {},
    elapsedMs: (a: { id: number }, b: { id: number }) => stamps.get(b.id)! - stamps.get(a.id)!,
  };
  return { backend: backend as unknown as DeviceBackend, live, ops };
}

describe('measureGemmRate', () => {
  it('times op matmul (bf16 weights, rows = M) with events for at least minMs, and returns 2·M·N·K / s', () => {
    const { backend, live, ops } = fakeGemmDevice(500e12);
    const r = measureGemmRate(backend, [
      { m: 4096, k: 4096, n: 12288 },
      { m: 4096, k: 4096, n: 4096 },
    ]);
    expect(r.matmulPrecision).toBe('bf16');
    expect(r.tflops).toBeCloseTo(500, 6);
    expect(r.shapes).toHaveLength(2);
    for (const s of r.shapes) {
      expect(s.tflops).toBeCloseTo(500, 6);
      expect(s.ms * s.iters).toBeGreaterThanOrEqual(200 - 1e-9);
    }
    // 4096 x 4096 x 12288 takes 0.824 ms here: a warm-up, one to size the run, then 243 timed.
    expect(r.shapes[0].iters).toBe(243);
    expect(ops.every((a) => a.weight.dtype === 'bf16' && a.x.dtype === 'f32' && a.out.dtype === 'f32')).toBe(true);
    expect(ops[0]).toMatchObject({ rows: 4096, inDim: 4096, outDim: 12288 });
    expect(live.size).toBe(0);
    expect(() => measureGemmRate(backend, [])).toThrow(/at least one shape/);
    expect(() => measureGemmRate(backend, [{ m: 0, k: 1, n: 1 }])).toThrow(/m must be a positive integer/);
  });

  it('gives a positive, finite rate on the CPU backend, in the precision it was created with', async () => {
    for (const matmulPrecision of ['exact', 'bf16'] as const) {
      const { backend } = await selectBackend('cpu', { matmulPrecision });
      try {
        const r = measureGemmRate(backend, CPU_GEMM_SHAPES, 30);
        expect(r.matmulPrecision).toBe(matmulPrecision);
        expect(Number.isFinite(r.tflops)).toBe(true);
        expect(r.tflops).toBeGreaterThan(0);
        expect(r.tflops).toBe(Math.max(...r.shapes.map((s) => s.tflops)));
        for (const s of r.shapes) expect(s.iters).toBeGreaterThanOrEqual(3);
        expect(backend.stats().liveBuffers).toBe(0);
      } finally {
        backend.dispose();
      }
    }
  });

  it('parses GEMM shapes, naming a bad entry', () => {
    expect(parseGemmShapes('4096x4096x12288,8x16x32')).toEqual([
      { m: 4096, k: 4096, n: 12288 },
      { m: 8, k: 16, n: 32 },
    ]);
    expect(() => parseGemmShapes('4096x4096')).toThrow(/"4096x4096" must be MxKxN/);
    expect(() => parseGemmShapes('1x0x3')).toThrow(/"1x0x3" must be MxKxN/);
  });
});

describe('nerva-bench prefill', () => {
  it('prints one JSON line: tokens/s, FLOPs by kind, the GEMM rate of the run, MFU, precision, and no hot-path allocations', async () => {
    const { stdout } = await bench(['prefill', '--backend', 'cpu', '--model', QWEN3, '--prompt-len', '64', '--repeats', '2', '--gemm-min-ms', '30', '--batch-invariant']);
    const lines = stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const j = JSON.parse(lines[0]);
    expect(j.probe).toBe('prefill');
    expect(j.backend).toBe('cpu');
    expect(j.matmul_precision).toBe('exact');
    expect(j.gemm_matmul_precision).toBe('exact');
    expect(j.numerics).toBe('exact');
    // The backend's own capability (the CPU backend has no batch-invariant mode: it ignores the flag).
    expect(j.batch_invariant).toBe(false);
    expect(typeof j.device).toBe('string');
    expect(j.prompt_len).toBe(64);
    expect(j.chunk).toBe(64);
    expect(j.chunks).toBe(1);
    expect(j.timing).toBe('device');
    expect(j.ms_all).toHaveLength(2);
    expect(j.ms_min).toBeLessThanOrEqual(j.ms_median);
    expect(j.tokens_per_s).toBeCloseTo(64 / (j.ms_median / 1000), -1);
    const spec = await loadModelConfig(QWEN3);
    const f = prefillFlops(spec, 64);
    expect([j.flops_gemm, j.flops_attention, j.flops_total]).toEqual([f.gemm, f.attention, f.total]);
    expect(j.gemm_tflops).toBeGreaterThan(0);
    expect(j.gemm_shapes.map((s: { m: number; k: number; n: number }) => [s.m, s.k, s.n])).toEqual(CPU_GEMM_SHAPES.map((s) => [s.m, s.k, s.n]));
    expect(Number.isFinite(j.mfu)).toBe(true);
    expect(j.mfu).toBeGreaterThan(0);
    // mfu is the achieved rate over the measured one (both rounded to 4 digits in the line).
    expect(j.mfu).toBeCloseTo(f.total / (j.ms_median / 1000) / 1e12 / j.gemm_tflops, 1);
    expect(j.mfu_best).toBeGreaterThanOrEqual(j.mfu);
    expect(j.peak_tflops_nominal).toBeNull();
    expect(j.mfu_vs_peak).toBeNull();
    expect(j.hot_path_allocations).toBe(0);
  }, 120_000);

  it('--profile adds the op-level device times of one more prefill, by op class; the timed ones stay unprofiled', async () => {
    const { stdout } = await bench(['prefill', '--backend', 'cpu', '--model', QWEN3, '--prompt-len', '64', '--repeats', '1', '--gemm-min-ms', '10', '--profile']);
    const j = JSON.parse(stdout.trim());
    expect(j.ms_all).toHaveLength(1);
    const p = j.profile;
    expect(p.steps).toBe(1);
    expect(p.rows).toBe(64);
    for (const k of ['gemm_qkv', 'gemm_o', 'gemm_gate_up', 'gemm_down', 'lm_head', 'attention', 'rmsnorm', 'rope_append', 'silu_mul', 'embedding', 'gather_rows']) {
      expect(p.ms[k], k).toBeGreaterThanOrEqual(0);
    }
    const sum = Object.values(p.ms as Record<string, number>).reduce((a, b) => a + b, 0);
    expect(p.op_total_ms).toBeCloseTo(sum, 1);
    expect(p.tflops.gemm_gate_up).toBeGreaterThan(0);
    expect(Object.keys(p.buckets_ms)).toEqual(expect.arrayContaining(['norm', 'projection', 'attention', 'mlp', 'lm_head']));
    // Without the flag the line says so.
    const { stdout: plain } = await bench(['prefill', '--backend', 'cpu', '--model', QWEN3, '--prompt-len', '16', '--repeats', '1', '--gemm-min-ms', '5']);
    expect(JSON.parse(plain.trim()).profile).toBeNull();
  }, 120_000);

  it('--profile over a chunked prompt sums its chunks\' steps', async () => {
    const j = await prefillProbe({ model: QWEN3, backend: 'cpu', promptLen: 48, repeats: 1, chunk: 16, gemmMinMs: 5, profile: true });
    const p = j.profile as Record<string, any>;
    expect(p.steps).toBe(3);
    expect(p.rows).toBe(48);
    expect(p.ms.attention).toBeGreaterThan(0);
  }, 120_000);

  it('--matmul-precision bf16 runs and measures at bf16; --chunk splits the prompt and times to first token', async () => {
    const j = await prefillProbe({ model: QWEN3, backend: 'cpu', promptLen: 48, repeats: 1, chunk: 16, matmulPrecision: 'bf16', gemmMinMs: 20 });
    expect(j.matmul_precision).toBe('bf16');
    expect(j.gemm_matmul_precision).toBe('bf16');
    expect(j.chunk).toBe(16);
    expect(j.chunks).toBe(3);
    expect(j.timing).toBe('wall');
    expect(j.device_ms_median).toBeNull();
    expect((j.notes as string[]).some((n) => n.startsWith('matmul precision bf16'))).toBe(true);
    // The same work however it is chunked.
    expect(j.flops_total).toBe(prefillFlops(await loadModelConfig(QWEN3), 48).total);
    expect(j.mfu as number).toBeGreaterThan(0);
  }, 120_000);

  it('refuses bad options with one clear message', async () => {
    const fails = async (args: string[]) => {
      const e = await bench(['prefill', '--backend', 'cpu', '--model', QWEN3, ...args]).then(
        () => undefined,
        (x: { code: number; stderr: string }) => x,
      );
      expect(e?.code, args.join(' ')).not.toBe(0);
      return e!.stderr;
    };
    expect(await fails(['--matmul-precision', 'fp8'])).toContain("argument 'fp8' is invalid");
    expect(await fails(['--prompt-len', '0'])).toContain('--prompt-len must be a positive integer');
    expect(await fails(['--gemm-shapes', '64x64'])).toContain('"64x64" must be MxKxN');
    // tiny-random-qwen3 has 512 positions.
    expect(await fails(['--prompt-len', '600', '--gemm-min-ms', '1'])).toMatch(/prompt length 600 does not fit the model: its longest sequence is 512 tokens/);
    await expect(prefillProbe({ model: QWEN3, backend: 'cpu', promptLen: 8, repeats: 0 })).rejects.toThrow(/repeats must be a positive integer/);
  }, 120_000);

  it('decode takes --matmul-precision too and reports it', async () => {
    const { stdout } = await bench(['decode', '--backend', 'cpu', '--model', QWEN3, '--prompt-len', '16', '--new-tokens', '4', '--matmul-precision', 'bf16']);
    const j = JSON.parse(stdout.trim());
    expect(j.matmul_precision).toBe('bf16');
    expect(j.notes.some((n: string) => n.startsWith('matmul precision bf16'))).toBe(true);
    const ex = JSON.parse((await bench(['decode', '--backend', 'cpu', '--model', QWEN3, '--prompt-len', '16', '--new-tokens', '4'])).stdout.trim());
    expect(ex.matmul_precision).toBe('exact');
  }, 120_000);

  it('knows the nominal dense bf16 peaks of the GPUs it names', () => {
    expect(nominalBf16Peak('NVIDIA H100 80GB HBM3')).toEqual({ name: 'H100 SXM', tflops: 989 });
    expect(nominalBf16Peak('NVIDIA H100 PCIe')).toEqual({ name: 'H100 PCIe', tflops: 756 });
    expect(nominalBf16Peak('NVIDIA H200')).toEqual({ name: 'H200 SXM', tflops: 989 });
    expect(nominalBf16Peak('AMD EPYC 7B13')).toBeUndefined();
  });
});
