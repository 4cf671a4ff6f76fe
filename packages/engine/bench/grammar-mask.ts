// What one token mask of a JSON Schema costs on the CPU, by where in the grammar it is computed.
// For each schema: compile it through GrammarService (a fresh service, its vocabulary built
// beforehand, so the time is the schema's alone), then walk a matcher through valid instances
// token by token (the instance's compact JSON as the tokenizer encodes it) and time each step's
// accept + next mask (what a grammar worker does for a row each decode step). Each step is
// labelled by what the next token starts: structure (braces, keys, separators), a string's
// characters (bounded by minLength/maxLength or free), a number, an enum value, a boolean.
// One JSON line per schema and one summary line (all schemas) to stdout.
//   npx tsx packages/engine/bench/grammar-mask.ts [--tokenizer DIR] [--vocab 151936] [--eos 151645,151643] [--repeats 5]
import { join } from 'node:path';
import { NervaTokenizer } from '@nerva/models';
import { GrammarService } from '../src/grammar/grammar-service.js';

/** The schema tools/gpu/grammar_cost.ts measures on the GPU (kept identical). */
const GPU_COST_SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 24 },
    age: { type: 'integer', minimum: 0, maximum: 150 },
    role: { enum: ['admin', 'editor', 'viewer'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 12 }, maxItems: 4 },
    active: { type: 'boolean' },
    notes: { type: 'string' },
  },
  required: ['name', 'age', 'role', 'tags', 'active', 'notes'],
  additionalProperties: false,
};

const NESTED_SCHEMA = {
  type: 'object',
  properties: {
    id: { type: 'integer', minimum: 1 },
    customer: {
      type: 'object',
      properties: {
        name: { type: 'string', minLength: 1, maxLength: 64 },
        email: { type: 'string', maxLength: 80 },
        address: {
          type: 'object',
          properties: { street: { type: 'string', maxLength: 100 }, city: { type: 'string', maxLength: 40 }, country: { type: 'string', minLength: 2, maxLength: 2 } },
          required: ['street', 'city', 'country'],
          additionalProperties: false,
        },
      },
      required: ['name', 'email', 'address'],
      additionalProperties: false,
    },
    total: { type: 'number' },
  },
  required: ['id', 'customer', 'total'],
  additionalProperties: false,
};

const ENUM_SCHEMA = {
  type: 'object',
  properties: {
    sentiment: { enum: ['positive', 'negative', 'neutral', 'mixed'] },
    language: { enum: ['en', 'fr', 'de', 'es', 'it', 'pt', 'zh', 'ja'] },
    topic: { enum: ['billing', 'shipping', 'returns', 'product quality', 'account access', 'other'] },
    urgent: { type: 'boolean' },
    confidence: { type: 'number', minimum: 0, maximum: 1 },
  },
  required: ['sentiment', 'language', 'topic', 'urgent', 'confidence'],
  additionalProperties: false,
};

const ARRAY_SCHEMA = {
  type: 'object',
  properties: {
    title: { type: 'string', minLength: 5, maxLength: 120 },
    keywords: { type: 'array', items: { type: 'string', minLength: 2, maxLength: 20 }, minItems: 1, maxItems: 8 },
    summary: { type: 'string', maxLength: 200 },
  },
  required: ['title', 'keywords', 'summary'],
  additionalProperties: false,
};

/** Schemas with valid instances to walk (strings near and at their bounds, escapes, non-ASCII text). */
export const BENCH_SCHEMAS: { name: string; schema: object; instances: unknown[] }[] = [
  {
    name: 'gpu_cost',
    schema: GPU_COST_SCHEMA,
    instances: [
      { name: 'Ada Lovelace', age: 36, role: 'admin', tags: ['math', 'engines', 'poetry'], active: true, notes: 'First to publish an algorithm for a machine.' },
      { name: 'Jean-Baptiste Poquelin X', age: 51, role: 'editor', tags: ['theatre', 'comedy', 'satire', 'court'], active: false, notes: 'Wrote "Tartuffe".\nDied on stage.' },
      { name: 'Zoë Ñúñez', age: 0, role: 'viewer', tags: [], active: true, notes: '' },
    ],
  },
  {
    name: 'nested_object',
    schema: NESTED_SCHEMA,
    instances: [
      { id: 1042, customer: { name: 'María José García', email: 'mj.garcia@example.org', address: { street: '12 Rue de la Paix, Bâtiment B, 3e étage', city: 'Paris', country: 'FR' } }, total: 129.95 },
      { id: 7, customer: { name: 'Li Wei', email: 'li.wei@example.com', address: { street: '88 Nanjing Road', city: '上海', country: 'CN' } }, total: 0.5 },
    ],
  },
  {
    name: 'enums',
    schema: ENUM_SCHEMA,
    instances: [
      { sentiment: 'negative', language: 'en', topic: 'product quality', urgent: true, confidence: 0.92 },
      { sentiment: 'mixed', language: 'ja', topic: 'account access', urgent: false, confidence: 0.5 },
    ],
  },
  {
    name: 'array_of_bounded_strings',
    schema: ARRAY_SCHEMA,
    instances: [
      {
        title: 'Constrained decoding with token masks on the GPU',
        keywords: ['grammar', 'XGrammar', 'JSON Schema', 'token mask', 'decoding', 'latency', 'batching', 'CUDA graphs'],
        summary:
          'A grammar engine computes, for every row of the batch and every step, which tokens keep the output valid; the mask is applied before sampling. This note measures what that costs per token.',
      },
      { title: 'Ünïcödé', keywords: ['日本語', 'ab'], summary: 'Short "quoted" text with a tab\tand a backslash \\.' },
    ],
  },
];

