/** Typed reads of GGUF metadata whose errors name the file and the key. */
import { GgufError } from './gguf-error.js';
import { shortestF32, type GgufMetadata, type GgufScalar, type GgufValue } from './gguf-value.js';

const INT_TYPES = new Set(['UINT8', 'INT8', 'UINT16', 'INT16', 'UINT32', 'INT32', 'UINT64', 'INT64']);

export class MetaReader {
  constructor(
    readonly meta: GgufMetadata,
    readonly path: string,
  ) {}

  has(key: string): boolean {
    return this.meta.has(key);
  }

  get(key: string): GgufValue | undefined {
    return this.meta.get(key);
  }

  private missing(key: string): never {
    throw new GgufError('BAD_METADATA', this.path, 'required but absent', { key });
  }

  private bad(key: string, want: string, v: GgufValue): never {
    const shown = v.type === 'ARRAY' ? `an array of ${v.value.itemType}` : `${v.type} ${String(v.value).slice(0, 80)}`;
    throw new GgufError('BAD_METADATA', this.path, `must be ${want}, found ${shown}`, { key });
  }

  /** A non-negative integer of any integer type, at most `max`. */
  int(key: string, fallback?: number, max = Number.MAX_SAFE_INTEGER): number {
    const v = this.meta.get(key);
    if (v === undefined) return fallback ?? this.missing(key);
    if (!INT_TYPES.has(v.type)) this.bad(key, 'an integer', v);
    const n = toInt(v.value as GgufScalar);
    if (n === undefined || n < 0 || n > max) this.bad(key, `an integer from 0 to ${max}`, v);
    return n;
  }

  /** A positive integer at most `max`. */
  posInt(key: string, fallback?: number, max = Number.MAX_SAFE_INTEGER): number {
    const n = this.int(key, fallback, max);
    if (n === 0) this.bad(key, 'a positive integer', this.meta.get(key)!);
    return n;
  }

  /** A finite float (FLOAT32 values come back as the shortest decimal of that float32). */
  float(key: string, fallback?: number): number {
    const v = this.meta.get(key);
    if (v === undefined) return fallback ?? this.missing(key);
    let x: number;
    if (v.type === 'FLOAT32') x = shortestF32(v.value as number);
    else if (v.type === 'FLOAT64') x = v.value as number;
    else if (INT_TYPES.has(v.type)) x = Number(v.value);
    else return this.bad(key, 'a number', v);
    if (!Number.isFinite(x)) this.bad(key, 'a finite number', v);
    return x;
  }

  posFloat(key: string, fallback?: number): number {
    const x = this.float(key, fallback);
    if (!(x > 0)) this.bad(key, 'a positive number', this.meta.get(key)!);
    return x;
  }

  str(key: string): string | undefined {
    const v = this.meta.get(key);
    if (v === undefined) return undefined;
    if (v.type !== 'STRING') this.bad(key, 'a string', v);
    return v.value as string;
  }

  bool(key: string): boolean | undefined {
    const v = this.meta.get(key);
    if (v === undefined) return undefined;
    if (v.type !== 'BOOL') this.bad(key, 'a bool', v);
    return v.value as boolean;
  }

  /** An array of strings. */
  strings(key: string): readonly string[] | undefined {
    const v = this.meta.get(key);
    if (v === undefined) return undefined;
    if (v.type !== 'ARRAY' || v.value.itemType !== 'STRING') this.bad(key, 'an array of strings', v);
    return v.value.items as readonly string[];
  }

  /** An array of finite float32 / float64 values (SentencePiece scores), as stored. */
  floats(key: string): readonly number[] | undefined {
    const v = this.meta.get(key);
    if (v === undefined) return undefined;
    if (v.type !== 'ARRAY' || (v.value.itemType !== 'FLOAT32' && v.value.itemType !== 'FLOAT64')) this.bad(key, 'an array of floats', v);
    const xs = v.value.items as readonly number[];
    if (!xs.every((x) => Number.isFinite(x))) this.bad(key, 'an array of finite floats', v);
    return xs;
  }

  /** An array of non-negative integers (any integer element type). */
  ints(key: string): number[] | undefined {
    const v = this.meta.get(key);
    if (v === undefined) return undefined;
    if (v.type !== 'ARRAY' || !INT_TYPES.has(v.value.itemType)) this.bad(key, 'an array of integers', v);
    const out: number[] = new Array<number>(v.value.items.length);
    v.value.items.forEach((x, i) => {
      const n = toInt(x);
      if (n === undefined) this.bad(key, 'an array of integers', v);
      out[i] = n;
    });
    return out;
  }

  /**
   * An integer that may also be given per layer (llama.cpp allows arrays for head counts and FFN
   * sizes): the one value, which every layer must share.
   */
  uniformInt(key: string, fallback?: number, max?: number): number {
    const v = this.meta.get(key);
    if (v?.type !== 'ARRAY') return this.posInt(key, fallback, max);
    const xs = this.ints(key)!;
    if (xs.length === 0 || xs.some((x) => x !== xs[0])) {
      throw new GgufError('UNSUPPORTED_MODEL', this.path, `per-layer values [${xs.slice(0, 8).join(', ')}${xs.length > 8 ? ', ...' : ''}] differ; NERVA runs models whose layers share one value`, { key });
    }
    if (!(xs[0] > 0) || (max !== undefined && xs[0] > max)) this.bad(key, `a positive integer at most ${max}`, v);
    return xs[0];
  }
}

function toInt(x: GgufScalar): number | undefined {
  if (typeof x === 'bigint') return x >= BigInt(Number.MIN_SAFE_INTEGER) && x <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(x) : undefined;
  if (typeof x === 'number' && Number.isSafeInteger(x)) return x;
  return undefined;
}
