import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { GgufError, ggufModelSpec, ggufTokenizerParts, ggufValue, parseGgufHeader, writeGguf, type GgufWriteTensor } from '../src/index.js';
import { prng } from './gguf-bytes.js';
import { tempDir } from './helpers.js';

const RUNS = 10_000;
const LARGE = [0, 1, 0x7f, 0xff, 0x100, 0xffff, 0x10000, 0x7fffffff, 0xffffffff, 2 ** 32, 2 ** 40, 2 ** 53, 2n ** 63n, 2n ** 64n - 1n];

let base: Buffer;
let headerEnd: number;

/** A complete tiny model (llama, one layer, a byte-level vocabulary): every parser path has something to chew on. */
beforeAll(async () => {
  const h = 8;
  const v = 8;
  const f32 = (n: number): (() => Promise<Uint8Array>) => async () => new Uint8Array(new Float32Array(n).fill(0.5).buffer);
  const t = (name: string, dims: number[]): GgufWriteTensor => ({ name, type: 'F32', dims, data: f32(dims.reduce((a, b) => a * b, 1)) });
  const g = ggufValue;
  const path = join(await tempDir(), 'tiny.gguf');
  await writeGguf(path, {
    metadata: [
      ['general.architecture', g.str('llama')],
      ['general.name', g.str('tiny')],
      ['llama.block_count', g.u32(1)],
      ['llama.context_length', g.u32(64)],
      ['llama.embedding_length', g.u32(h)],
      ['llama.feed_forward_length', g.u32(16)],
      ['llama.attention.head_count', g.u32(2)],
      ['llama.attention.head_count_kv', g.u32(1)],
      ['llama.attention.layer_norm_rms_epsilon', g.f32(1e-5)],
      ['llama.rope.freq_base', g.f32(10000)],
      ['tokenizer.ggml.model', g.str('gpt2')],
      ['tokenizer.ggml.pre', g.str('llama-bpe')],
      ['tokenizer.ggml.tokens', g.array('STRING', ['<s>', 'a', 'b', 'ab', 'Ġ', 'Ġa', 'c', '[PAD7]'])],
      ['tokenizer.ggml.token_type', g.array('INT32', [3, 1, 1, 1, 1, 1, 1, 5])],
      ['tokenizer.ggml.merges', g.array('STRING', ['a b', 'Ġ a'])],
      ['tokenizer.ggml.bos_token_id', g.u32(0)],
      ['tokenizer.ggml.add_bos_token', g.bool(true)],
      ['tokenizer.chat_template', g.str('{% for m in messages %}{{ m.content }}{% endfor %}')],
      ['nerva.eos_token_ids', g.array('INT32', [1, 2])],
      ['some.f64', g.f64(0.25)],
      ['some.i64', g.i64(-5n)],
    ],
    tensors: [
      t('token_embd.weight', [h, v]),
      t('blk.0.attn_norm.weight', [h]),
      t('blk.0.attn_q.weight', [h, h]),
      t('blk.0.attn_k.weight', [h, 4]),
      t('blk.0.attn_v.weight', [h, 4]),
      t('blk.0.attn_output.weight', [h, h]),
      t('blk.0.ffn_norm.weight', [h]),
      t('blk.0.ffn_gate.weight', [h, 16]),
      t('blk.0.ffn_up.weight', [h, 16]),
      t('blk.0.ffn_down.weight', [16, h]),
      t('output_norm.weight', [h]),
    ],
  });
  base = await readFile(path);
  headerEnd = parseGgufHeader(base).headerBytes;
});

function mutate(src: Buffer, rand: () => number): Buffer {
  let b = Buffer.from(src);
  const pos = (limit = b.byteLength): number => Math.floor(rand() * Math.max(1, limit));
  // Most mutations land in the header, where the parser works.
  const where = (): number => (rand() < 0.85 ? pos(Math.min(headerEnd, b.byteLength)) : pos());
  const ops = 1 + Math.floor(rand() * 3);
  for (let k = 0; k < ops; k++) {
    const op = rand();
    if (op < 0.35) {
      for (let i = 0, n = 1 + Math.floor(rand() * 4); i < n && b.byteLength > 0; i++) b[where()] ^= 1 << Math.floor(rand() * 8);
    } else if (op < 0.65) {
      const v = LARGE[Math.floor(rand() * LARGE.length)];
      const at = where();
      if (rand() < 0.5 && at + 8 <= b.byteLength) b.writeBigUInt64LE(BigInt(v), at);
      else if (at + 4 <= b.byteLength && typeof v === 'number' && v <= 0xffffffff) b.writeUInt32LE(v, at);
    } else if (op < 0.8) {
      b = b.subarray(0, pos());
    } else if (op < 0.9) {
      const at = where();
      const ins = Buffer.from(Array.from({ length: 1 + Math.floor(rand() * 16) }, () => Math.floor(rand() * 256)));
      b = Buffer.concat([b.subarray(0, at), ins, b.subarray(at)]);
    } else {
      const at = where();
      b = Buffer.concat([b.subarray(0, at), b.subarray(at + 1 + Math.floor(rand() * 16))]);
    }
  }
  return b;
}

describe('fuzzed GGUF headers', () => {
  it(`${RUNS} seeded mutations of a valid model file: each parses or throws GgufError, never anything else, in bounded memory`, () => {
    const rand = prng(0x9e3779b9);
    const rss0 = process.memoryUsage().rss;
    let parsed = 0;
    let accepted = 0;
    let refused = 0;
    const codes = new Set<string>();
    for (let i = 0; i < RUNS; i++) {
      const bytes = mutate(base, rand);
      try {
        const h = parseGgufHeader(bytes, bytes.byteLength, `fuzz-${i}.gguf`);
        parsed++;
        // What a loader does next with a header that parsed: only GgufError may come out.
        ggufModelSpec({ path: 'fuzz.gguf', metadata: h.metadata, tensors: h.tensors });
        ggufTokenizerParts(h.metadata, 'fuzz.gguf');
        accepted++;
      } catch (e) {
        if (!(e instanceof GgufError)) throw new Error(`mutation ${i} threw ${String(e)} (${(e as Error)?.stack ?? ''})`);
        refused++;
        codes.add(e.code);
      }
    }
    expect(accepted + refused).toBe(RUNS);
    // The mutations reach both outcomes and many distinct checks.
    expect(parsed).toBeGreaterThan(100);
    expect(accepted).toBeGreaterThan(100);
    expect(refused).toBeGreaterThan(RUNS / 4);
    expect(codes.size).toBeGreaterThanOrEqual(10);
    // Caps bound every allocation by the mutated file's few KiB: no claimed size was believed.
    expect(process.memoryUsage().rss - rss0).toBeLessThan(256 * 1024 * 1024);
  });
});