/** What a walk step's next token starts. */
type Kind = 'structure' | 'string_bounded' | 'string_free' | 'number' | 'enum' | 'boolean';

interface Segment {
  text: string;
  kind: Kind;
}

/** `value` as compact JSON (Python's separators), in segments labelled by what the grammar is inside. */
export function segments(schema: Record<string, unknown>, value: unknown, out: Segment[] = []): Segment[] {
  const push = (text: string, kind: Kind) => out.push({ text, kind });
  if (Array.isArray(schema.enum)) {
    push(JSON.stringify(value), 'enum');
  } else if (Array.isArray(value)) {
    push('[', 'structure');
    value.forEach((v, i) => {
      if (i > 0) push(', ', 'structure');
      segments(schema.items as Record<string, unknown>, v, out);
    });
    push(']', 'structure');
  } else if (value !== null && typeof value === 'object') {
    push('{', 'structure');
    const props = schema.properties as Record<string, Record<string, unknown>>;
    Object.entries(value).forEach(([k, v], i) => {
      push(`${i > 0 ? ', ' : ''}${JSON.stringify(k)}: `, 'structure');
      segments(props[k], v, out);
    });
    push('}', 'structure');
  } else if (typeof value === 'string') {
    // The opening quote is structure (decided before the string's rule); its characters and the
    // closing quote are the string's.
    const bounded = schema.minLength !== undefined || schema.maxLength !== undefined;
    push('"', 'structure');
    push(JSON.stringify(value).slice(1), bounded ? 'string_bounded' : 'string_free');
  } else if (typeof value === 'number') {
    push(JSON.stringify(value), 'number');
  } else {
    push(JSON.stringify(value), 'boolean');
  }
  return out;
}

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

const r4 = (x: number) => Math.round(x * 10_000) / 10_000;

function stats(ms: number[]): { n: number; p50: number; p99: number; max: number; mean: number } {
  const s = [...ms].sort((a, b) => a - b);
  return { n: s.length, p50: r4(quantile(s, 0.5)), p99: r4(quantile(s, 0.99)), max: r4(s[s.length - 1] ?? NaN), mean: r4(s.reduce((a, b) => a + b, 0) / s.length) };
}

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

async function main(): Promise<void> {
  const tokDir = arg('tokenizer', join(import.meta.dirname, '../../../../shared/fixtures/tokenizers/qwen3'));
  const vocab = Number(arg('vocab', '151936'));
  const eos = arg('eos', '151645,151643').split(',').map(Number);
  const repeats = Number(arg('repeats', '5'));
  const only = arg('schemas', '');
  const tok = await NervaTokenizer.fromDir(tokDir);
  const all: Record<string, number[]> = {};
  for (const b of BENCH_SCHEMAS) {
    if (only && !only.split(',').includes(b.name)) continue;
    const svc = new GrammarService(tok, vocab, eos);
    await svc.prepare();
    const t0 = performance.now();
    const g = await svc.compile({ type: 'json_schema', schema: JSON.stringify(b.schema), strict: true });
    const compileMs = performance.now() - t0;
    const byKind: Record<string, number[]> = {};
    /** Valid instances the grammar refused (a formulation narrower than the schema): not timed. */
    const refused: { instance: string; at: number }[] = [];
    for (const inst of b.instances) {
      const segs = segments(b.schema as Record<string, unknown>, inst);
      const text = segs.map((s) => s.text).join('');
      if (JSON.stringify(JSON.parse(text)) !== JSON.stringify(inst)) throw new Error(`${b.name}: segments do not spell the instance`);
      const kindAt: Kind[] = [];
      for (const s of segs) for (let i = 0; i < s.text.length; i++) kindAt.push(s.kind);
      const ids = tok.encode(text, { addSpecialTokens: false });
      if (tok.decode(ids) !== text) throw new Error(`${b.name}: the tokenizer does not round-trip the instance`);
      // Where each token ends in the text (a prefix ending inside a character counts it whole).
      const ends = ids.map((_, i) => tok.decode(ids.slice(0, i + 1)).length);
      const times: [Kind, number][] = [];
      let ok = true;
      for (let r = 0; r < repeats && ok; r++) {
        const st = g.start(eos);
        for (const [i, id] of ids.entries()) {
          if (!st.advance(id)) {
            refused.push({ instance: text, at: ends[i - 1] ?? 0 });
            ok = false;
            break;
          }
          // The mask just computed is for the token starting where this one ends.
          times.push([ends[i] < text.length ? kindAt[ends[i]] : 'structure', st.lastMs]);
        }
        if (ok && (!st.advance(eos[0]) || !st.terminated)) {
          refused.push({ instance: text, at: text.length });
          ok = false;
        }
        st.dispose();
      }
      if (!ok) continue;
      for (const [kind, ms] of times) {
        (byKind[kind] ??= []).push(ms);
        (all[kind] ??= []).push(ms);
      }
    }
    const kinds = Object.fromEntries(Object.entries(byKind).map(([k, v]) => [k, stats(v)]));
    console.log(JSON.stringify({ schema: b.name, compile_ms: Math.round(compileMs), masks: stats(Object.values(byKind).flat()), kinds, refused }));
    svc.dispose();
  }
  console.log(JSON.stringify({ schema: 'all', masks: stats(Object.values(all).flat()), kinds: Object.fromEntries(Object.entries(all).map(([k, v]) => [k, stats(v)])) }));
}

await main();
