import { createHash } from 'node:crypto';
import { KvArgumentError } from './errors.js';

/** Hash of a full block, chained over its parent: 32 lowercase hex chars (128 bits of SHA-256). */
export type BlockHash = string;

/** A key that must match, besides the tokens, for two blocks to share KV. */
export type ExtraKey = string | number;

/**
 * Request-level keys that change what a block's KV means even when the tokens are equal.
 */
export interface ExtraKeys {
  /**
   * Tenant or request isolation salt. Mixed into the first block only: every later block chains
   * over it, so the whole prefix is separated while later blocks hash no extra bytes.
   */
  cacheSalt?: string;
  /** Keys mixed into every block (LoRA adapter id, multimodal input hashes…). */
  keys?: readonly ExtraKey[];
}

/** Everything that goes into one block's hash. */
export interface BlockHashInput {
  /** Hash of the previous block in the sequence, `null` for the first block. */
  readonly parent: BlockHash | null;
  /** The block's `blockSize` token ids. */
  readonly tokens: Uint32Array;
  /** Cache salt (first block only, otherwise `null`). */
  readonly cacheSalt: string | null;
  /** Per-block extra keys. */
  readonly keys: readonly ExtraKey[];
}

/** Block hash function; injectable so tests can force collisions. */
export type BlockHashFn = (input: BlockHashInput) => BlockHash;

/**
 * Default block hash: SHA-256 over a length-prefixed JSON header `[parent, salt, keys]` followed by
 * the token ids as little-endian uint32, truncated to 16 bytes. The length prefix keeps the
 * encoding injective; a 128-bit truncation makes accidental collisions negligible, and hits are
 * verified against stored tokens anyway.
 */
export const sha256BlockHash: BlockHashFn = (input) => {
  const header = Buffer.from(JSON.stringify([input.parent, input.cacheSalt, input.keys]), 'utf8');
  const len = Buffer.allocUnsafe(4);
  len.writeUInt32LE(header.length, 0);
  const h = createHash('sha256');
  h.update(len);
  h.update(header);
  h.update(tokenBytes(input.tokens));
  return h.digest().subarray(0, 16).toString('hex');
};

/** Token bytes in little-endian order regardless of the host's endianness. */
function tokenBytes(tokens: Uint32Array): Buffer {
  if (HOST_LITTLE_ENDIAN) return Buffer.from(tokens.buffer, tokens.byteOffset, tokens.byteLength);
  const out = Buffer.allocUnsafe(tokens.length * 4);
  for (let i = 0; i < tokens.length; i++) out.writeUInt32LE(tokens[i], i * 4);
  return out;
}

const HOST_LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/** Largest valid token id (token ids are stored as uint32). */
export const MAX_TOKEN_ID = 0xffffffff;

/** Throws {@link KvArgumentError} unless `t` is an integer token id in [0, 2^32). */
export function checkTokenId(t: number, position: number): void {
  if (!Number.isInteger(t) || t < 0 || t > MAX_TOKEN_ID) {
    throw new KvArgumentError(`token at position ${position} is not a uint32 token id: ${t}`);
  }
}

/** Copies block `index` (`blockSize` tokens) out of `tokens`, validating each id. */
export function blockTokens(tokens: ArrayLike<number>, index: number, blockSize: number): Uint32Array {
  const start = index * blockSize;
  if (start + blockSize > tokens.length) {
    throw new KvArgumentError(`block ${index} is not full: ${tokens.length} tokens, block size ${blockSize}`);
  }
  const out = new Uint32Array(blockSize);
  for (let i = 0; i < blockSize; i++) {
    const t = tokens[start + i];
    checkTokenId(t, start + i);
    out[i] = t;
  }
  return out;
}

/** True when `a` and `b` hold the same token ids. */
export function tokensEqual(a: Uint32Array, b: Uint32Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * Validated, frozen form of {@link ExtraKeys}, with the tags that are stored on registered
 * blocks so a hit can compare extra keys as well as tokens (a forced hash collision must not
 * make a salted prompt hit an unsalted one).
 */
export interface NormalizedExtraKeys {
  readonly cacheSalt: string | null;
  readonly keys: readonly ExtraKey[];
  /** Tag of the first block (salt and keys). */
  readonly firstTag: string;
  /** Tag of every later block (keys only). */
  readonly restTag: string;
}

/** Validates `extra` and precomputes its tags. */
export function normalizeExtraKeys(extra: ExtraKeys | undefined): NormalizedExtraKeys {
  const salt = extra?.cacheSalt ?? null;
  if (salt !== null && typeof salt !== 'string') {
    throw new KvArgumentError(`cacheSalt must be a string, got ${typeof salt}`);
  }
  const keys = extra?.keys ?? [];
  if (!Array.isArray(keys)) throw new KvArgumentError('extra keys must be an array');
  for (const k of keys) {
    if (typeof k === 'number' ? !Number.isFinite(k) : typeof k !== 'string') {
      throw new KvArgumentError(`extra key must be a string or a finite number, got ${String(k)}`);
    }
  }
  const frozen = Object.freeze([...keys]);
  return {
    cacheSalt: salt,
    keys: frozen,
    firstTag: JSON.stringify([salt, frozen]),
    restTag: JSON.stringify([null, frozen]),
  };
}

/** Hashes block `index` given its parent hash, applying the salt on block 0 only. */
export function hashBlock(
  fn: BlockHashFn,
  parent: BlockHash | null,
  tokens: Uint32Array,
  index: number,
  extra: NormalizedExtraKeys,
): BlockHash {
  const h = fn({ parent, tokens, cacheSalt: index === 0 ? extra.cacheSalt : null, keys: extra.keys });
  if (typeof h !== 'string' || h.length === 0) {
    throw new KvArgumentError(`block hash function returned ${String(h)}; expected a non-empty string`);
  }
  return h;
}
