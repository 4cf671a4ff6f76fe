import { access, chmod, mkdir, readdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  convertToGguf,
  GgufCheckpoint,
  GgufError,
  GgufFile,
  ggufModelSpec,
  ggufTokenizerParts,
  ggufValue,
  inferLlama3Scaling,
  llama3RopeFactors,
  loadModelDir,
  NERVA_KEYS,
  ropeInvFreq,
  writeGguf,
  type GgufErrorCode,
  type GgufValue,
  type GgufWriteTensor,
  type ModelSpec,
} from '../src/index.js';
import { MODELS, tempDir } from './helpers.js';

let dir: string;
let llamaGguf: string;
let shakespeareGguf: string;

beforeAll(async () => {
  dir = await tempDir();
  llamaGguf = join(dir, 'llama.gguf');
  shakespeareGguf = join(dir, 'shakespeare.gguf');
  await convertToGguf({ source: join(MODELS, 'tiny-random-llama'), out: llamaGguf, type: 'F32' });
  await convertToGguf({ source: join(MODELS, 'tiny-shakespeare-qwen3'), out: shakespeareGguf, type: 'BF16' });
});

/** Copy `src` to a new file with its metadata (and optionally tensors) changed. */
async function rewrite(
  src: string,
  edit: (md: Map<string, GgufValue>) => void,
  editTensors: (ts: GgufWriteTensor[]) => GgufWriteTensor[] = (t) => t,
): Promise<string> {
  const f = await GgufFile.open(src);
  const md = new Map(f.metadata);
  edit(md);
  const out = join(dir, `edited-${Math.random().toString(36).slice(2)}.gguf`);
  const tensors: GgufWriteTensor[] = f.tensors.map((t) => ({ name: t.name, type: t.type, dims: t.dims, data: () => f.readTensor(t.name) }));
  try {
    await writeGguf(out, { metadata: md, tensors: editTensors(tensors) });
  } finally {
    await f.close();
  }
  return out;
}

async function loadErr(path: string): Promise<GgufError> {
  const e = await loadModelDir(path).then(
    async (m) => {
      await m.checkpoint.close();
      return undefined;
    },
    (x: unknown) => x,
  );
  expect(e).toBeInstanceOf(GgufError);
  return e as GgufError;
}

