import { execFile, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import type { DeviceBackend } from '@nerva/core';
import { afterAll, describe, expect, it } from 'vitest';
import { firstDivergence, throughputProbe, verifyIndices } from '../src/probes/throughput.js';
import { canonicalWorkloadJson, makeWorkload, readWorkload, WorkloadError, workloadSha256, workloadStats, type WorkloadOptions } from '../src/workload.js';

const run = promisify(execFile);
let root = dirname(fileURLToPath(import.meta.url));
while (!existsSync(join(root, 'pnpm-workspace.yaml'))) root = dirname(root);
const CLI = join(root, 'packages/bench/dist/cli.js');
const TINY = join(root, '../shared/fixtures/models/tiny-random-qwen3');
const TORCH_BASELINE = join(root, 'tools/gpu/torch_throughput.py');
const dir = mkdtempSync(join(tmpdir(), 'nerva-throughput-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const NANO: WorkloadOptions = { seed: 0, requests: 256, minLen: 100, maxInputLen: 1024, maxOutputLen: 1024, tokenIdLimit: 10000 };
const SMALL: WorkloadOptions = { seed: 3, requests: 400, minLen: 3, maxInputLen: 7, maxOutputLen: 9, tokenIdLimit: 50 };

const python3 = (() => {
  try {
    execFileSync('python3', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

describe('throughput workload', () => {
  it('is a pure function of the seed: the same options give the same requests and sha, another seed others', () => {
    const a = makeWorkload(NANO);
    const b = makeWorkload({ ...NANO });
    expect(b).toEqual(a);
    expect(workloadSha256(b)).toBe(workloadSha256(a));
    const c = makeWorkload({ ...NANO, seed: 1 });
    expect(workloadSha256(c)).not.toBe(workloadSha256(a));
    expect(c.requests[0].prompt_ids).not.toEqual(a.requests[0].prompt_ids);
    // nano-vllm's shape: 256 requests, ~562 prompt and ~562 output tokens on average.
    const s = workloadStats(a);
    expect(a.requests).toHaveLength(256);
    expect(s.promptTokens / 256).toBeGreaterThan(480);
    expect(s.promptTokens / 256).toBeLessThan(640);
    expect(s.maxOutputTokens / 256).toBeGreaterThan(480);
    expect(s.maxOutputTokens / 256).toBeLessThan(640);
    // The definition is pinned: a change of PRNG, draw order or serialization changes this hash,
    // and the results recorded under it would no longer be comparable.
    expect(workloadSha256(a)).toBe(PINNED_NANO_SHA);
  });

  it('honours every bound, inclusive at both ends, and draws every value of small ranges', () => {
    const w = makeWorkload(SMALL);
    const lens = new Set<number>();
    const outs = new Set<number>();
    const ids = new Set<number>();
    for (const r of w.requests) {
      lens.add(r.prompt_ids.length);
      outs.add(r.max_tokens);
      for (const t of r.prompt_ids) ids.add(t);
    }
    expect([...lens].sort((x, y) => x - y)).toEqual([3, 4, 5, 6, 7]);
    expect([...outs].sort((x, y) => x - y)).toEqual([3, 4, 5, 6, 7, 8, 9]);
    expect(Math.min(...ids)).toBe(0);
    expect(Math.max(...ids)).toBe(49);
    expect(ids.size).toBe(50);
    expect(w).toMatchObject({ seed: 3, min_len: 3, max_input_len: 7, max_output_len: 9, token_id_limit: 50 });
  });

  it('has one canonical text: the file it writes reads back equal, and the sha is that of the bytes', () => {
    const w = makeWorkload({ ...SMALL, requests: 5 });
    const file = join(dir, 'w5.json');
    writeFileSync(file, canonicalWorkloadJson(w));
    const back = readWorkload(file);
    expect(back).toEqual(w);
    expect(createHash('sha256').update(readFileSync(file)).digest('hex')).toBe(workloadSha256(w));
    // Key order and whitespace are part of the definition.
    expect(canonicalWorkloadJson(w).startsWith('{"seed":3,"min_len":3,"max_input_len":7,"max_output_len":9,"token_id_limit":50,"requests":[{"prompt_ids":[')).toBe(true);
  });

  it('rejects bad options and bad files with an error naming the problem', () => {
    expect(() => makeWorkload({ ...SMALL, minLen: 8 })).toThrow(/min-len \(8\) must not exceed max-input-len \(7\)/);
    expect(() => makeWorkload({ ...SMALL, maxOutputLen: 2 })).toThrow(/min-len \(3\) must not exceed max-output-len \(2\)/);
    expect(() => makeWorkload({ ...SMALL, requests: 0 })).toThrow(/requests must be an integer/);
    expect(() => makeWorkload({ ...SMALL, seed: -1 })).toThrow(/seed must be an integer in \[0, 4294967295\]/);
    expect(() => makeWorkload({ ...SMALL, seed: 2 ** 32 })).toThrow(WorkloadError);
    expect(() => makeWorkload({ ...SMALL, minLen: 1.5 })).toThrow(/min-len must be an integer/);
    const bad = join(dir, 'bad.json');
    const w = makeWorkload({ ...SMALL, requests: 2 });
    writeFileSync(bad, JSON.stringify({ ...w, requests: [{ prompt_ids: [1, 50], max_tokens: 3 }] }));
    expect(() => readWorkload(bad)).toThrow(/requests\[0\]\.prompt_ids holds 50, not an integer in \[0, 50\)/);
    writeFileSync(bad, JSON.stringify({ ...w, requests: [{ prompt_ids: [1], max_tokens: 0 }] }));
    expect(() => readWorkload(bad)).toThrow(/requests\[0\]\.max_tokens must be an integer >= 1/);
    writeFileSync(bad, '{"seed":0}');
    expect(() => readWorkload(bad)).toThrow(/no "requests" array/);
    expect(() => readWorkload(join(dir, 'missing.json'))).toThrow(/cannot read workload/);
  });

  it('verify picks K distinct requests spread over the workload, the longest among them', () => {
    const w = makeWorkload({ ...SMALL, requests: 40 });
    const longest = workloadStats(w).longestIndex;
    for (const k of [1, 2, 5, 8]) {
      const idx = verifyIndices(w, k);
      expect(idx).toHaveLength(k);
      expect(new Set(idx).size).toBe(k);
      expect(idx).toContain(longest);
      expect([...idx].sort((a, b) => a - b)).toEqual(idx);
    }
    expect(verifyIndices(w, 8)).toContain(39);
    expect(verifyIndices(w, 0)).toEqual([]);
    expect(verifyIndices(w, 100)).toEqual(w.requests.map((_, i) => i));
  });

  it('firstDivergence finds the first differing token, a prefix counts as diverging at its end', () => {
    expect(firstDivergence([1, 2, 3], [1, 2, 3])).toBe(-1);
    expect(firstDivergence([1, 2, 3], [1, 9, 3])).toBe(1);
    expect(firstDivergence([1, 2], [1, 2, 3])).toBe(2);
    expect(firstDivergence([], [])).toBe(-1);
  });

  it.skipIf(!python3)('tools/gpu/torch_throughput.py computes the same sha256 for the file (no torch needed)', () => {
    const w = makeWorkload({ ...SMALL, requests: 7 });
    const file = join(dir, 'w7.json');
    writeFileSync(file, canonicalWorkloadJson(w));
    const out = execFileSync('python3', [TORCH_BASELINE, '--workload', file, '--print-sha'], { encoding: 'utf8' }).trim();
    expect(out).toBe(workloadSha256(w));
    // And on the 256-request workload (large ids, long lines).
    const big = join(dir, 'nano.json');
    writeFileSync(big, canonicalWorkloadJson(makeWorkload(NANO)));
    expect(execFileSync('python3', [TORCH_BASELINE, '--workload', big, '--print-sha'], { encoding: 'utf8' }).trim()).toBe(PINNED_NANO_SHA);
  });
});

// The backend with `onRun` called before each op (it may throw: an injected device fault).
function withRunHook(b: DeviceBackend, onRun: () => void): DeviceBackend {
  return new Proxy(b, {
    get(t, p) {
      if (p === 'run') return (...a: Parameters<DeviceBackend['run']>) => (onRun(), t.run(...a));
      const v: unknown = Reflect.get(t, p);
      return typeof v === 'function' ? (v as (...x: unknown[]) => unknown).bind(t) : v;
    },
  });
}

describe('nerva-bench throughput', () => {
  it('fails, naming the cause, when an engine failure aborted requests of the timed run', async () => {
    const opts = { model: TINY, backend: 'cpu', requests: 4, minLen: 4, maxInputLen: 12, maxOutputLen: 12, seed: 7, verify: 0 } as const;
    // A clean run counts the ops; the same run again (the CPU engine schedules deterministically)
    // fails one of the last ops, inside the timed run's last step, so its live requests abort.
    let calls = 0;
    const clean = await throughputProbe({ ...opts, wrapBackend: (b) => withRunHook(b, () => void calls++) });
    expect(clean.output_tokens).toBeGreaterThan(0);
    expect(calls).toBeGreaterThan(20);
    let n = 0;
    const failAt = calls - 5;
    await expect(
      throughputProbe({
        ...opts,
        wrapBackend: (b) =>
          withRunHook(b, () => {
            if (++n === failAt) throw new Error('injected device fault');
          }),
      }),
    ).rejects.toThrow(/of 4 requests were aborted by an engine failure/);
    expect(n).toBeGreaterThanOrEqual(failAt);
  }, 120_000);

  it('runs every request at once on the tiny model; each one alone gives the same greedy tokens', async () => {
    const tokensOut = join(dir, 'tokens.json');
    const r = await throughputProbe({ model: TINY, backend: 'cpu', requests: 6, minLen: 4, maxInputLen: 16, maxOutputLen: 16, seed: 5, verify: 6, tokensOut });
    const w = makeWorkload({ seed: 5, requests: 6, minLen: 4, maxInputLen: 16, maxOutputLen: 16, tokenIdLimit: 512 });
    const s = workloadStats(w);
    expect(r).toMatchObject({
      probe: 'throughput',
      backend: 'cpu',
      workload_sha256: workloadSha256(w),
      requests: 6,
      token_id_limit: 512,
      prompt_tokens: s.promptTokens,
      max_output_tokens: s.maxOutputTokens,
      output_tokens: s.maxOutputTokens,
      prefill_tokens: s.promptTokens,
      unfinished: 0,
      hot_path_allocations: 0,
      preemptions: 0,
      verified: 6,
      verify_indices: [0, 1, 2, 3, 4, 5],
      mismatches: 0,
      mismatch_details: [],
      cached_prompt_tokens: 0,
    });
    expect(r.output_tok_s as number).toBeGreaterThan(0);
    // total_s is rounded to the millisecond: tok/s agrees with tokens / total_s to within that.
    const perS = (r.output_tokens as number) / (r.total_s as number);
    expect(Math.abs((r.output_tok_s as number) - perS) / perS).toBeLessThan(0.05);
    // Continuous batching: more than one sequence ran in a step.
    expect(r.max_running as number).toBeGreaterThan(1);
    expect(r.kv_cache_bytes as number).toBeGreaterThanOrEqual(r.kv_needed_bytes as number);
    // Where the time went: every step is a prompt step or a decode-only one, and the two sums of
    // step time fit inside the run (steps run one after another).
    const n = (k: string) => r[k] as number;
    expect(n('prompt_steps')).toBeGreaterThanOrEqual(1);
    expect(n('decode_steps')).toBeGreaterThanOrEqual(1);
    expect(n('prompt_steps') + n('decode_steps')).toBe(n('steps'));
    expect(n('prompt_step_s')).toBeGreaterThan(0);
    expect(n('decode_step_s')).toBeGreaterThan(0);
    expect(n('prompt_step_s') + n('decode_step_s')).toBeLessThanOrEqual(n('total_s') + 0.002);
    expect(n('decode_step_ms_p50')).toBeGreaterThan(0);
    expect(n('decode_rows_mean')).toBeGreaterThanOrEqual(1);
    expect(n('decode_rows_mean')).toBeLessThanOrEqual(n('max_running'));
    // The steps' device time (the CPU backend's events time its compute) lies within the run.
    expect(n('device_active_s')).toBeGreaterThan(0);
    expect(n('device_active_s')).toBeLessThanOrEqual(n('total_s') + 0.002);
    // The CPU backend enqueues nothing ahead.
    expect(r.dropped_steps).toBe(0);
    // The CPU backend runs nothing ahead: every decode step was issued after the host's schedule.
    expect(r.decode_steps_ahead).toBe(0);
    expect(n('decode_fresh_step_s')).toBeCloseTo(n('decode_step_s'), 2);
    expect(n('decode_rows_mean') * n('decode_steps')).toBeLessThanOrEqual(n('decode_tokens') + 0.01 * n('decode_steps'));
    const toks = JSON.parse(readFileSync(tokensOut, 'utf8')) as { workload_sha256: string; tokens: number[][] };
    expect(toks.workload_sha256).toBe(r.workload_sha256);
    expect(toks.tokens.map((t) => t.length)).toEqual(w.requests.map((q) => q.max_tokens));
  }, 120_000);

  it('runs split over devices (pipeline stages, micro-batched; tensor-parallel shards): the one-device tokens, the split reported', async () => {
    const opts = { model: TINY, backend: 'cpu' as const, requests: 5, minLen: 4, maxInputLen: 14, maxOutputLen: 12, seed: 9, verify: 5 };
    const one = join(dir, 'tp-one.json');
    await throughputProbe({ ...opts, tokensOut: one });
    const want = JSON.parse(readFileSync(one, 'utf8')).tokens as number[][];
    for (const [name, split] of [
      ['pipeline', { pipelineParallel: 2 }],
      ['tensor parallel', { tensorParallel: 2 }],
    ] as const) {
      const out = join(dir, `tp-${name}.json`);
      const r = await throughputProbe({ ...opts, ...split, tokensOut: out });
      expect(r, name).toMatchObject({ unfinished: 0, verified: 5, mismatches: 0 });
      // Batched over the split, every request gives the tokens it gives batched on one device.
      expect(JSON.parse(readFileSync(out, 'utf8')).tokens, name).toEqual(want);
      if (name === 'pipeline') expect((r.pipeline as { stages: unknown[] }).stages).toHaveLength(2);
      else expect((r.tensor_parallel as { shards: unknown[] }).shards).toHaveLength(2);
    }
  }, 180_000);

  it('bf16 KV cache and bf16 matmul precision: reported, and the workload still completes', async () => {
    const r = await throughputProbe({ model: TINY, backend: 'cpu', requests: 4, minLen: 4, maxInputLen: 12, maxOutputLen: 12, seed: 7, verify: 0, kvCacheDtype: 'bf16', matmulPrecision: 'bf16' });
    expect(r).toMatchObject({ kv_dtype: 'bf16', matmul_precision: 'bf16', unfinished: 0, hot_path_allocations: 0 });
    // --profile: a mean decode step with all four requests running, ms by op class.
    const prof = await throughputProbe({ model: TINY, backend: 'cpu', requests: 4, minLen: 4, maxInputLen: 12, maxOutputLen: 12, seed: 7, verify: 0, profile: true });
    const p = prof.profile as { rows: number; steps: number; device_ms: number; ms: Record<string, number> };
    expect(p.rows).toBe(4);
    expect(p.steps).toBeGreaterThanOrEqual(6);
    expect(p.ms.attention).toBeGreaterThan(0);
    expect(p.ms.lm_head).toBeGreaterThan(0);
    expect(p.device_ms).toBeGreaterThan(0);
    const plain = await throughputProbe({ model: TINY, backend: 'cpu', requests: 4, minLen: 4, maxInputLen: 12, maxOutputLen: 12, seed: 7, verify: 0 });
    expect(plain.profile).toBeUndefined();
    expect(plain).toMatchObject({ kv_dtype: 'f32', matmul_precision: 'exact' });
    expect(r.output_tokens).toBe(plain.output_tokens);
  }, 120_000);

  it('CLI: --workload-only writes the file the baseline reads; --workload reruns it; a baseline line gives the ratio', async () => {
    const wf = join(dir, 'cli-w.json');
    const common = ['--model', TINY, '--backend', 'cpu'];
    const { stdout } = await run(process.execPath, [CLI, 'throughput', ...common, '--requests', '4', '--min-len', '4', '--max-input-len', '12', '--max-output-len', '8', '--workload-out', wf, '--workload-only'], { cwd: root });
    const lines = stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const j = JSON.parse(lines[0]);
    expect(j.probe).toBe('throughput_workload');
    expect(j.workload_sha256).toBe(createHash('sha256').update(readFileSync(wf)).digest('hex'));
    expect(j.requests).toBe(4);
    // A baseline line as tools/gpu/torch_throughput.py writes it, with the tokens of a first run as its check tokens.
    const tokensOut = join(dir, 'cli-tokens.json');
    const first = JSON.parse((await run(process.execPath, [CLI, 'throughput', ...common, '--workload', wf, '--verify', '0', '--tokens-out', tokensOut], { cwd: root })).stdout);
    expect(first.workload_sha256).toBe(j.workload_sha256);
    const tokens = (JSON.parse(readFileSync(tokensOut, 'utf8')) as { tokens: number[][] }).tokens;
    const base = join(dir, 'torch.json');
    writeFileSync(
      base,
      JSON.stringify({
        probe: 'torch_throughput',
        workload_sha256: j.workload_sha256,
        output_tok_s: 10,
        mode: 'cuda-graphs+compiled+sdpa',
        batch_size: 4,
        check_tokens: [
          { index: 0, tokens: tokens[0] },
          { index: 1, tokens: [...tokens[1].slice(0, 2), (tokens[1][2] + 1) % 512, ...tokens[1].slice(3)] },
        ],
      }) + '\n',
    );
    const r = JSON.parse((await run(process.execPath, [CLI, 'throughput', ...common, '--workload', wf, '--verify', '1', '--baseline', base], { cwd: root })).stdout);
    expect(r.torch_output_tok_s).toBe(10);
    expect(r.speedup_vs_torch).toBeCloseTo(r.output_tok_s / 10, 2);
    expect(r.torch_mode).toBe('cuda-graphs+compiled+sdpa');
    expect(r.torch_tokens_compared).toBe(2);
    expect(r.torch_tokens_equal).toBe(1);
    expect(r.torch_first_divergence).toEqual([
      { index: 0, first_divergence: -1 },
      { index: 1, first_divergence: 2 },
    ]);
    expect(r.verified).toBe(1);
    expect(r.mismatches).toBe(0);
    // A baseline of another workload is refused: the ratio would compare different work.
    writeFileSync(base, JSON.stringify({ probe: 'torch_throughput', workload_sha256: '0'.repeat(64), output_tok_s: 10 }));
    const other = await run(process.execPath, [CLI, 'throughput', ...common, '--workload', wf, '--baseline', base], { cwd: root }).catch((e) => e);
    expect(other.code).not.toBe(0);
    expect(other.stderr).toContain('not this one');
  }, 120_000);

  it('CLI: bad options are one clear error each', async () => {
    const bad = async (args: string[]) => {
      const e = await run(process.execPath, [CLI, 'throughput', '--model', TINY, '--backend', 'cpu', ...args], { cwd: root }).then(
        () => ({ code: 0, stderr: '' }),
        (x) => x,
      );
      expect(e.code).not.toBe(0);
      return e.stderr as string;
    };
    expect(await bad(['--min-len', '20', '--max-input-len', '16'])).toContain('min-len (20) must not exceed max-input-len (16)');
    expect(await bad(['--min-len', '20', '--max-input-len', '30', '--max-output-len', '10'])).toContain('min-len (20) must not exceed max-output-len (10)');
    expect(await bad(['--requests', '0'])).toContain('--requests must be a positive integer');
    expect(await bad(['--seed', '-1'])).toContain('--seed must be a non-negative integer');
    expect(await bad(['--verify', 'x'])).toContain('--verify must be a non-negative integer');
    expect(await bad(['--workload-only'])).toContain('--workload-only needs --workload-out');
    const wf = join(dir, 'cli-bad-w.json');
    writeFileSync(wf, canonicalWorkloadJson(makeWorkload({ ...SMALL, requests: 2 })));
    expect(await bad(['--workload', wf, '--seed', '3'])).toContain('cannot be combined with --seed');
    // The tiny model has 512 positions: a workload past them is refused before anything runs.
    expect(await bad(['--requests', '2', '--min-len', '300', '--max-input-len', '300', '--max-output-len', '300'])).toContain('the longest request needs 601 positions; the model has 512');
  }, 120_000);
});

/** sha256 of nano-vllm's workload (seed 0, 256 requests, 100..1024, ids below 10000) under this definition. */
const PINNED_NANO_SHA = '68180a2ef64851f007659190347a341a354f4a76282a06ba05b299aae928a2a3';
