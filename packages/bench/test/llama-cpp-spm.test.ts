/**
 * SentencePiece vocabularies (`tokenizer.ggml.model` = "llama": Llama 2, Mistral, TinyLlama) read
 * from GGUF metadata: NERVA's tokenizer against llama.cpp's own on the same file.
 *
 * No such vocabulary is among the fixtures, so one is made here as SentencePiece's BPE makes one:
 * `<unk>`, `<s>`, `</s>`, the 256 byte tokens, the characters of some Shakespeare text (spaces as
 * `▁`), then its most frequent adjacent pairs merged one after another, each merged token scored
 * by how early it was made. A tiny random Llama with that vocabulary is written as a GGUF file,
 * and llama.cpp (node-llama-cpp's CPU build) and NERVA tokenize and detokenize the same texts:
 * Shakespeare's lines, spacing, and characters the vocabulary lacks (byte fallback). The other
 * way: a model folder whose tokenizer.json has that vocabulary in Hugging Face's (legacy) form is
 * converted with `nerva convert`, and llama.cpp tokenizes the file as the Hugging Face tokenizer
 * does; the Metaspace form, which spaces otherwise, is refused.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Engine } from '@nerva/engine';
import { convertToGguf, GgufFile, ggufTokenizerParts, ggufValue, loadModelTokenizer, NervaTokenizer, writeGguf, writeSyntheticCheckpoint, writeSyntheticGguf, type GgufValue } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openLlamaCpp, type LlamaCppModel } from '../src/llama-cpp.js';

const FIXTURES = process.env.NERVA_FIXTURES ?? resolve(import.meta.dirname, '../../../../shared/fixtures');
const TEXT = readFileSync(join(FIXTURES, 'text/tinyshakespeare-last10pct.txt'), 'utf8');
const SPACE = '\u2581';
const MERGES = 400;

const tmp = mkdtempSync(join(tmpdir(), 'nerva-spm-'));
const opened = await openLlamaCpp({ threads: 1 });
afterAll(async () => {
  if (opened.available) await opened.runtime.dispose();
  rmSync(tmp, { recursive: true, force: true });
});

/** A SentencePiece-style BPE vocabulary trained on `text`: tokens, scores and llama.cpp token types. */
function trainVocab(text: string): { tokens: string[]; scores: number[]; types: number[] } {
  const tokens = ['<unk>', '<s>', '</s>'];
  const types = [2, 3, 3];
  const scores = [0, 0, 0];
  for (let b = 0; b < 256; b++) {
    tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
    types.push(6);
    scores.push(0);
  }
  const lines = text.split('\n').filter((l) => l.length > 0).map((l) => Array.from(SPACE + l.replaceAll(' ', SPACE)));
  const chars = [...new Set(lines.flat())].sort();
  chars.forEach((c, i) => {
    tokens.push(c);
    types.push(1);
    scores.push(-1e6 - i);
  });
  for (let k = 0; k < MERGES; k++) {
    const counts = new Map<string, number>();
    for (const l of lines) for (let i = 0; i + 1 < l.length; i++) counts.set(l[i] + '\u0000' + l[i + 1], (counts.get(l[i] + '\u0000' + l[i + 1]) ?? 0) + 1);
    let best = '';
    let n = 1;
    for (const [p, c] of counts) if (c > n || (c === n && best !== '' && p < best)) [best, n] = [p, c];
    if (best === '') break;
    const [a, b] = best.split('\u0000');
    if (tokens.includes(a + b)) continue;
    tokens.push(a + b);
    types.push(1);
    scores.push(-k);
    for (const l of lines) {
      for (let i = 0; i + 1 < l.length; i++) if (l[i] === a && l[i + 1] === b) l.splice(i, 2, a + b);
    }
  }
  return { tokens, scores, types };
}