describe('GGUF model files refused clearly', () => {
  const cases: [string, (md: Map<string, GgufValue>) => void, GgufErrorCode, string][] = [
    ['an architecture NERVA does not run', (md) => md.set('general.architecture', ggufValue.str('gemma3')), 'UNSUPPORTED_ARCH', 'gemma3'],
    ['no architecture', (md) => md.delete('general.architecture'), 'BAD_METADATA', 'general.architecture'],
    ['no block_count', (md) => md.delete('llama.block_count'), 'BAD_METADATA', 'llama.block_count'],
    ['block_count as a string', (md) => md.set('llama.block_count', ggufValue.str('3')), 'BAD_METADATA', 'an integer'],
    ['zero heads', (md) => md.set('llama.attention.head_count', ggufValue.u32(0)), 'BAD_METADATA', 'head_count'],
    ['an absurd embedding length', (md) => md.set('llama.embedding_length', ggufValue.u32(1 << 30)), 'BAD_METADATA', 'embedding_length'],
    ['an embedding disagreeing with the metadata', (md) => md.set('llama.embedding_length', ggufValue.u32(32)), 'SHAPE_MISMATCH', 'token_embd.weight'],
    ['per-layer head counts that differ', (md) => md.set('llama.attention.head_count_kv', ggufValue.array('UINT32', [2, 1, 2])), 'UNSUPPORTED_MODEL', 'per-layer'],
    ['partial rotary', (md) => md.set('llama.rope.dimension_count', ggufValue.u32(8)), 'UNSUPPORTED_MODEL', 'partial rotary'],
    ['YaRN scaling', (md) => md.set('llama.rope.scaling.type', ggufValue.str('yarn')), 'UNSUPPORTED_MODEL', 'yarn'],
    ['a WordPiece tokenizer', (md) => md.set('tokenizer.ggml.model', ggufValue.str('bert')), 'UNSUPPORTED_TOKENIZER', '"bert" is not supported'],
    ['a SentencePiece tokenizer without scores', (md) => md.set('tokenizer.ggml.model', ggufValue.str('llama')), 'BAD_METADATA', '0 scores for'],
    ['a SentencePiece tokenizer with scores of the wrong length', (md) => {
      md.set('tokenizer.ggml.model', ggufValue.str('llama'));
      md.set('tokenizer.ggml.scores', ggufValue.array('FLOAT32', [0, -1]));
    }, 'BAD_METADATA', '2 scores for'],
    ['a SentencePiece tokenizer with scores that are not floats', (md) => {
      md.set('tokenizer.ggml.model', ggufValue.str('llama'));
      md.set('tokenizer.ggml.scores', ggufValue.array('STRING', ['a']));
    }, 'BAD_METADATA', 'an array of floats'],
    ['an unknown pre-tokenizer', (md) => md.set('tokenizer.ggml.pre', ggufValue.str('falcon')), 'UNSUPPORTED_TOKENIZER', 'falcon'],
    ['token types of the wrong length', (md) => md.set('tokenizer.ggml.token_type', ggufValue.array('INT32', [1, 1])), 'BAD_METADATA', 'token types'],
    ['a tokenizer merge that is not two tokens', (md) => md.set('tokenizer.ggml.merges', ggufValue.array('STRING', ['ab'])), 'BAD_METADATA', 'is not two tokens separated by a space'],
    ['a BOS id outside the vocabulary', (md) => md.set('tokenizer.ggml.bos_token_id', ggufValue.u32(999_999)), 'BAD_METADATA', 'outside'],
    ['a duplicated token', (md) => {
      const t = md.get('tokenizer.ggml.tokens')!.value as { itemType: 'STRING'; items: string[] };
      md.set('tokenizer.ggml.tokens', ggufValue.array('STRING', [t.items[1], ...t.items.slice(1)]));
    }, 'BAD_METADATA', 'appears at ids'],
    ['a generation config that is not JSON', (md) => md.set(NERVA_KEYS.generationConfig, ggufValue.str('{nope')), 'BAD_METADATA', 'JSON'],
    ['an unknown torch dtype', (md) => md.set(NERVA_KEYS.torchDtype, ggufValue.str('int8')), 'BAD_METADATA', 'int8'],
  ];
  it.each(cases)('%s', async (_n, edit, code, word) => {
    const src = /tokenizer|token|BOS|generation/.test(_n) ? shakespeareGguf : llamaGguf;
    const e = await loadErr(await rewrite(src, edit));
    expect(e.code).toBe(code);
    expect(e.message).toContain(word);
  });

  it('a missing tensor names the HF tensor the spec needs', async () => {
    const p = await rewrite(llamaGguf, () => undefined, (ts) => ts.filter((t) => t.name !== 'blk.2.ffn_up.weight'));
    await expect(loadModelDir(p)).rejects.toMatchObject({ code: 'MISSING_TENSOR', message: expect.stringContaining('model.layers.2.mlp.up_proj.weight') });
  });

  it('a stored type that cannot be dequantized is refused at open, naming the tensor and type', async () => {
    // Q8_1 is an activation format ggml never stores as weights: no dequantization for it.
    const p = await rewrite(llamaGguf, () => undefined, (ts) => [
      ...ts,
      { name: 'extra.weight', type: 'Q8_1', dims: [32], data: async () => new Uint8Array(36) },
    ]);
    await expect(GgufCheckpoint.open(p)).rejects.toMatchObject({ code: 'UNSUPPORTED_TYPE', tensor: 'extra.weight', message: expect.stringContaining('Q8_1') });
  });

  it('a stacked expert tensor that is not 3-D', async () => {
    const p = await rewrite(llamaGguf, () => undefined, (ts) => [...ts, { name: 'blk.0.ffn_up_exps.weight', type: 'F32', dims: [64, 4], data: async () => new Uint8Array(1024) }]);
    await expect(GgufCheckpoint.open(p)).rejects.toMatchObject({ code: 'SHAPE_MISMATCH', tensor: 'blk.0.ffn_up_exps.weight' });
  });

  it('NOT_FOUND for a .gguf path that does not exist', async () => {
    await expect(loadModelDir(join(dir, 'absent.gguf'))).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });
});

