import { beforeAll, describe, expect, it } from 'vitest';
import { createDetokenizer, NervaTokenizer } from '../src/index.js';
import { QWEN3_TOKENIZER } from './helpers.js';

let tok: NervaTokenizer;
beforeAll(async () => {
  tok = await NervaTokenizer.fromDir(QWEN3_TOKENIZER);
});

const TEXTS = [
  'emoji 🚀🔥 and 👩‍👩‍👧 family',
  '日本語のテキストと中文文本',
  'mixed: café 😀 日本 — ok 🇯🇵!',
  '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝕏 and ∑∫',
];

function stream(ids: number[]): { chunks: string[]; total: string } {
  const d = createDetokenizer(tok);
  const chunks = ids.map((id) => d.push(id));
  chunks.push(d.flush());
  expect(d.text).toBe(chunks.join(''));
  return { chunks, total: chunks.join('') };
}

describe('createDetokenizer', () => {
  it('streams multi-byte characters split across byte-level tokens without U+FFFD', () => {
    let splitSeen = 0;
    for (const text of TEXTS) {
      const ids = tok.encode(text, { addSpecialTokens: false });
      // The test only means something if some tokens are partial characters on their own.
      splitSeen += ids.filter((id) => tok.decode([id]).includes('\uFFFD')).length;
      const { chunks, total } = stream(ids);
      expect(total).toBe(tok.decode(ids));
      expect(total).toBe(text);
      for (const c of chunks) expect(c).not.toContain('\uFFFD');
    }
    expect(splitSeen).toBeGreaterThan(3);
  });

  it('emits text as soon as a character completes', () => {
    const ids = tok.encode('a🚀b', { addSpecialTokens: false });
    const { chunks } = stream(ids);
    const nonEmpty = chunks.filter((c) => c !== '');
    expect(nonEmpty.join('')).toBe('a🚀b');
    expect(nonEmpty.some((c) => c.includes('🚀'))).toBe(true);
    expect(chunks.some((c) => c === '')).toBe(true); // a partial emoji token was held back
  });

  it('flush releases genuinely incomplete bytes, matching decode', () => {
    const rocket = tok.encode(' 🚀', { addSpecialTokens: false });
    const partial = [...tok.encode('x', { addSpecialTokens: false }), rocket[0]];
    expect(tok.decode([rocket[0]])).toContain('\uFFFD');
    const { chunks, total } = stream(partial);
    expect(total).toBe(tok.decode(partial));
    expect(chunks[chunks.length - 1]).toContain('\uFFFD');
  });

  it('prompt context is used but never emitted; special tokens can be skipped', () => {
    const prompt = tok.encode('Hello', { addSpecialTokens: false });
    const d = createDetokenizer(tok, { promptIds: prompt, skipSpecialTokens: true });
    const out = [...tok.encode(' world', { addSpecialTokens: false }), tok.tokenToId('<|im_end|>')!].map((id) => d.push(id)).join('') + d.flush();
    expect(out).toBe(' world');
    const keep = createDetokenizer(tok);
    expect(keep.push(tok.tokenToId('<|im_end|>')!)).toBe('<|im_end|>');
  });

  it('long streams stay equal to a one-shot decode', () => {
    const text = 'The quick brown 🦊 jumps over 13 lazy 🐶s. 日本語も。'.repeat(20);
    const ids = tok.encode(text, { addSpecialTokens: false });
    const { chunks, total } = stream(ids);
    expect(total).toBe(text);
    expect(chunks.every((c) => !c.includes('\uFFFD'))).toBe(true);
  });
});