let file = '';
let llamaConfig: Record<string, unknown> = {};
beforeAll(async () => {
  const vocab = trainVocab(TEXT.slice(0, 30_000));
  const config = JSON.parse(readFileSync(join(FIXTURES, 'models/tiny-random-llama/config.json'), 'utf8')) as Record<string, unknown>;
  llamaConfig = { ...config, vocab_size: vocab.tokens.length };
  const synth = join(tmp, 'synth.gguf');
  await writeSyntheticGguf({ config: llamaConfig, out: synth, type: 'F32', seed: 3 });
  const src = await GgufFile.open(synth);
  try {
    const keep = [...src.metadata].filter(([k]) => !k.startsWith('tokenizer.'));
    const tok: [string, GgufValue][] = [
      ['tokenizer.ggml.model', ggufValue.str('llama')],
      ['tokenizer.ggml.tokens', ggufValue.array('STRING', vocab.tokens)],
      ['tokenizer.ggml.scores', ggufValue.array('FLOAT32', vocab.scores)],
      ['tokenizer.ggml.token_type', ggufValue.array('INT32', vocab.types)],
      ['tokenizer.ggml.unknown_token_id', ggufValue.u32(0)],
      ['tokenizer.ggml.bos_token_id', ggufValue.u32(1)],
      ['tokenizer.ggml.eos_token_id', ggufValue.u32(2)],
      ['tokenizer.ggml.add_bos_token', ggufValue.bool(true)],
      ['tokenizer.ggml.add_space_prefix', ggufValue.bool(true)],
    ];
    file = join(tmp, 'spm.gguf');
    await writeGguf(file, { metadata: [...keep, ...tok], tensors: src.tensors.map((t) => ({ name: t.name, type: t.type, dims: t.dims, data: () => src.readTensor(t.name) })) });
  } finally {
    await src.close();
  }
});

/**
 * A model folder of the tiny Llama shape with the test vocabulary in Hugging Face's form (the
 * tokenizer.json NERVA reads from the GGUF file, edited by `edit`), and random weights.
 */
async function hfFolder(name: string, edit: (tj: Record<string, unknown>) => Record<string, unknown>): Promise<string> {
  const f = await GgufFile.open(file);
  const parts = ggufTokenizerParts(f.metadata, file)!;
  await f.close();
  const dir = join(tmp, name);
  mkdirSync(dir);
  await writeSyntheticCheckpoint({ config: llamaConfig, outDir: dir, seed: 4 });
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(edit(parts.tokenizerJson)));
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(parts.tokenizerConfig));
  return dir;
}

async function withLlama<T>(f: (m: LlamaCppModel) => Promise<T> | T): Promise<T> {
  if (!opened.available) throw new Error(opened.reason);
  const m = await opened.runtime.load(file, 64);
  try {
    return await f(m);
  } finally {
    await m.dispose();
  }
}

