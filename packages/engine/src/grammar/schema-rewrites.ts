/**
 * JSON Schemas rewritten around XGrammar 0.1.27's defects, into schemas that accept the same
 * values and that it compiles correctly:
 * - A length-bounded string (minLength/maxLength, no pattern or format) becomes `[^"\\\r\n]{m,n}`
 *   there, which lets a tab or another control character through raw (JSON forbids those in a
 *   string), allows no escape, and makes slow masks; it is given a sentinel pattern instead, which
 *   bounded-strings.ts expands into exact, fast EBNF after the conversion.
 * - An integer with both bounds becomes a digit pattern that is wrong for many bounds (measured:
 *   [1500, 1700] accepts 1000-1999, [0, 130] accepts 131-139, [1500, 1699] accepts 1460); ranges of
 *   a fixed prefix and free digits ([1600, 1699], [130, 139], [-99, -10]) come out exact, so the
 *   range is given as anyOf such ranges (at most 9 a digit and sign).
 */

import { boundedStringPattern, CHAIN_LIMIT } from './bounded-strings.js';

/** Keys whose values are data, not subschemas: left as they are. */
const DATA_KEYS = new Set(['enum', 'const', 'default', 'examples']);

/** Keys whose subschemas describe values inside an object or array (JSON punctuation follows each). */
const CONTAINED_KEYS = new Set(['properties', 'patternProperties', 'additionalProperties', 'unevaluatedProperties', 'items', 'prefixItems', 'additionalItems', 'unevaluatedItems', 'contains']);
/** Keys whose subschemas may be used anywhere ($ref), the root included. */
const DEFINITION_KEYS = new Set(['$defs', 'definitions']);

/**
 * `schema` with the rewrites above applied everywhere in it; a copy (`schema` is kept).
 * `contained`: the schema describes a value inside an object or array (for bounded strings).
 */
export function schemaForXGrammar(schema: unknown, contained = false): unknown {
  if (Array.isArray(schema)) return schema.map((x) => schemaForXGrammar(x, contained));
  if (schema === null || typeof schema !== 'object') return schema;
  const s = schema as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(s)) {
    out[k] = DATA_KEYS.has(k) ? v : schemaForXGrammar(v, CONTAINED_KEYS.has(k) ? true : DEFINITION_KEYS.has(k) ? false : contained);
  }
  if (s.type === 'string' && (s.minLength !== undefined || s.maxLength !== undefined) && s.pattern === undefined && s.format === undefined) {
    const lo = Number.isInteger(s.minLength) ? (s.minLength as number) : 0;
    const hi = Number.isInteger(s.maxLength) ? (s.maxLength as number) : undefined;
    // Past CHAIN_LIMIT the characters JSON allows unescaped, as a pattern (exact but for escapes).
    out.pattern = (hi ?? lo) > CHAIN_LIMIT ? `^[^"\\\\\\x00-\\x1f]{${lo},${hi ?? ''}}$` : boundedStringPattern(lo, hi, contained);
    delete out.minLength;
    delete out.maxLength;
  }
  if (s.type === 'integer') {
    const lo = integerBound(s.minimum, s.exclusiveMinimum, 1);
    const hi = integerBound(s.maximum, s.exclusiveMaximum, -1);
    if (lo !== undefined && hi !== undefined && lo <= hi) {
      const pieces = alignedRanges(lo, hi);
      if (pieces.length > 1) {
        for (const k of ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum', 'type']) delete out[k];
        out.anyOf = pieces.map(([a, b]) => ({ type: 'integer', minimum: a, maximum: b }));
      }
    }
  }
  return out;
}

/** The inclusive integer bound of minimum/exclusiveMinimum (dir 1) or maximum/exclusiveMaximum (dir -1). */
function integerBound(inclusive: unknown, exclusive: unknown, dir: 1 | -1): number | undefined {
  const c: number[] = [];
  if (typeof inclusive === 'number' && Number.isFinite(inclusive)) c.push(dir > 0 ? Math.ceil(inclusive) : Math.floor(inclusive));
  if (typeof exclusive === 'number' && Number.isFinite(exclusive)) c.push(dir > 0 ? Math.floor(exclusive) + 1 : Math.ceil(exclusive) - 1);
  if (c.length === 0) return undefined;
  const v = dir > 0 ? Math.max(...c) : Math.min(...c);
  return Number.isSafeInteger(v) ? v : undefined;
}

/**
 * [lo, hi] as consecutive ranges each of one sign, one number of digits and the aligned form: a
 * fixed prefix, then free digits (e.g. [1500, 1700] → [1500, 1599], [1600, 1699], [1700, 1700]).
 */
export function alignedRanges(lo: number, hi: number): [number, number][] {
  const out: [number, number][] = [];
  if (lo < 0) {
    // Negative values: the aligned ranges of their magnitudes, mirrored.
    const neg = alignedRanges(Math.max(1, -hi), -lo).map(([a, b]): [number, number] => [-b, -a]);
    out.push(...neg.reverse());
    if (hi < 0) return out;
    lo = 0;
  }
  while (lo <= hi) {
    const top = Math.min(hi, 10 ** String(lo).length - 1);
    let a = lo;
    while (a <= top) {
      // The largest block of free digits starting at a: a fixed prefix, then free digits.
      let step = 1;
      while (a % (step * 10) === 0 && a + step * 10 - 1 <= top) step *= 10;
      out.push([a, a + step - 1]);
      a += step;
    }
    lo = top + 1;
  }
  return out;
}

/** A structural tag's format with the JSON Schemas inside it rewritten (schemaForXGrammar). */
export function formatForXGrammar(format: unknown): unknown {
  if (Array.isArray(format)) return format.map(formatForXGrammar);
  if (format === null || typeof format !== 'object') return format;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(format as Record<string, unknown>)) out[k] = k === 'json_schema' ? schemaForXGrammar(v) : formatForXGrammar(v);
  return out;
}
