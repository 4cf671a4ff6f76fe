import { copyFile, mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticCheckpoint } from '@nerva/models';
import { Ajv2020 } from 'ajv/dist/2020.js';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../src/server.js';
import { FIXTURES } from './cli-helpers.js';
import { startTestServer } from './helpers.js';

// Structured output and tool calls with the official OpenAI client against a live `nerva serve`
// (CPU), on the embedded model and on a fixture model: tiny-random-qwen3's shape with Qwen3's
// real tokenizer (151,936 ids) and chat template, random weights written here. Every string in
// the schemas is length-bounded: a model that never closes a string would otherwise end at
// max_tokens, which is a valid outcome ('length') but not a parseable one.

const S = (maxLength: number) => ({ type: 'string', maxLength });

/** 20 schemas: nested objects, enums, arrays, numbers, required and optional properties. */
const SCHEMAS: Record<string, Record<string, unknown>> = {
  flat: { type: 'object', properties: { name: S(8), age: { type: 'integer', minimum: 0, maximum: 130 } }, required: ['name', 'age'], additionalProperties: false },
  optional: { type: 'object', properties: { name: S(6), nick: S(4), admin: { type: 'boolean' } }, required: ['name'], additionalProperties: false },
  enums: { type: 'object', properties: { color: { enum: ['red', 'green', 'blue'] }, size: { enum: ['S', 'M', 'L', 'XL'] } }, required: ['color', 'size'], additionalProperties: false },
  numbers: { type: 'object', properties: { x: { type: 'number' }, y: { type: 'number' }, n: { type: 'integer', minimum: -5, maximum: 5 } }, required: ['x', 'y', 'n'], additionalProperties: false },
  arrayOfInts: { type: 'object', properties: { xs: { type: 'array', items: { type: 'integer', minimum: 0, maximum: 9 }, maxItems: 4 } }, required: ['xs'], additionalProperties: false },
  arrayOfStrings: { type: 'object', properties: { tags: { type: 'array', items: S(5), minItems: 1, maxItems: 3 } }, required: ['tags'], additionalProperties: false },
  nested: {
    type: 'object',
    properties: { user: { type: 'object', properties: { id: { type: 'integer', minimum: 1, maximum: 999 }, name: S(6) }, required: ['id', 'name'], additionalProperties: false } },
    required: ['user'],
    additionalProperties: false,
  },
  deep: {
    type: 'object',
    properties: {
      a: { type: 'object', properties: { b: { type: 'object', properties: { c: { type: 'boolean' } }, required: ['c'], additionalProperties: false } }, required: ['b'], additionalProperties: false },
    },
    required: ['a'],
    additionalProperties: false,
  },
  arrayOfObjects: {
    type: 'object',
    properties: { items: { type: 'array', items: { type: 'object', properties: { sku: S(4), qty: { type: 'integer', minimum: 1, maximum: 9 } }, required: ['sku', 'qty'], additionalProperties: false }, maxItems: 2 } },
    required: ['items'],
    additionalProperties: false,
  },
  booleans: { type: 'object', properties: { a: { type: 'boolean' }, b: { type: 'boolean' }, c: { type: 'boolean' } }, required: ['a', 'b', 'c'], additionalProperties: false },
  nullable: { type: 'object', properties: { v: { type: ['integer', 'null'], minimum: 0, maximum: 50 }, w: { anyOf: [S(3), { type: 'null' }] } }, required: ['v', 'w'], additionalProperties: false },
  anyOf: { type: 'object', properties: { id: { anyOf: [{ type: 'integer', minimum: 0, maximum: 99 }, S(4)] } }, required: ['id'], additionalProperties: false },
  constValue: { type: 'object', properties: { kind: { const: 'event' }, at: { type: 'integer', minimum: 0, maximum: 2359 } }, required: ['kind', 'at'], additionalProperties: false },
  enumInts: { type: 'object', properties: { level: { enum: [1, 2, 3] }, label: { enum: ['low', 'mid', 'high'] } }, required: ['level', 'label'], additionalProperties: false },
  tuple: { type: 'object', properties: { pt: { type: 'array', prefixItems: [{ type: 'integer', minimum: 0, maximum: 9 }, { type: 'integer', minimum: 0, maximum: 9 }], items: false } }, required: ['pt'], additionalProperties: false },
  refs: {
    type: 'object',
    $defs: { person: { type: 'object', properties: { name: S(5) }, required: ['name'], additionalProperties: false } },
    properties: { from: { $ref: '#/$defs/person' }, to: { $ref: '#/$defs/person' } },
    required: ['from', 'to'],
    additionalProperties: false,
  },
  matrix: { type: 'object', properties: { m: { type: 'array', items: { type: 'array', items: { type: 'integer', minimum: 0, maximum: 1 }, maxItems: 2 }, maxItems: 2 } }, required: ['m'], additionalProperties: false },
  mixedOptional: {
    type: 'object',
    properties: { title: S(8), year: { type: 'integer', minimum: 1500, maximum: 1700 }, genre: { enum: ['comedy', 'tragedy', 'history'] }, acts: { type: 'integer', minimum: 1, maximum: 5 } },
    required: ['title', 'genre'],
    additionalProperties: false,
  },
  topArray: { type: 'array', items: { enum: ['x', 'y', 'z'] }, minItems: 1, maxItems: 3 },
  scalars: { type: 'object', properties: { s: S(4), i: { type: 'integer', minimum: 0, maximum: 9 }, f: { type: 'number' }, b: { type: 'boolean' }, z: { type: 'null' } }, required: ['s', 'i', 'f', 'b', 'z'], additionalProperties: false },
};