describe('metadata from llama.cpp files (no nerva.* keys)', () => {
  it('llama3 RoPE scaling is recovered from rope_freqs alone, frequencies equal', async () => {
    const p = await rewrite(llamaGguf, (md) => {
      for (const k of [...md.keys()]) if (k.startsWith('nerva.rope')) md.delete(k);
      md.set('llama.rope.scaling.original_context_length', ggufValue.u32(64));
    });
    const hf = await loadModelDir(join(MODELS, 'tiny-random-llama'));
    const gg = await loadModelDir(p);
    try {
      expect(gg.spec.ropeScaling.type).toBe('llama3');
      const a = ropeInvFreq(hf.spec);
      const b = ropeInvFreq(gg.spec);
      for (let i = 0; i < a.length; i++) expect(Math.abs(b[i] - a[i])).toBeLessThanOrEqual(1e-6 * a[i]);
    } finally {
      await hf.checkpoint.close();
      await gg.checkpoint.close();
    }
  });

  it('Llama 3.1 8B factors (theta 500000, head 128, factor 8): recovered for any assumed original context', () => {
    const s = { type: 'llama3', factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 } as const;
    const f = llama3RopeFactors(s, 500000, 128);
    const spec = (scaling: ModelSpec['ropeScaling']) => ({ headDim: 128, ropeTheta: 500000, ropeScaling: scaling });
    for (const original of [8192, 4096]) {
      const got = inferLlama3Scaling(f, 500000, 128, original, 'x.gguf');
      const a = ropeInvFreq(spec(s));
      const b = ropeInvFreq(spec(got));
      for (let i = 0; i < a.length; i++) expect(Math.abs(b[i] - a[i])).toBeLessThanOrEqual(1e-6 * a[i]);
    }
    expect(() => inferLlama3Scaling(new Float32Array(64).fill(0.5), 500000, 128, 8192, 'x.gguf')).toThrow(/rope_freqs/);
    const bent = f.slice();
    bent[40] *= 1.3;
    expect(() => inferLlama3Scaling(bent, 500000, 128, 8192, 'x.gguf')).toThrow(GgufError);
  });

  it('float metadata comes back as the config wrote it, not its float32 rounding', async () => {
    const f = await GgufFile.open(llamaGguf);
    try {
      expect(f.get('llama.attention.layer_norm_rms_epsilon')).toEqual({ type: 'FLOAT32', value: Math.fround(1e-5) });
      expect(ggufModelSpec({ path: f.path, metadata: f.metadata, tensors: f.tensors }).rmsNormEps).toBe(1e-5);
    } finally {
      await f.close();
    }
  });

  it('a vocabulary-less file has no tokenizer but keeps BOS/EOS ids', async () => {
    const f = await GgufFile.open(llamaGguf);
    try {
      expect(f.get('tokenizer.ggml.model')).toEqual({ type: 'STRING', value: 'none' });
      expect(ggufTokenizerParts(f.metadata, f.path)).toBeUndefined();
      const m = await loadModelDir(llamaGguf);
      expect(m.tokenizer).toBeUndefined();
      expect(m.spec.bosTokenId).toBe(1);
      expect(m.stopTokenIds).toEqual([2]);
      await m.checkpoint.close();
    } finally {
      await f.close();
    }
  });
});

