import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { writeSyntheticCheckpoint } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const run = promisify(execFile);
let root = dirname(fileURLToPath(import.meta.url));
while (!existsSync(join(root, 'pnpm-workspace.yaml'))) root = dirname(root);
const CLI = join(root, 'packages/bench/dist/cli.js');

/** A small Qwen3 shape without a tokenizer: the serve probe must send token ids. */
const CONFIG = {
  architectures: ['Qwen3ForCausalLM'],
  model_type: 'qwen3',
  hidden_size: 64,
  intermediate_size: 128,
  num_hidden_layers: 2,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 32,
  vocab_size: 512,
  max_position_embeddings: 512,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  tie_word_embeddings: true,
  torch_dtype: 'bfloat16',
  eos_token_id: 0,
  bos_token_id: 0,
};

let dir: string;
beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'nerva-serve-probe-'));
  await writeSyntheticCheckpoint({ config: CONFIG, outDir: dir, seed: 1 });
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const ratio = (a: number, b: number) => Math.round((a / b) * 1000) / 1000;

describe('nerva-bench serve', () => {
  it('serves token-id prompts to a model without a tokenizer; with --vs-decode the decode line comes first and the ratio is of the two rates printed', async () => {
    const args = [CLI, 'serve', '--backend', 'cpu', '--model', dir, '--concurrency', '1', '--requests', '2', '--max-tokens', '12', '--prompt-len', '8', '--vs-decode'];
    const { stdout } = await run(process.execPath, args, { cwd: root });
    const lines = stdout.trim().split('\n').map((l) => JSON.parse(l) as Record<string, number | string | null>);
    expect(lines.map((l) => l.probe)).toEqual(['decode', 'serve']);
    const [d, s] = lines;
    expect(d.new_tokens).toBe(12);
    expect(d.prompt_len).toBe(8);
    expect(s.errors).toBe(0);
    expect(s.output_tokens).toBe(24);
    expect(s.prompt_len).toBe(8);
    expect(s.decode_tok_s).toBe(d.tokens_per_s);
    expect(s.stream_over_decode).toBe(ratio(s.stream_decode_tok_s as number, d.tokens_per_s as number));
    // Every token came from a step of the measured window: 12 steps a request, the first of which is its prompt's.
    expect(s.engine_steps).toBeGreaterThanOrEqual(24);
    expect(s.step_interval_ms_mean as number).toBeGreaterThan(0);
    expect(s.itl_ms_p99 as number).toBeGreaterThanOrEqual(s.itl_ms_p50 as number);
  }, 120_000);

  it('at several streams reports inter-token p99 over the mean step interval of the same window', async () => {
    const args = [CLI, 'serve', '--backend', 'cpu', '--model', dir, '--concurrency', '3', '--requests', '6', '--max-tokens', '10', '--prompt-len', '8'];
    const { stdout } = await run(process.execPath, args, { cwd: root });
    const lines = stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const s = JSON.parse(lines[0]) as Record<string, number | null>;
    expect(s.errors).toBe(0);
    expect(s.output_tokens).toBe(60);
    expect(s.concurrency).toBe(3);
    expect(s.stream_over_decode).toBeUndefined();
    // The ratio is of the two figures as printed.
    expect(s.itl_p99_over_step).toBe(ratio(s.itl_ms_p99 as number, s.step_interval_ms_mean as number));
  }, 120_000);

  it('--decode-prompt-budget bounds the prompt tokens of every step that carries other rows', async () => {
    // Prompts of 40 token ids, 4 streams in closed loop: successors arrive while the others decode.
    // The server's default step budget (256) lets all four first prompts in one step if they arrive
    // together: the streams would then decode and finish in lockstep, their successors arriving
    // together again, and no step would carry prompt tokens beside decode rows. A step budget of 48
    // tokens takes at most one whole prompt and a chunk of the next, so the next step has a decode
    // row and a prompt left whatever the arrival order.
    const args = [CLI, 'serve', '--backend', 'cpu', '--model', dir, '--concurrency', '4', '--requests', '12', '--max-tokens', '8', '--prompt-len', '40'];
    const paced = JSON.parse((await run(process.execPath, [...args, '--max-num-batched-tokens', '48', '--decode-prompt-budget', '16'], { cwd: root })).stdout.trim()) as Record<string, number | null>;
    expect(paced.errors).toBe(0);
    expect(paced.decode_prompt_budget).toBe(16);
    expect(paced.mixed_steps as number).toBeGreaterThan(0);
    expect(paced.mixed_step_prompt_tokens_max as number).toBeLessThanOrEqual(16);
    // Without the prompt budget (the server's default, 256), a step beside decode rows takes a
    // 40-token prompt whole; the same step budget of 48 keeps the lockstep away.
    const free = JSON.parse((await run(process.execPath, [...args, '--max-num-batched-tokens', '48'], { cwd: root })).stdout.trim()) as Record<string, number | null>;
    expect(free.decode_prompt_budget).toBe(256);
    expect(free.mixed_step_prompt_tokens_max as number).toBeGreaterThanOrEqual(40);
    await expect(run(process.execPath, [...args, '--decode-prompt-budget', '0'], { cwd: root })).rejects.toThrow(/--decode-prompt-budget must be a positive integer/);
    await expect(run(process.execPath, [...args, '--max-num-batched-tokens', '0'], { cwd: root })).rejects.toThrow(/--max-num-batched-tokens must be a positive integer/);
    await expect(run(process.execPath, [...args, '--max-num-batched-tokens', 'abc'], { cwd: root })).rejects.toThrow(/--max-num-batched-tokens must be an integer/);
  }, 120_000);
});