// Draft 2020-12 (prefixItems, $defs), as OpenAI's structured outputs take.
const ajv = new Ajv2020({ strict: false });
const validators = Object.fromEntries(Object.entries(SCHEMAS).map(([k, v]) => [k, ajv.compile(v)]));

/** The fixture model: tiny-random-qwen3's shape with Qwen3's vocabulary, tokenizer and chat template. */
async function qwen3Fixture(dir: string): Promise<string> {
  const cfg = JSON.parse(await readFile(join(FIXTURES, 'models', 'tiny-random-qwen3', 'config.json'), 'utf8')) as Record<string, unknown>;
  const out = join(dir, 'tiny-qwen3-151k');
  await mkdir(out, { recursive: true });
  await writeSyntheticCheckpoint({ config: { ...cfg, vocab_size: 151936, tie_word_embeddings: true, eos_token_id: 151645, torch_dtype: 'bfloat16' }, outDir: out, seed: 3, dtype: 'bf16' });
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) await copyFile(join(FIXTURES, 'tokenizers', 'qwen3', f), join(out, f));
  return out;
}

interface Served {
  label: string;
  server: RunningServer;
  client: OpenAI;
  model: string;
}

const served: Served[] = [];
let tmp: string;

beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'nerva-structured-'));
  const fixture = await qwen3Fixture(tmp);
  for (const [label, over] of [
    ['embedded model', {}],
    ['tiny-random-qwen3 with the Qwen3 tokenizer', { model: fixture }],
  ] as const) {
    const server = await startTestServer({ ...over, maxNumSeqs: 16 });
    served.push({ label, server, client: new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 }), model: server.state.modelName });
  }
}, 240_000);