describe('writeGguf', () => {
  const t = (name: string, bytes = 16): GgufWriteTensor => ({ name, type: 'F32', dims: [bytes / 4], data: async () => new Uint8Array(bytes) });

  it('refuses invalid input before creating anything', async () => {
    const d = await tempDir();
    const p = join(d, 'x.gguf');
    const bad: [Parameters<typeof writeGguf>[1], GgufErrorCode][] = [
      [{ metadata: [['k', ggufValue.u32(1)], ['k', ggufValue.u32(2)]], tensors: [] }, 'DUPLICATE_KEY'],
      [{ metadata: [], tensors: [t('a'), t('a')] }, 'DUPLICATE_TENSOR'],
      [{ metadata: [], tensors: [t('x'.repeat(64))] }, 'BAD_TENSOR_NAME'],
      [{ metadata: [], tensors: [{ name: 'q', type: 'Q8_0', dims: [33], data: async () => new Uint8Array(0) }] }, 'NOT_BLOCK_MULTIPLE'],
      [{ metadata: [], tensors: [], alignment: 24 }, 'BAD_ALIGNMENT'],
      [{ metadata: [['k', ggufValue.u32(-1)]], tensors: [] }, 'BAD_INPUT'],
      [{ metadata: [['k', ggufValue.u8(256)]], tensors: [] }, 'BAD_INPUT'],
    ];
    for (const [o, code] of bad) await expect(writeGguf(p, o)).rejects.toMatchObject({ code });
    expect(await readdir(d)).toEqual([]);
  });

  it('a producer giving the wrong byte count fails the write and leaves no file behind', async () => {
    const d = await tempDir();
    const p = join(d, 'x.gguf');
    await expect(writeGguf(p, { metadata: [], tensors: [t('a'), { ...t('b'), data: async () => new Uint8Array(12) }] })).rejects.toMatchObject({ code: 'BAD_INPUT', tensor: 'b' });
    await expect(writeGguf(p, { metadata: [], tensors: [{ ...t('b'), data: async () => new Uint8Array(20) }] })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(
      writeGguf(p, {
        metadata: [],
        tensors: [{ ...t('c'), data: () => (async function* () { yield new Uint8Array(8); throw new Error('source vanished'); })() }],
      }),
    ).rejects.toMatchObject({ code: 'WRITE', message: expect.stringContaining('source vanished') });
    expect(await readdir(d)).toEqual([]);
  });

  it('an existing file is kept unless overwrite; an unwritable folder is a WRITE error', async () => {
    const d = await tempDir();
    const p = join(d, 'x.gguf');
    await writeFile(p, 'keep me');
    await expect(writeGguf(p, { metadata: [], tensors: [] })).rejects.toMatchObject({ code: 'EXISTS' });
    const r = await writeGguf(p, { metadata: [['general.name', ggufValue.str('x')]], tensors: [t('a', 8), t('b', 40)], overwrite: true, alignment: 64 });
    const f = await GgufFile.open(p);
    try {
      expect(f.header.alignment).toBe(64);
      expect(f.tensor('b').byteOffset % 64).toBe(0);
      expect(r.bytes).toBe(f.fileSize);
    } finally {
      await f.close();
    }
    const ro = join(d, 'ro');
    await mkdir(ro);
    await chmod(ro, 0o500);
    const canWrite = await access(ro, 2).then(() => true, () => false); // root ignores the mode
    if (!canWrite) await expect(writeGguf(join(ro, 'y.gguf'), { metadata: [], tensors: [] })).rejects.toMatchObject({ code: 'WRITE' });
    await expect(writeGguf(join(d, 'no', 'such', 'dir.gguf'), { metadata: [], tensors: [] })).rejects.toMatchObject({ code: 'WRITE' });
    await chmod(ro, 0o700);
  });
});
