import { describe, expect, it } from 'vitest';
import {
  blockTokens,
  hashBlock,
  KvArgumentError,
  normalizeExtraKeys,
  sha256BlockHash,
  tokensEqual,
} from '../src/index.js';

const toks = (...t: number[]) => Uint32Array.from(t);

describe('block hashing', () => {
  const none = normalizeExtraKeys(undefined);

  it('is deterministic, 128-bit hex, and depends on parent, tokens and keys', () => {
    const h = hashBlock(sha256BlockHash, null, toks(1, 2, 3), 0, none);
    expect(h).toMatch(/^[0-9a-f]{32}$/);
    expect(hashBlock(sha256BlockHash, null, toks(1, 2, 3), 0, none)).toBe(h);
    expect(hashBlock(sha256BlockHash, null, toks(1, 2, 4), 0, none)).not.toBe(h);
    expect(hashBlock(sha256BlockHash, h, toks(1, 2, 3), 1, none)).not.toBe(h);
    const lora = normalizeExtraKeys({ keys: ['lora-7'] });
    expect(hashBlock(sha256BlockHash, null, toks(1, 2, 3), 0, lora)).not.toBe(h);
    // A number key and its string spelling are different keys.
    const n = normalizeExtraKeys({ keys: [7] });
    const s = normalizeExtraKeys({ keys: ['7'] });
    expect(hashBlock(sha256BlockHash, null, toks(1), 0, n)).not.toBe(hashBlock(sha256BlockHash, null, toks(1), 0, s));
  });

  it('applies the cache salt to the first block only', () => {
    const salted = normalizeExtraKeys({ cacheSalt: 'tenant-a' });
    expect(hashBlock(sha256BlockHash, null, toks(5, 6), 0, salted)).not.toBe(
      hashBlock(sha256BlockHash, null, toks(5, 6), 0, none),
    );
    // Later blocks with the same parent hash are unaffected by the salt: separation is via the chain.
    expect(hashBlock(sha256BlockHash, 'p', toks(5, 6), 1, salted)).toBe(hashBlock(sha256BlockHash, 'p', toks(5, 6), 1, none));
    expect(salted.firstTag).not.toBe(none.firstTag);
    expect(salted.restTag).toBe(none.restTag);
  });

  it('encodes the header injectively (token bytes cannot impersonate keys)', () => {
    const a = sha256BlockHash({ parent: null, tokens: toks(1), cacheSalt: 'ab', keys: [] });
    const b = sha256BlockHash({ parent: null, tokens: toks(1), cacheSalt: 'a', keys: ['b'] });
    expect(a).not.toBe(b);
  });

  it('validates tokens and keys', () => {
    expect(() => blockTokens([1, -1], 0, 2)).toThrow(KvArgumentError);
    expect(() => blockTokens([1, 2.5], 0, 2)).toThrow(KvArgumentError);
    expect(() => blockTokens([1, 2 ** 32], 0, 2)).toThrow(KvArgumentError);
    expect(() => blockTokens([1, 2, 3], 1, 2)).toThrow(KvArgumentError);
    expect(Array.from(blockTokens([1, 2, 3, 4], 1, 2))).toEqual([3, 4]);
    expect(() => normalizeExtraKeys({ keys: [Number.NaN] })).toThrow(KvArgumentError);
    expect(() => normalizeExtraKeys({ cacheSalt: 3 as unknown as string })).toThrow(KvArgumentError);
    expect(() => hashBlock(() => '', null, toks(1), 0, none)).toThrow(KvArgumentError);
  });

  it('compares token arrays', () => {
    expect(tokensEqual(toks(1, 2), toks(1, 2))).toBe(true);
    expect(tokensEqual(toks(1, 2), toks(2, 1))).toBe(false);
    expect(tokensEqual(toks(1, 2), toks(1))).toBe(false);
  });
});