afterAll(async () => {
  for (const s of served) await s.server.shutdown();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

const names = Object.keys(SCHEMAS);

describe.each([0, 1])('model %i', (m) => {
  it('json_schema strict: 20 schemas, streamed and not: every response parses and validates (ajv)', async () => {
    const { client, model } = served[m];
    const messages = [{ role: 'user' as const, content: 'Answer in JSON.' }];
    const format = (name: string) => ({ type: 'json_schema' as const, json_schema: { name, schema: SCHEMAS[name], strict: true } });
    // top_k (vLLM's field) keeps the CPU reference sampler from sorting 151,936 candidates a token.
    const sampling = { max_tokens: 160, temperature: 1, top_k: 50 } as Record<string, number>;
    const plain = names.map(async (name, i) => {
      const r = await client.chat.completions.create({ model, messages, ...sampling, seed: 100 + i, response_format: format(name) });
      return { name, text: r.choices[0].message.content ?? '', finish: r.choices[0].finish_reason };
    });
    const streamed = names.map(async (name, i) => {
      const s = await client.chat.completions.create({ model, messages, ...sampling, seed: 100 + i, response_format: format(name), stream: true });
      let text = '';
      let finish: string | null = null;
      for await (const c of s) {
        text += c.choices[0]?.delta.content ?? '';
        finish = c.choices[0]?.finish_reason ?? finish;
      }
      return { name, text, finish };
    });
    const results = await Promise.all([...plain, ...streamed]);
    for (const r of results) {
      expect(r.finish, `${r.name}: ${r.text}`).toBe('stop');
      const v: unknown = JSON.parse(r.text);
      expect(validators[r.name](v), `${r.name}: ${r.text} ${JSON.stringify(validators[r.name].errors)}`).toBe(true);
    }
    // Same seed, streamed or not: the same output.
    for (let i = 0; i < names.length; i++) expect(results[names.length + i].text).toBe(results[i].text);
  }, 240_000);

  it("tools with tool_choice required: tool_calls whose arguments validate, finish_reason tool_calls; streamed as deltas too", async () => {
    const { client, model } = served[m];
    const weather = { type: 'object', properties: { city: S(10), unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'], additionalProperties: false };
    const sum = { type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 99 }, b: { type: 'integer', minimum: 0, maximum: 99 } }, required: ['a', 'b'], additionalProperties: false };
    const tools = [
      { type: 'function' as const, function: { name: 'get_weather', description: 'Weather in a city', parameters: weather } },
      { type: 'function' as const, function: { name: 'add', description: 'Add two numbers', parameters: sum } },
    ];
    const check = { get_weather: ajv.compile(weather), add: ajv.compile(sum) } as Record<string, ReturnType<typeof ajv.compile>>;
    for (const seed of [1, 2, 3]) {
      // One call (parallel_tool_calls false): a model that keeps calling would otherwise run to max_tokens.
      const req = { model, messages: [{ role: 'user' as const, content: 'Weather in Verona?' }], tools, tool_choice: 'required' as const, parallel_tool_calls: false, max_tokens: 200, temperature: 1, seed };
      const r = await client.chat.completions.create(req);
      const c = r.choices[0];
      expect(c.finish_reason, JSON.stringify(c.message)).toBe('tool_calls');
      expect(c.message.tool_calls!.length).toBeGreaterThan(0);
      for (const call of c.message.tool_calls!) {
        expect(call.type).toBe('function');
        expect(call.id).toMatch(/^call_/);
        const fn = (call as { function: { name: string; arguments: string } }).function;
        expect(check[fn.name](JSON.parse(fn.arguments)), fn.arguments).toBe(true);
      }
      // Streamed: the calls arrive as tool_calls deltas and add up to the same calls.
      const s = await client.chat.completions.create({ ...req, stream: true });
      const calls: { name: string; arguments: string }[] = [];
      let finish: string | null = null;
      for await (const chunk of s) {
        for (const d of chunk.choices[0]?.delta.tool_calls ?? []) {
          calls[d.index] ??= { name: '', arguments: '' };
          calls[d.index].name += d.function?.name ?? '';
          calls[d.index].arguments += d.function?.arguments ?? '';
        }
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
      expect(finish).toBe('tool_calls');
      expect(calls).toEqual(c.message.tool_calls!.map((x) => ({ name: (x as { function: { name: string } }).function.name, arguments: (x as { function: { arguments: string } }).function.arguments })));
    }
    // Parallel calls: every complete call validates (a model that keeps calling may reach max_tokens).
    const par = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Weather in Verona and 2 + 2?' }], tools, tool_choice: 'required', max_tokens: 160, temperature: 1, seed: 4 });
    expect(['tool_calls', 'length']).toContain(par.choices[0].finish_reason);
    if (par.choices[0].finish_reason === 'tool_calls') expect(par.choices[0].message.tool_calls!.length).toBeGreaterThan(0);
    for (const call of par.choices[0].message.tool_calls ?? []) {
      const f = (call as { function: { name: string; arguments: string } }).function;
      expect(check[f.name](JSON.parse(f.arguments)), f.arguments).toBe(true);
    }
    // A named function: only it is called, once when parallel_tool_calls is false.
    const named = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Add 2 and 3.' }], tools, tool_choice: { type: 'function', function: { name: 'add' } }, parallel_tool_calls: false, max_tokens: 200, temperature: 1, seed: 9 });
    const calls = named.choices[0].message.tool_calls!;
    expect(calls).toHaveLength(1);
    const fn = (calls[0] as { function: { name: string; arguments: string } }).function;
    expect(fn.name).toBe('add');
    expect(check.add(JSON.parse(fn.arguments))).toBe(true);
  }, 240_000);

  it('grammar requests batched with free requests leave the free ones the tokens they get alone', async () => {
    const { client, model } = served[m];
    const free = (seed: number) => client.completions.create({ model, prompt: 'ROMEO:', max_tokens: 10, temperature: 1, seed, ignore_eos: true, return_token_ids: true } as never) as Promise<OpenAI.Completion>;
    const ids = (r: OpenAI.Completion) => (r.choices[0] as unknown as { token_ids: number[] }).token_ids;
    const alone = [ids(await free(51)), ids(await free(52))];
    const constrained = () =>
      client.chat.completions.create({ model, messages: [{ role: 'user', content: 'JSON please' }], max_tokens: 120, temperature: 1, seed: 5, response_format: { type: 'json_schema', json_schema: { name: 'nested', schema: SCHEMAS.nested, strict: true } } });
    const [g1, f1, g2, f2] = await Promise.all([constrained(), free(51), constrained(), free(52)]);
    expect(ids(f1)).toEqual(alone[0]);
    expect(ids(f2)).toEqual(alone[1]);
    expect(validators.nested(JSON.parse(g1.choices[0].message.content!))).toBe(true);
    expect(g2.choices[0].message.content).toBe(g1.choices[0].message.content);
  }, 240_000);
});

describe('tool messages round-trip through the chat template', () => {
  it('assistant tool_calls and tool results render in the model template (Qwen3) and the request runs', async () => {
    const { server, client, model } = served[1];
    const tok = server.state.engine!.tokenizer!;
    const messages = [
      { role: 'user' as const, content: 'Weather in Verona?' },
      { role: 'assistant' as const, content: null, tool_calls: [{ id: 'call_1', type: 'function' as const, function: { name: 'get_weather', arguments: '{"city": "Verona"}' } }] },
      { role: 'tool' as const, tool_call_id: 'call_1', content: '{"temp": 21}' },
    ];
    const text = tok.applyChatTemplate(messages.map((x) => ({ ...x, content: x.content ?? '' })));
    expect(text).toContain('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Verona"}}\n</tool_call>');
    expect(text).toContain('<tool_response>\n{"temp": 21}\n</tool_response>');
    const r = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0 });
    expect(r.choices[0].message.role).toBe('assistant');
    expect(r.usage!.prompt_tokens).toBe(tok.encode(text, { addSpecialTokens: false }).length);
  });
});

describe('the other output constraints through the client', () => {
  it("json_object, vLLM's guided_choice, guided_regex, guided_grammar and guided_json", async () => {
    const { client, model } = served[0];
    const base = { model, messages: [{ role: 'user' as const, content: 'Speak.' }], max_tokens: 60, temperature: 1, seed: 4 };
    const obj = await client.chat.completions.create({ ...base, max_tokens: 200, response_format: { type: 'json_object' } });
    if (obj.choices[0].finish_reason === 'stop') expect(typeof JSON.parse(obj.choices[0].message.content!)).toBe('object');
    else expect(obj.choices[0].finish_reason).toBe('length');
    const choice = await client.chat.completions.create({ ...base, guided_choice: ['Montague', 'Capulet'] } as never);
    expect(['Montague', 'Capulet']).toContain((choice as OpenAI.ChatCompletion).choices[0].message.content);
    const rx = (await client.chat.completions.create({ ...base, guided_regex: '[A-Z][a-z]{1,5}, [0-9]{2}' } as never)) as OpenAI.ChatCompletion;
    expect(rx.choices[0].message.content).toMatch(/^[A-Z][a-z]{1,5}, [0-9]{2}$/);
    const gr = (await client.completions.create({ model, prompt: 'ROMEO:', max_tokens: 40, temperature: 1, seed: 2, guided_grammar: 'root ::= ("aye" | "nay") ("," " "? ("aye" | "nay")){0,3}' } as never)) as OpenAI.Completion;
    expect(gr.choices[0].text).toMatch(/^(aye|nay)(, ?(aye|nay)){0,3}$/);
    const gj = (await client.completions.create({ model, prompt: 'ROMEO:', max_tokens: 60, temperature: 1, seed: 2, guided_json: SCHEMAS.enums } as never)) as OpenAI.Completion;
    expect(validators.enums(JSON.parse(gj.choices[0].text))).toBe(true);
  });
});