describe.skipIf(!opened.available)(`a SentencePiece vocabulary in GGUF: NERVA tokenizes as llama.cpp does${opened.available ? '' : ` (skipped: ${opened.reason})`}`, () => {
  const lines = TEXT.slice(30_000, 60_000).split('\n').filter((l) => l.length > 0).slice(0, 200);
  const odd = ['', ' ', 'ROMEO:', '  two  spaces ', 'naïve café — 日本語 🎭', 'Tab\there', 'line one\nline two\n', 'What, ho! <s> is text here'];

  it('the same ids for every text, with byte fallback for characters the vocabulary lacks', async () => {
    const tok = (await loadModelTokenizer(file))!;
    const texts = [...lines, ...odd];
    // Special tokens written in a text are those tokens, as Hugging Face tokenizers (and NERVA's chat templates) read them.
    const theirs = await withLlama((m) => texts.map((t) => m.tokenize(t, true)!));
    const ours = texts.map((t) => tok.encode(t, { addSpecialTokens: false }));
    let differ = 0;
    for (let i = 0; i < texts.length; i++) if (JSON.stringify(ours[i]) !== JSON.stringify(theirs[i])) differ++;
    expect(differ, texts.find((_, i) => JSON.stringify(ours[i]) !== JSON.stringify(theirs[i]))).toBe(0);
    // The merges were used (not one token a character) and the fallback bytes too.
    const longest = lines.reduce((a, b) => (b.length > a.length ? b : a));
    expect(ours[texts.indexOf(longest)].length).toBeLessThan(Array.from(longest).length / 2);
    expect(ours[texts.indexOf(odd[4])].some((id) => id >= 3 && id < 259)).toBe(true);
    expect(ours[texts.indexOf(odd[7])]).toContain(1);
    // BOS when special tokens are added, as llama.cpp's add_bos_token says.
    expect(tok.encode('ROMEO:')[0]).toBe(1);
  });

  // The weights are random (near-tied logits), so only the prompt is compared, not the tokens generated.
  it('a text prompt through the engine: BOS and the ids llama.cpp gives', async () => {
    const engine = await Engine.create({ model: file, backend: 'cpu' });
    try {
      const out = await engine.submit('ROMEO: What light', { temperature: 0, maxTokens: 4, ignoreEos: true }).done;
      expect(out.promptIds).toEqual([1, ...(await withLlama((m) => m.tokenize('ROMEO: What light')!))]);
      expect(out.tokenIds).toHaveLength(4);
    } finally {
      engine.dispose();
    }
  });

  it('the same text back from the same ids', async () => {
    const tok = (await loadModelTokenizer(file))!;
    const ids = [...lines.slice(0, 50), ...odd.slice(1)].map((t) => tok.encode(t, { addSpecialTokens: false }));
    const theirs = await withLlama((m) => ids.map((x) => m.detokenize(x)!));
    expect(ids.map((x) => tok.decode(x))).toEqual(theirs);
  });

  // Hugging Face writes a SentencePiece vocabulary's spacing two ways: the legacy normalizer
  // (Prepend + Replace), tested here, and a Metaspace pre-tokenizer, refused below.
  it('a model folder with it in tokenizer.json (normalizer form) converts to a GGUF file llama.cpp tokenizes as the folder does', async () => {
    const dir = await hfFolder('hf-normalizer', (tj) => tj);
    const hf = await NervaTokenizer.fromDir(dir);
    const out = join(tmp, 'converted.gguf');
    await convertToGguf({ source: dir, out, type: 'F32' });
    const texts = [...lines.slice(0, 100), ...odd];
    const ours = texts.map((t) => hf.encode(t, { addSpecialTokens: false }));
    if (!opened.available) throw new Error(opened.reason);
    const m = await opened.runtime.load(out, 64);
    try {
      const theirs = texts.map((t) => m.tokenize(t, true)!);
      expect(theirs.filter((x, i) => JSON.stringify(x) !== JSON.stringify(ours[i])), texts.find((_, i) => JSON.stringify(theirs[i]) !== JSON.stringify(ours[i]))).toEqual([]);
    } finally {
      await m.dispose();
    }
    // The converted file's vocabulary, read back by NERVA, encodes as the folder's did.
    const back = (await loadModelTokenizer(out))!;
    expect(texts.map((t) => back.encode(t, { addSpecialTokens: false }))).toEqual(ours);
    expect(back.encode('ROMEO:')[0]).toBe(1);
  });

  // The Metaspace form puts no '▁' before text that starts with a space (or follows a special
  // token), where SentencePiece does: on ' ', '  two  spaces ' and the text after '<s>' llama.cpp's
  // tokens for a converted file differed from the folder's. No GGUF form says that, so conversion
  // refuses it.
  it('a tokenizer.json with a Metaspace pre-tokenizer is refused by nerva convert, nothing written', async () => {
    const dir = await hfFolder('hf-metaspace', (tj) => ({ ...tj, normalizer: null, pre_tokenizer: { type: 'Metaspace', replacement: SPACE, prepend_scheme: 'always', split: false } }));
    // The folder itself runs: its tokenizer is the Hugging Face one.
    expect((await NervaTokenizer.fromDir(dir)).encode('ROMEO:').length).toBeGreaterThan(1);
    const out = join(tmp, 'metaspace.gguf');
    await expect(convertToGguf({ source: dir, out, type: 'F32' })).rejects.toMatchObject({ code: 'UNSUPPORTED_TOKENIZER', message: expect.stringContaining('Metaspace') });
    expect(existsSync(out)).toBe(false);
  });
});
