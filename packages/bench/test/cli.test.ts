import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Engine } from '@nerva/engine';
import { loadModelConfig } from '@nerva/models';
import { defaultModelDir } from '@nerva/server';
import { describe, expect, it } from 'vitest';
import { syntheticPrompt } from '../src/measure.js';
import { offloadKvCacheBytes } from '../src/probes/offload.js';

const run = promisify(execFile);
let root = dirname(fileURLToPath(import.meta.url));
while (!existsSync(join(root, 'pnpm-workspace.yaml'))) root = dirname(root);
const CLI = join(root, 'packages/bench/dist/cli.js');

describe('nerva-bench', () => {
  it('generate prints one JSON line with throughput, latency percentiles and hot-path allocations', async () => {
    const { stdout } = await run(process.execPath, [CLI, 'generate', '--backend', 'cpu', '--new-tokens', '12', '--prompt-len', '8'], { cwd: root });
    const lines = stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const j = JSON.parse(lines[0]);
    expect(j.probe).toBe('generate');
    expect(j.new_tokens).toBe(12);
    expect(j.tokens_per_s).toBeGreaterThan(0);
    expect(j.ms_per_token_p99).toBeGreaterThanOrEqual(j.ms_per_token_p50);
    expect(j.hot_path_allocations).toBe(0);
  }, 120_000);

  it('decode reports the roofline from the copy bandwidth it measured', async () => {
    const { stdout } = await run(process.execPath, [CLI, 'decode', '--backend', 'cpu', '--new-tokens', '8', '--prompt-len', '16'], { cwd: root });
    const j = JSON.parse(stdout.trim());
    expect(j.probe).toBe('decode');
    expect(j.copy_bandwidth_gbs).toBeGreaterThan(0);
    expect(j.roofline_tok_s).toBeCloseTo((j.copy_bandwidth_gbs * 1e9) / j.weight_bytes, 0);
    expect(j.fraction_of_roofline).toBeGreaterThan(0);
    expect(j.graph_replays_per_token).toBe(1);
    // The token digest names the ids decoded: a run of 8 and one of its first 4 tokens differ.
    expect(j.tokens_sha256).toMatch(/^[0-9a-f]{16}$/);
    const four = JSON.parse((await run(process.execPath, [CLI, 'decode', '--backend', 'cpu', '--new-tokens', '4', '--prompt-len', '16'], { cwd: root })).stdout.trim());
    expect(four.new_tokens).toBe(4);
    expect(four.tokens_sha256).toMatch(/^[0-9a-f]{16}$/);
    expect(four.tokens_sha256).not.toBe(j.tokens_sha256);
  }, 180_000);

  it('decode takes --tensor-parallel: the shard count is reported and the tokens are one backend\'s', async () => {
    const args = [CLI, 'decode', '--backend', 'cpu', '--new-tokens', '8', '--prompt-len', '16'];
    const one = JSON.parse((await run(process.execPath, args, { cwd: root })).stdout.trim());
    const j = JSON.parse((await run(process.execPath, [...args, '--tensor-parallel', '2'], { cwd: root })).stdout.trim());
    expect(one.tensor_parallel).toBe(1);
    expect(j.tensor_parallel).toBe(2);
    expect(j.tokens_sha256).toBe(one.tokens_sha256);
    expect(j.notes.some((n: string) => n.startsWith('tensor parallel: 2 shards'))).toBe(true);
    const bad = await run(process.execPath, [CLI, 'decode', '--backend', 'cpu', '--tensor-parallel', '3'], { cwd: root }).catch((e) => e);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain("tensorParallel 3 does not divide the model's 2 KV head(s)");
  }, 180_000);

  it('decode takes --pipeline-parallel: the stages, their layers and links are reported', async () => {
    const { stdout } = await run(process.execPath, [CLI, 'decode', '--backend', 'cpu', '--new-tokens', '8', '--prompt-len', '16', '--pipeline-parallel', '2'], { cwd: root });
    const j = JSON.parse(stdout.trim());
    expect(j.pipeline_parallel).toBe(2);
    expect(j.pipeline.stages.map((s: { firstLayer: number; endLayer: number }) => [s.firstLayer, s.endLayer])).toEqual([
      [0, 4],
      [4, 6],
    ]);
    expect(j.pipeline.links).toEqual(['in-process']);
    // Stages on one backend are captured as one decode graph.
    expect(j.graph_replays_per_token).toBe(1);
    expect(j.hot_path_allocations).toBe(0);
    expect(j.notes.some((n: string) => n.startsWith('pipeline: 2 stages'))).toBe(true);
    const bad = await run(process.execPath, [CLI, 'decode', '--backend', 'cpu', '--pipeline-parallel', '0'], { cwd: root }).catch((e) => e);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain('--pipeline-parallel must be a positive integer');
  }, 120_000);

  it('decode takes a --vram-budget: the copy rate is timed outside the budget, the placement is reported', async () => {
    // 40 MiB is 1.5x the embedded model's weights; a quarter goes to the KV cache, some to activations.
    const { stdout } = await run(process.execPath, [CLI, 'decode', '--backend', 'cpu', '--new-tokens', '8', '--prompt-len', '16', '--vram-budget', '40MiB'], { cwd: root });
    const j = JSON.parse(stdout.trim());
    expect(j.vram_budget_bytes).toBe(40 * 2 ** 20);
    expect(j.memory_mode).toBe('paged');
    expect(j.hot_bytes).toBeLessThan(j.weight_bytes);
    expect(j.streamed_bytes_per_pass).toBe(j.weight_bytes - j.hot_bytes);
    expect(j.slots).toBeGreaterThan(0);
    expect(j.copy_bandwidth_gbs).toBeGreaterThan(0);
    expect(j.hot_path_allocations).toBe(0);
  }, 120_000);

  it('offload streams the weights a budget below their size cannot hold, with the resident greedy tokens', async () => {
    const model = defaultModelDir();
    const [promptLen, newTokens] = [16, 12];
    // The resident engine sized as the probe sizes its own: its report gives KV and activation bytes.
    const spec = await loadModelConfig(model);
    const maxModelLen = promptLen + newTokens + 16;
    const e = await Engine.create({ model, backend: 'cpu', maxNumSeqs: 1, maxNumBatchedTokens: promptLen, maxModelLen, kvCacheBytes: offloadKvCacheBytes(spec, maxModelLen) });
    let budget: number;
    let want: number[];
    try {
      const rep = e.memoryReport();
      expect(rep.mode).toBe('resident');
      const tier = rep.tiers.find((t) => t.tier === e.backend.capabilities.computeTier)!;
      budget = tier.kvBytes + tier.otherBytes + Math.floor(0.75 * rep.weights.totalBytes);
      want = (await e.submit(syntheticPrompt(promptLen, spec.vocabSize), { maxTokens: newTokens, temperature: 0, ignoreEos: true }).done).tokenIds;
    } finally {
      e.dispose();
    }
    const args = ['offload', '--backend', 'cpu', '--model', model, '--vram-budget', String(budget), '--prompt-len', String(promptLen), '--new-tokens', String(newTokens)];
    const { stdout } = await run(process.execPath, [CLI, ...args], { cwd: root });
    const lines = stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const j = JSON.parse(lines[0]);
    expect(j.probe).toBe('offload');
    expect(j.backend).toBe('cpu');
    expect(j.vram_budget_bytes).toBe(budget);
    expect(j.mode).toBe('paged');
    expect(j.new_tokens).toBe(newTokens);
    // Exact: the same tokens as the resident engine.
    expect(j.token_ids).toEqual(want);
    expect(j.tok_s).toBeGreaterThan(0);
    expect(j.ms_per_token_p50).toBeGreaterThan(0);
    expect(j.hot_bytes).toBeLessThan(j.weight_bytes);
    expect(j.hot_bytes + j.streamed_bytes).toBe(j.weight_bytes);
    expect(j.streamed_blocks).toBeGreaterThan(0);
    expect(j.slots).toBeGreaterThan(0);
    expect(j.streamed_bytes_per_pass).toBe(j.streamed_bytes);
    // Every pass streams the streamed blocks by some path; the counters are per generated token.
    expect(j.h2d_bytes_per_token + j.disk_read_bytes_per_token + j.cpu_compute_bytes_per_token).toBeGreaterThan(0);
    expect(j.prefetch_hits + j.prefetch_stalls).toBeGreaterThan(0);
    expect(j.stall_ms_per_token).toBeGreaterThanOrEqual(0);
    expect(j.hot_path_allocations).toBe(0);
    // No host-to-device link on the CPU backend: no limit, and a note saying why.
    expect(j.h2d_gbs).toBeNull();
    expect(j.limit_tok_s).toBeNull();
    expect(j.fraction_of_limit).toBeNull();
    expect(j.notes.some((n: string) => n.startsWith('CPU backend'))).toBe(true);
    expect(j).not.toHaveProperty('accelerate_tok_s');
    // The CPU backend plans no compute near data by itself ('auto': no link to save)...
    expect(j.host_compute).toBe('auto');
    expect(j.host_mlp_gbs).toBeNull();
    // ...a forced fraction computes half of each streamed layer's MLP channels through op mlp_slice: same tokens.
    const forced = JSON.parse((await run(process.execPath, [CLI, ...args, '--host-compute', '0.5'], { cwd: root })).stdout.trim());
    expect(forced.host_compute).toBe(0.5);
    expect(forced.token_ids).toEqual(want);
    expect(forced.cpu_compute_bytes_per_token).toBeGreaterThan(0);
    expect(forced.notes.some((n: string) => n.includes('compute near data'))).toBe(true);
  }, 120_000);

  it('offload reads the accelerate baseline line and reports the ratio', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'nerva-bench-'));
    const model = defaultModelDir();
    const prompt = syntheticPrompt(8, (await loadModelConfig(model)).vocabSize);
    const acc = join(dir, 'accelerate.json');
    writeFileSync(acc, JSON.stringify({ tok_s: 0.5, budget_bytes: 2 ** 30, model, prompt_ids: prompt, token_ids: [-1] }) + '\n');
    // A budget above the weights: resident, nothing crosses a link.
    const { stdout } = await run(process.execPath, [CLI, 'offload', '--backend', 'cpu', '--vram-budget', '1GiB', '--prompt-len', '8', '--new-tokens', '4', '--accelerate-json', acc], {
      cwd: root,
    });
    const j = JSON.parse(stdout.trim());
    expect(j.mode).toBe('resident');
    expect(j.vram_budget_bytes).toBe(2 ** 30);
    expect(j.streamed_bytes).toBe(0);
    expect(j.accelerate_tok_s).toBe(0.5);
    expect(j.speedup_vs_accelerate).toBeCloseTo(j.tok_s / 0.5, 1);
    expect(j.accelerate_same_prompt).toBe(true);
    expect(j.accelerate_agreeing_tokens).toBe(0);
    rmSync(dir, { recursive: true, force: true });
  }, 120_000);

  it('rejects a bad flag with a clear message', async () => {
    const err = await run(process.execPath, [CLI, 'decode', '--new-tokens', '-3'], { cwd: root }).catch((e) => e);
    expect(err.code).not.toBe(0);
    expect(err.stderr).toContain('--new-tokens must be a positive integer');
    const budget = await run(process.execPath, [CLI, 'offload', '--vram-budget', '4 gigs'], { cwd: root }).catch((e) => e);
    expect(budget.code).not.toBe(0);
    expect(budget.stderr).toContain('--vram-budget must be a size such as 4GiB');
    const missing = await run(process.execPath, [CLI, 'offload', '--backend', 'cpu'], { cwd: root }).catch((e) => e);
    expect(missing.code).not.toBe(0);
    expect(missing.stderr).toContain("required option '--vram-budget <size>' not specified");
    for (const v of ['1.5', '0', 'half']) {
      const hc = await run(process.execPath, [CLI, 'offload', '--backend', 'cpu', '--vram-budget', '1GiB', '--host-compute', v], { cwd: root }).catch((e) => e);
      expect(hc.code, v).not.toBe(0);
      expect(hc.stderr, v).toContain(`--host-compute must be auto, off or a fraction in (0, 1), got '${v}'`);
    }
    const zero = await run(process.execPath, [CLI, 'decode', '--vram-budget', '0GiB'], { cwd: root }).catch((e) => e);
    expect(zero.code).not.toBe(0);
    expect(zero.stderr).toContain('--vram-budget must be greater than zero');
  });
});
