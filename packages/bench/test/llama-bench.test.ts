import { execFile } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { convertToGguf } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkLlamaBench, parseLlamaBench } from '../src/llama-bench.js';

const run = promisify(execFile);
let root = dirname(fileURLToPath(import.meta.url));
while (!existsSync(join(root, 'pnpm-workspace.yaml'))) root = dirname(root);
const CLI = join(root, 'packages/bench/dist/cli.js');
const MODELS = join(process.env.NERVA_FIXTURES ?? resolve(root, '../shared/fixtures'), 'models');
const tmp = mkdtempSync(join(tmpdir(), 'nerva-llama-bench-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

// The shape of llama-bench's -o jsonl line (fields as its build de3ff81 prints them, values made up).
const tgLine = (o: Record<string, unknown> = {}) =>
  JSON.stringify({ build_commit: 'de3ff81', gpu_info: 'NVIDIA H200', cpu_info: 'Xeon', backends: 'CUDA', n_gpu_layers: 99, n_prompt: 0, n_gen: 128, n_depth: 0, avg_ts: 257.731, stddev_ts: 3.09, ...o });

describe('parseLlamaBench', () => {
  it('reads the token-generation result: rate, spread, tokens, build and device', () => {
    const ppLine = tgLine({ n_prompt: 512, n_gen: 0, avg_ts: 9000 });
    const r = parseLlamaBench(`ggml_cuda_init: found 1 CUDA devices\n${ppLine}\n${tgLine()}\n`);
    expect(r).toEqual({ tokensPerS: 257.731, stddevTokensPerS: 3.09, nGen: 128, nDepth: 0, buildCommit: 'de3ff81', device: 'NVIDIA H200', backends: 'CUDA', gpuLayers: 99 });
    // A CPU build names no GPU: its CPU stands for the device.
    expect(parseLlamaBench(tgLine({ gpu_info: '' })).device).toBe('Xeon');
  });

  it('refuses output without a result, or with a malformed one, saying why', () => {
    expect(() => parseLlamaBench('')).toThrow(/no token-generation result .* 0 JSON line\(s\)/);
    expect(() => parseLlamaBench(tgLine({ n_prompt: 512, n_gen: 0 }))).toThrow(/no token-generation result .* 1 JSON line/);
    expect(() => parseLlamaBench('{"n_prompt": 0, "n_gen": 128, "avg_ts": 1')).toThrow(/not JSON/);
    expect(() => parseLlamaBench(tgLine({ avg_ts: undefined }))).toThrow(/no valid "avg_ts"/);
    expect(() => parseLlamaBench(tgLine({ avg_ts: -3 }))).toThrow(/no valid "avg_ts"/);
    expect(() => parseLlamaBench(tgLine({ avg_ts: 0 }))).toThrow(/0 tokens\/s/);
  });
});

describe('checkLlamaBench', () => {
  it('refuses a path that is not an executable file', () => {
    expect(() => checkLlamaBench(join(tmp, 'absent'))).toThrow(/no such file/);
    mkdirSync(join(tmp, 'dir'), { recursive: true });
    expect(() => checkLlamaBench(join(tmp, 'dir'))).toThrow(/not a file/);
    const plain = join(tmp, 'plain');
    writeFileSync(plain, 'x');
    chmodSync(plain, 0o644);
    expect(() => checkLlamaBench(plain)).toThrow(/not executable/);
  });
});

describe('nerva-bench llama-cpp --llama-bench', () => {
  const file = join(tmp, 'qwen3-F32.gguf');
  beforeAll(async () => {
    await convertToGguf({ source: join(MODELS, 'tiny-random-qwen3'), out: file, type: 'F32' });
  });
  // A stand-in for the binary: records its arguments and prints what a real one would.
  const fake = (name: string, body: string) => {
    const p = join(tmp, name);
    writeFileSync(p, `#!/bin/sh\necho "$@" > "${p}.args"\n${body}\n`);
    chmodSync(p, 0o755);
    return p;
  };
  const bench = (args: string[]) => run(process.execPath, [CLI, 'llama-cpp', '--model', file, '--tokens', '12', '--prompt-len', '5', ...args], { cwd: root });

  it("runs it on the same file and reports its rate beside NERVA's", async () => {
    const p = fake('llama-bench-ok', `echo 'warming up'\necho '${tgLine({ gpu_info: '', backends: 'CPU', n_gpu_layers: 0, n_gen: 12, avg_ts: 50 })}'`);
    const r = JSON.parse((await bench(['--llama-bench', p, '--threads', '2'])).stdout.trim());
    // CPU backend: no layers offloaded, llama.cpp's threads as asked.
    expect(readFileSync(`${p}.args`, 'utf8').trim()).toBe(`-m ${file} -p 0 -n 12 -o jsonl -ngl 0 -t 2`);
    expect(r.llama_cpp).toMatchObject({ available: true, via: 'llama-bench', build_commit: 'de3ff81', device: 'Xeon', backends: 'CPU', tokens_per_s: 50, new_tokens: 12, context_at_start: 0 });
    expect(r.nerva.tokens_per_s).toBeGreaterThan(0);
    expect(r.nerva_over_llama_cpp).toBeCloseTo(r.nerva.tokens_per_s / 50, 2);
    expect(r.tokens_equal).toBeNull();
  });

  it("a failing run keeps NERVA's figures and says why", async () => {
    const p = fake('llama-bench-fails', `echo 'CUDA error: no kernel image is available' >&2\nexit 3`);
    const r = JSON.parse((await bench(['--llama-bench', p])).stdout.trim());
    expect(r.llama_cpp).toEqual({ available: false, via: 'llama-bench', reason: 'llama-bench exited with 3: CUDA error: no kernel image is available' });
    expect(r.nerva.tokens_per_s).toBeGreaterThan(0);
    const q = fake('llama-bench-garbled', `echo '{"n_prompt": 0, "n_gen": 12'`);
    const g = JSON.parse((await bench(['--llama-bench', q])).stdout.trim());
    expect(g.llama_cpp.reason).toMatch(/not JSON/);
  });

  it('a path that is not an executable file is an error before anything loads', async () => {
    await expect(bench(['--llama-bench', join(tmp, 'nowhere')])).rejects.toThrow(/--llama-bench: no such file/);
  });
});
