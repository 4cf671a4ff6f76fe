import { readdirSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { dequantize, quantize, type GgmlTypeName } from '@nerva/core';
import {
  convertToGguf,
  GgufCheckpoint,
  GgufFile,
  ggufTokenizer,
  ggufTokenizerMetadata,
  ggufTokenizerParts,
  loadModelDir,
  NervaTokenizer,
  readTokenizerJson,
  type GgufValue,
} from '../src/index.js';
import { FIXTURES, MODELS, QWEN3_TOKENIZER, tempDir } from './helpers.js';

const FIXTURE_MODELS = readdirSync(MODELS).filter((d) => !d.startsWith('.'));
const FLOAT_TYPES = ['F32', 'F16', 'BF16'] as const;

/** Index of the first element whose bits differ (-1: identical); vitest's deep equality is too slow for megabyte arrays. */
function firstDiff(a: ArrayBufferView, b: ArrayBufferView): number {
  const x = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const y = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  if (x.length !== y.length) return Math.min(x.length, y.length);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return i;
  return -1;
}

describe('fixture list', () => {
  it('covers every fixture model, the MoE and the trained one included', () => {
    expect(FIXTURE_MODELS).toEqual(expect.arrayContaining(['tiny-random-llama', 'tiny-random-llama-sharded', 'tiny-random-qwen2', 'tiny-random-qwen3', 'tiny-random-qwen3-moe', 'tiny-shakespeare-qwen3']));
  });
});

describe.each(FIXTURE_MODELS)('safetensors → GGUF → load: %s', (name) => {
  it.each(FLOAT_TYPES)('%s: same spec, same tensors bit for bit, same stop ids and generation config', async (type) => {
    const src = join(MODELS, name);
    const out = join(await tempDir(), `${name}-${type}.gguf`);
    const res = await convertToGguf({ source: src, out, type });
    const hf = await loadModelDir(src);
    const gg = await loadModelDir(out);
    try {
      expect(gg.spec).toEqual(hf.spec);
      expect(gg.generationConfig).toEqual(hf.generationConfig);
      expect(new Set(gg.stopTokenIds)).toEqual(new Set(hf.stopTokenIds));
      expect(res.bytes).toBe((await readFile(out)).byteLength);
      const ck = gg.checkpoint as GgufCheckpoint;
      expect(ck).toBeInstanceOf(GgufCheckpoint);
      // Every tensor the model needs, by HF name, with HF shape.
      const hfNames = hf.checkpoint.names().filter((n) => !n.includes('rotary'));
      for (const n of hfNames) {
        const a = hf.checkpoint.info(n);
        const b = ck.info(n);
        expect(b.shape, n).toEqual(a.shape);
        const want = await hf.checkpoint.readF32(n);
        const got = await ck.readF32(n);
        const stored = b.ggmlType as GgmlTypeName;
        // 1-D tensors (norms, biases) and the MoE router stay F32 in every file type, as llama.cpp's converter keeps them.
        expect(stored, n).toBe(a.shape.length === 1 || n.endsWith('.mlp.gate.weight') ? 'F32' : type);
        // What the file holds is the source rounded once to its type, and is served back exactly.
        const expected = dequantize(stored, quantize(stored, want), want.length);
        expect(got.length, n).toBe(want.length);
        expect(firstDiff(got, expected), n).toBe(-1);
        if (a.dtype === stored) expect(firstDiff(await ck.readRaw(n), await hf.checkpoint.readRaw(n)), n).toBe(-1);
      }
      expect(gg.weights.layers.length).toBe(hf.spec.numLayers);
    } finally {
      await hf.checkpoint.close();
      await gg.checkpoint.close();
    }
  });
});

const QUANT_TYPES = ['Q8_0', 'Q4_0', 'Q4_1', 'Q5_0', 'Q5_1', 'Q4_K', 'Q6_K', 'Q4_K_M', 'Q3_K_M', 'Q5_K_M', 'IQ4_XS'] as const;
/** The trained model is the largest fixture: two types keep the run short; the random ones take all. */
const quantCases = FIXTURE_MODELS.flatMap((name) => (name === 'tiny-shakespeare-qwen3' ? (['Q8_0', 'Q4_K_M'] as const) : QUANT_TYPES).map((t) => [name, t] as const));

describe('safetensors → quantized GGUF → load', () => {
  it.each(quantCases)('%s at %s: same spec; each tensor in its planned type, its blocks the reference quantization, served dequantized', async (name, type) => {
    const src = join(MODELS, name);
    const out = join(await tempDir(), `${name}-${type}.gguf`);
    const res = await convertToGguf({ source: src, out, type });
    const planned = new Map(res.tensors.map((t) => [t.name, t.type]));
    const hf = await loadModelDir(src);
    const gg = await loadModelDir(out);
    try {
      expect(gg.spec).toEqual(hf.spec);
      const ck = gg.checkpoint as GgufCheckpoint;
      let quantized = 0;
      for (const n of hf.checkpoint.names()) {
        const b = ck.info(n);
        expect(b.ggmlType, n).toBe(planned.get(b.ggufName));
        const want = await hf.checkpoint.readF32(n);
        const blocks = quantize(b.ggmlType, want);
        expect(firstDiff(await ck.readBlocks(n), blocks), n).toBe(-1);
        expect(firstDiff(await ck.readF32(n), dequantize(b.ggmlType, blocks, want.length)), n).toBe(-1);
        if (!['F32', 'F16', 'BF16'].includes(b.ggmlType)) {
          quantized++;
          expect(b.dtype).toBe('F32');
          expect(b.byteLength).toBe(want.length * 4);
          expect(b.rawByteLength).toBe(blocks.byteLength);
          expect(firstDiff(await ck.readRaw(n), await ck.readF32(n))).toBe(-1);
        }
      }
      expect(quantized).toBeGreaterThan(0);
    } finally {
      await hf.checkpoint.close();
      await gg.checkpoint.close();
    }
  });
});

describe('GGUF layout as llama.cpp writes it', () => {
  it('llama: q/k rows are reordered per head as the converter permutes them, and undone on read', async () => {
    const src = join(MODELS, 'tiny-random-llama');
    const out = join(await tempDir(), 'llama.gguf');
    await convertToGguf({ source: src, out, type: 'F32' });
    const hf = await loadModelDir(src);
    const file = await GgufFile.open(out);
    try {
      const { numHeads, numKvHeads, headDim, hiddenSize } = hf.spec;
      for (const [hfName, ggName, heads] of [
        ['model.layers.1.self_attn.q_proj.weight', 'blk.1.attn_q.weight', numHeads],
        ['model.layers.1.self_attn.k_proj.weight', 'blk.1.attn_k.weight', numKvHeads],
      ] as const) {
        const w = await hf.checkpoint.readF32(hfName);
        const t = file.tensor(ggName);
        expect(t.dims).toEqual([hiddenSize, heads * headDim]);
        const raw = await file.readTensor(ggName);
        const g = new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
        // convert_hf_to_gguf: w.reshape(heads, 2, d/2, cols).swapaxes(1, 2).reshape(rows, cols)
        const half = headDim / 2;
        for (let h = 0; h < heads; h++) {
          for (let j = 0; j < half; j++) {
            for (let i = 0; i < 2; i++) {
              const ggRow = h * headDim + j * 2 + i;
              const hfRow = h * headDim + i * half + j;
              expect(g.subarray(ggRow * hiddenSize, (ggRow + 1) * hiddenSize)).toEqual(w.subarray(hfRow * hiddenSize, (hfRow + 1) * hiddenSize));
            }
          }
        }
      }
      // v is not permuted; llama3 scaling adds llama.cpp's rope_freqs tensor.
      expect(await file.readTensor('blk.0.attn_v.weight')).toEqual(await hf.checkpoint.readRaw('model.layers.0.self_attn.v_proj.weight'));
      expect(file.tensor('rope_freqs.weight').dims).toEqual([headDim / 2]);
      expect(file.get('general.architecture')).toEqual({ type: 'STRING', value: 'llama' });
      expect(file.get('llama.block_count')).toEqual({ type: 'UINT32', value: 3 });
      expect(file.get('general.quantization_version')).toEqual({ type: 'UINT32', value: 2 });
      expect(file.get('general.file_type')).toEqual({ type: 'UINT32', value: 0 });
      // The data section is contiguous and aligned, as llama.cpp's loader requires.
      let expect0 = file.header.dataOffset;
      for (const t of file.tensors) {
        expect(t.byteOffset).toBe(expect0);
        expect0 += Math.ceil(t.byteLength / 32) * 32;
      }
    } finally {
      await hf.checkpoint.close();
      await file.close();
    }
  });

  it('qwen3-moe: experts stacked into one 3-D tensor per projection, ggml dims reversed, router kept F32', async () => {
    const src = join(MODELS, 'tiny-random-qwen3-moe');
    const out = join(await tempDir(), 'moe.gguf');
    await convertToGguf({ source: src, out, type: 'BF16' });
    const hf = await loadModelDir(src);
    const file = await GgufFile.open(out);
    try {
      const m = hf.spec.moe!;
      const gate = file.tensor('blk.1.ffn_gate_exps.weight');
      expect(gate.dims).toEqual([hf.spec.hiddenSize, m.moeIntermediateSize, m.numExperts]);
      expect(gate.type).toBe('BF16');
      expect(file.tensor('blk.1.ffn_down_exps.weight').dims).toEqual([m.moeIntermediateSize, hf.spec.hiddenSize, m.numExperts]);
      expect(file.tensor('blk.0.ffn_gate_inp.weight').type).toBe('F32');
      expect(file.get('qwen3moe.expert_count')).toEqual({ type: 'UINT32', value: m.numExperts });
      expect(file.get('qwen3moe.expert_used_count')).toEqual({ type: 'UINT32', value: m.topK });
      const raw = await file.readTensor('blk.1.ffn_up_exps.weight');
      const per = raw.byteLength / m.numExperts;
      expect(raw.subarray(5 * per, 6 * per)).toEqual(await hf.checkpoint.readRaw('model.layers.1.mlp.experts.5.up_proj.weight'));
    } finally {
      await hf.checkpoint.close();
      await file.close();
    }
  });

  it('quantized tensors expose their block form beside the dequantized f32 they serve', async () => {
    const out = join(await tempDir(), 'q.gguf');
    await convertToGguf({ source: join(MODELS, 'tiny-random-qwen3'), out, type: 'F16' });
    const ck = await GgufCheckpoint.open(out);
    try {
      const i = ck.info('model.layers.0.mlp.up_proj.weight');
      expect(i.ggmlType).toBe('F16');
      expect(i.dtype).toBe('F16');
      expect(i.rawByteLength).toBe(i.byteLength);
      expect(await ck.readBlocks('model.layers.0.mlp.up_proj.weight')).toEqual(await ck.readRaw('model.layers.0.mlp.up_proj.weight'));
      expect(ck.totalBytes).toBe(ck.names().reduce((s, n) => s + ck.info(n).byteLength, 0));
    } finally {
      await ck.close();
    }
  });
});

describe('tokenizer through GGUF metadata', () => {
  const meta = (entries: [string, GgufValue][]) => new Map(entries);

  it('the Qwen3 tokenizer encodes the reference strings and chats to the same ids', async () => {
    const ref = JSON.parse(await readFile(join(QWEN3_TOKENIZER, 'reference.json'), 'utf8')) as {
      encode: { text: string; ids: number[] }[];
      chat: { messages: { role: string; content: string }[]; kwargs: Record<string, unknown>; rendered: string; ids: number[] }[];
    };
    const tokenizerJson = await readTokenizerJson(QWEN3_TOKENIZER, 'tokenizer.json', true);
    const tokenizerConfig = (await readTokenizerJson(QWEN3_TOKENIZER, 'tokenizer_config.json', true)) as { chat_template: string };
    const original = await NervaTokenizer.fromDir(QWEN3_TOKENIZER);
    // Qwen3 pads its embedding to 151,936 rows: llama.cpp stores that many tokens.
    const md = ggufTokenizerMetadata({ tokenizerJson, tokenizerConfig, chatTemplate: tokenizerConfig.chat_template, vocabRows: 151_936 });
    const m = meta(md);
    expect(m.get('tokenizer.ggml.pre')).toEqual({ type: 'STRING', value: 'qwen2' });
    const tokens = m.get('tokenizer.ggml.tokens')!.value as { items: readonly string[] };
    expect(tokens.items.length).toBe(151_936);
    expect(tokens.items[151_700]).toBe('[PAD151700]');
    const types = (m.get('tokenizer.ggml.token_type')!.value as { items: readonly number[] }).items;
    expect(types[151_644]).toBe(3); // <|im_start|>: special → CONTROL
    expect(types[151_667]).toBe(4); // <think>: added, not special → USER_DEFINED
    expect(types[151_700]).toBe(5); // padding → UNUSED
    expect(m.get('tokenizer.ggml.add_bos_token')).toEqual({ type: 'BOOL', value: false });
    const tok = ggufTokenizer(m, 'qwen3.gguf')!;
    expect(tok.vocabSize).toBe(original.vocabSize);
    expect(tok.eosTokenIds).toEqual(original.eosTokenIds);
    for (const c of ref.encode) expect(tok.encode(c.text, { addSpecialTokens: false }), c.text).toEqual(c.ids);
    for (const c of ref.chat) {
      const { enable_thinking, ...extra } = c.kwargs as { enable_thinking?: boolean };
      const rendered = tok.applyChatTemplate(c.messages, { enableThinking: enable_thinking, extra });
      expect(rendered).toBe(c.rendered);
      expect(tok.encode(rendered, { addSpecialTokens: false })).toEqual(c.ids);
    }
    for (let id = 151_643; id < 151_669; id++) {
      expect(tok.isSpecial(id)).toBe(original.isSpecial(id));
      expect(tok.decode([id])).toBe(original.decode([id]));
    }
    expect(tok.hasId(151_700)).toBe(false);
  });

  it('the Shakespeare model: its GPT-2 byte-level tokenizer round-trips through a converted file', async () => {
    const dir = join(MODELS, 'tiny-shakespeare-qwen3');
    const out = join(await tempDir(), 'shakespeare.gguf');
    await convertToGguf({ source: dir, out, type: 'F32' });
    const gg = await loadModelDir(out);
    try {
      const original = await NervaTokenizer.fromDir(dir);
      const file = (gg.checkpoint as GgufCheckpoint).file;
      expect(file.get('tokenizer.ggml.pre')).toEqual({ type: 'STRING', value: 'gpt-2' });
      const text = (await readFile(join(FIXTURES, 'text', 'tinyshakespeare-last10pct.txt'), 'utf8')).slice(0, 20_000);
      const samples = [text, 'ROMEO:\nWhat say you?  42 apples\t and  ünïcödé — “quotes”', " 's 've 'LL", '<|endoftext|>To be'];
      for (const s of samples) {
        expect(gg.tokenizer!.encode(s)).toEqual(original.encode(s));
        expect(gg.tokenizer!.decode(original.encode(s))).toBe(original.decode(original.encode(s)));
      }
      expect(gg.tokenizer!.eosTokenIds).toEqual(original.eosTokenIds);
    } finally {
      await gg.checkpoint.close();
    }
  });

  it('a Llama-3-style tokenizer keeps its BOS post-processor and ignore_merges', () => {
    const vocab: Record<string, number> = { '<|begin_of_text|>': 0, a: 1, b: 2, ab: 3, 'Ġ': 4, 'Ġa': 5 };
    const tj = {
      added_tokens: [{ id: 0, content: '<|begin_of_text|>', special: true }],
      normalizer: null,
      pre_tokenizer: {
        type: 'Sequence',
        pretokenizers: [
          {
            type: 'Split',
            pattern: { Regex: String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` },
            behavior: 'Isolated',
            invert: false,
          },
          { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
        ],
      },
      post_processor: {
        type: 'Sequence',
        processors: [
          { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
          {
            type: 'TemplateProcessing',
            single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
            pair: [],
            special_tokens: {},
          },
        ],
      },
      decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
      model: { type: 'BPE', ignore_merges: true, vocab, merges: [['a', 'b'], ['Ġ', 'a']] },
    };
    const md = new Map(ggufTokenizerMetadata({ tokenizerJson: tj, vocabRows: 8 }));
    expect(md.get('tokenizer.ggml.pre')).toEqual({ type: 'STRING', value: 'llama-bpe' });
    expect(md.get('tokenizer.ggml.add_bos_token')).toEqual({ type: 'BOOL', value: true });
    expect(md.get('tokenizer.ggml.bos_token_id')).toEqual({ type: 'UINT32', value: 0 });
    const parts = ggufTokenizerParts(md, 'l3.gguf')!;
    expect((parts.tokenizerJson.model as { ignore_merges: boolean }).ignore_merges).toBe(true);
    const tok = ggufTokenizer(md, 'l3.gguf')!;
    const original = new NervaTokenizer(tj, {});
    for (const s of ['ab a', 'aab b']) expect(tok.encode(s)).toEqual(original.encode(s));
    expect(tok.encode('ab')[0]).toBe(0);
  });
});
