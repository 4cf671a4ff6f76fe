import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { convertToGguf, GgufFile } from '@nerva/models';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { openLlamaCpp } from '../src/llama-cpp.js';

const run = promisify(execFile);
let root = dirname(fileURLToPath(import.meta.url));
while (!existsSync(join(root, 'pnpm-workspace.yaml'))) root = dirname(root);
const CLI = join(root, 'packages/bench/dist/cli.js');
const MODELS = join(process.env.NERVA_FIXTURES ?? resolve(root, '../shared/fixtures'), 'models');
const bench = (args: string[]) => run(process.execPath, [CLI, ...args], { cwd: root });
const tmp = mkdtempSync(join(tmpdir(), 'nerva-bench-llama-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const opened = await openLlamaCpp();
if (opened.available) await opened.runtime.dispose();

async function tensorBytes(file: string): Promise<{ total: number; embed: number; routed: number }> {
  const f = await GgufFile.open(file);
  try {
    const sum = (keep: (n: string) => boolean) => f.tensors.filter((t) => keep(t.name)).reduce((a, t) => a + t.byteLength, 0);
    return { total: sum(() => true), embed: sum((n) => n === 'token_embd.weight'), routed: sum((n) => n.includes('_exps.')) };
  } finally {
    await f.close();
  }
}

describe('nerva-bench llama-cpp', () => {
  it.skipIf(!opened.available)('F32 file: both engines decode, the same tokens (as the type promises), bytes from the file', async () => {
    const file = join(tmp, 'qwen3-F32.gguf');
    await convertToGguf({ source: join(MODELS, 'tiny-random-qwen3'), out: file, type: 'F32' });
    const r = JSON.parse((await bench(['llama-cpp', '--model', file, '--tokens', '12', '--prompt-len', '5'])).stdout.trim());
    expect(r.probe).toBe('llama-cpp');
    expect(r.file_bytes).toBe(statSync(file).size);
    expect(r.tensor_types).toEqual(['F32']);
    // An untied output projection: one row of the 512-row embedding is read per token.
    const b = await tensorBytes(file);
    expect(r.decode_bytes_per_token).toBe(b.total - b.embed + b.embed / 512);
    expect(r.new_tokens).toBe(12);
    expect(r.nerva.backend).toBe('cpu');
    expect(r.nerva.tokens_per_s).toBeGreaterThan(0);
    expect(r.llama_cpp.available).toBe(true);
    expect(r.llama_cpp.version).toBe('3.21.1');
    expect(r.llama_cpp.threads).toBe(1);
    expect(r.llama_cpp.tokens_per_s).toBeGreaterThan(0);
    expect(r.tokens_equal_expected).toBe(true);
    expect(r.tokens_equal).toBe(true);
    expect(r.first_difference).toBeNull();
    expect(r.llama_cpp.tokens_sha256).toBe(r.nerva.tokens_sha256);
    expect(r.nerva_over_llama_cpp).toBeGreaterThan(0);
  });

  it.skipIf(!opened.available)('Q8_0 MoE file: routed experts count at their share, tokens not promised equal', async () => {
    const file = join(tmp, 'moe-Q8_0.gguf');
    await convertToGguf({ source: join(MODELS, 'tiny-random-qwen3-moe'), out: file, type: 'Q8_0' });
    const r = JSON.parse((await bench(['llama-cpp', '--model', file, '--tokens', '8', '--threads', '2'])).stdout.trim());
    expect(r.tensor_types).toContain('Q8_0');
    const b = await tensorBytes(file);
    expect(b.routed).toBeGreaterThan(0);
    // 2 of 8 experts a token; the embedding is untied (one row of 512).
    expect(r.decode_bytes_per_token).toBe(Math.round(b.total - b.embed + b.embed / 512 - b.routed + (b.routed * 2) / 8));
    expect(r.llama_cpp.threads).toBe(2);
    expect(r.tokens_equal_expected).toBe(false);
    expect(typeof r.tokens_equal).toBe('boolean');
  });

  it('a model that is not a GGUF file is refused with a clear error', async () => {
    const err = await bench(['llama-cpp', '--model', join(MODELS, 'tiny-random-qwen3')]).catch((e: { code: number; stderr: string }) => e);
    expect((err as { code: number }).code).toBe(1);
    expect((err as { stderr: string }).stderr).toMatch(/must be a GGUF file/);
  });

  it('without node-llama-cpp, openLlamaCpp says why instead of throwing', async () => {
    vi.resetModules();
    vi.doMock('node-llama-cpp', () => {
      throw new Error('Cannot find package node-llama-cpp');
    });
    try {
      const { openLlamaCpp: open } = await import('../src/llama-cpp.js');
      const r = await open();
      expect(r.available).toBe(false);
      expect(!r.available && r.reason).toMatch(/node-llama-cpp is not installed/);
    } finally {
      vi.doUnmock('node-llama-cpp');
      vi.resetModules();
    }
  });

  it('rejects a thread count that is not a positive integer', async () => {
    await expect(openLlamaCpp({ threads: 0 })).rejects.toThrow(RangeError);
  });
});
