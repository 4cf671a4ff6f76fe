import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../src/server.js';
import { MODEL, startTestServer } from './helpers.js';

// The request fields of issue 41's point 4 and the structured-output and tool fields: each
// accepted as vLLM takes it or refused by name, and each malformed value a 400 in OpenAI's shape
// naming the field. No field is ignored: one the server does not take is refused by name.

let server: RunningServer;
let client: OpenAI;
beforeAll(async () => {
  server = await startTestServer();
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
afterAll(async () => {
  await server?.shutdown();
});

async function post(path: string, body: Record<string, unknown>) {
  const r = await fetch(server.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, json: (await r.json()) as { error?: { message: string; type: string; param: string | null; code: string | null } } & Record<string, any> };
}

const chat = (extra: Record<string, unknown>) => ({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, ...extra });
const cmpl = (extra: Record<string, unknown>) => ({ model: MODEL, prompt: 'ROMEO:', max_tokens: 2, ...extra });
const tool = (name: string, parameters: unknown = { type: 'object', properties: {} }) => ({ type: 'function', function: { name, parameters } });

describe('malformed new fields: a 400 in OpenAI shape naming the field', () => {
  const C = '/v1/chat/completions';
  const P = '/v1/completions';
  const cases: [string, string, Record<string, unknown>, string, RegExp?][] = [
    ['logit_bias not an object', P, cmpl({ logit_bias: [1, 2] }), 'logit_bias'],
    ['logit_bias key not an id', C, chat({ logit_bias: { '-3': 1 } }), 'logit_bias'],
    ['logit_bias value a string', P, cmpl({ logit_bias: { '5': 'up' } }), 'logit_bias'],
    ['logit_bias value out of range', P, cmpl({ logit_bias: { '5': 150 } }), 'logit_bias'],
    ['logit_bias id past the vocabulary', P, cmpl({ logit_bias: { '99999': 1 } }), 'logit_bias'],
    ['echo not a boolean', P, cmpl({ echo: 'yes' }), 'echo'],
    ['echo on chat (not taken there)', C, chat({ echo: true }), 'echo', /not supported/],
    ['best_of not an integer', P, cmpl({ best_of: 1.5 }), 'best_of'],
    ['best_of other than n', P, cmpl({ best_of: 3, n: 1 }), 'best_of', /not supported/],
    ['seed a float', P, cmpl({ seed: 1.25 }), 'seed'],
    ['seed a string', C, chat({ seed: '7' }), 'seed'],
    ['stream_options not an object', C, chat({ stream: true, stream_options: true }), 'stream_options'],
    ['stream_options.include_usage not a boolean', C, chat({ stream: true, stream_options: { include_usage: 'yes' } }), 'include_usage'],
    ['stream_options without stream', C, chat({ stream_options: { include_usage: true } }), 'stream_options'],
    ['max_completion_tokens a float', C, chat({ max_completion_tokens: 2.5 }), 'max_completion_tokens'],
    ['max_completion_tokens zero', C, chat({ max_completion_tokens: 0 }), 'max_completion_tokens'],
    ['max_completion_tokens on completions', P, cmpl({ max_completion_tokens: 3 }), 'max_completion_tokens', /not supported/],
    ['suffix', P, cmpl({ suffix: 'end' }), 'suffix', /not supported/],
    ['response_format not an object', C, chat({ response_format: 'json' }), 'response_format'],
    ['response_format unknown type', C, chat({ response_format: { type: 'xml' } }), 'response_format.type'],
    ['json_schema without name', C, chat({ response_format: { type: 'json_schema', json_schema: { schema: {} } } }), 'response_format.json_schema.name'],
    ['json_schema schema not an object', C, chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: 5 } } }), 'response_format.json_schema.schema'],
    ['json_schema strict a string', C, chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {}, strict: 'yes' } } }), 'response_format.json_schema.strict'],
    ['json_schema that does not compile', C, chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'frob' } } } }), 'response_format.json_schema.schema', /Unsupported type "frob"/],
    ['guided_json not JSON', P, cmpl({ guided_json: '{nope' }), 'guided_json'],
    ['guided_regex not a string', P, cmpl({ guided_regex: 5 }), 'guided_regex'],
    ['guided_regex that does not compile', P, cmpl({ guided_regex: '(unclosed' }), 'guided_regex'],
    ['guided_choice empty', P, cmpl({ guided_choice: [] }), 'guided_choice'],
    ['guided_grammar that does not compile', P, cmpl({ guided_grammar: 'root ::= missing' }), 'guided_grammar', /Rule "missing" is not defined/],
    ['structured_outputs with two kinds', P, cmpl({ structured_outputs: { regex: 'a', choice: ['b'] } }), 'structured_outputs'],
    ['two output constraints', P, cmpl({ guided_regex: 'a+', guided_choice: ['a'] }), 'guided_choice', /one output constraint/],
    ['a grammar with stop strings', P, cmpl({ guided_regex: 'a+', stop: ['x'] }), 'stop'],
    ['tools not an array', C, chat({ tools: { a: 1 } }), 'tools'],
    ['tool of another type', C, chat({ tools: [{ type: 'retrieval' }] }), 'tools[0].type'],
    ['tool name with spaces', C, chat({ tools: [tool('get weather')] }), 'tools[0].function.name'],
    ['tool parameters not an object', C, chat({ tools: [tool('f', 'x')] }), 'tools[0].function.parameters'],
    ['tool parameters that do not compile', C, chat({ tools: [tool('f', { type: 'frob' })], tool_choice: 'required' }), 'tool_choice', /Unsupported type "frob"/],
    ['tool_choice naming no tool', C, chat({ tools: [tool('f')], tool_choice: { type: 'function', function: { name: 'g' } } }), 'tool_choice.function.name'],
    ['tool_choice unknown value', C, chat({ tools: [tool('f')], tool_choice: 'always' }), 'tool_choice'],
    ['tool_choice without tools', C, chat({ tool_choice: 'required' }), 'tool_choice'],
    ['tool_choice required with a response_format', C, chat({ tools: [tool('f')], tool_choice: 'required', response_format: { type: 'json_object' } }), 'tool_choice'],
    ['parallel_tool_calls not a boolean', C, chat({ tools: [tool('f')], parallel_tool_calls: 'no' }), 'parallel_tool_calls'],
    [
      'assistant tool_call arguments not JSON',
      C,
      chat({ messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{x' } }] }] }),
      'messages[1].tool_calls[0].function.arguments',
    ],
    ['an unknown field', C, chat({ frobnicate: 1 }), 'frobnicate', /not supported/],
    ["OpenAI's deprecated functions", C, chat({ functions: [] }), 'functions', /not supported/],
    ["vLLM's use_beam_search", P, cmpl({ use_beam_search: true }), 'use_beam_search', /not supported/],
  ];
  it.each(cases)('%s', async (_name, path, body, param, msg) => {
    const r = await post(path, body);
    expect(r.status, JSON.stringify(r.json)).toBe(400);
    expect(Object.keys(r.json.error!).sort()).toEqual(['code', 'message', 'param', 'type']);
    expect(r.json.error!.type).toBe('invalid_request_error');
    expect(r.json.error!.param).toContain(param);
    if (msg) expect(r.json.error!.message).toMatch(msg);
  });
});

describe('the fields, accepted', () => {
  it('logit_bias moves the sampled tokens (100 forces one token)', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: 'ROMEO:', max_tokens: 3, temperature: 0.8, seed: 1, logit_bias: { '42': 100 }, return_token_ids: true } as never);
    expect(((r as OpenAI.Completion).choices[0] as unknown as { token_ids: number[] }).token_ids).toEqual([42, 42, 42]);
  });

  it('echo returns the prompt before the completion; with logprobs, the prompt tokens scored (the first without one)', async () => {
    const plain = await client.completions.create({ model: MODEL, prompt: 'ROMEO: What', max_tokens: 3, temperature: 0, ignore_eos: true } as never);
    const echoed = await client.completions.create({ model: MODEL, prompt: 'ROMEO: What', max_tokens: 3, temperature: 0, ignore_eos: true, echo: true, logprobs: 2 } as never);
    const p = (plain as OpenAI.Completion).choices[0];
    const e = (echoed as OpenAI.Completion).choices[0];
    expect(e.text).toBe(`ROMEO: What${p.text}`);
    const lp = e.logprobs!;
    expect(lp.tokens!.join('')).toBe(e.text);
    expect(lp.token_logprobs![0]).toBeNull();
    expect(lp.top_logprobs![0]).toBeNull();
    const n = lp.tokens!.length;
    for (let i = 1; i < n; i++) {
      expect(lp.token_logprobs![i]).toBeLessThanOrEqual(0);
      expect(Object.keys(lp.top_logprobs![i]!).length).toBeGreaterThanOrEqual(2);
    }
    expect(lp.text_offset).toEqual(lp.tokens!.map((_, i) => lp.tokens!.slice(0, i).join('').length));
    // The completion's own tokens (greedy) are the top alternative at their positions.
    for (let i = n - 3; i < n; i++) expect(lp.token_logprobs![i]).toBeCloseTo(Math.max(...Object.values(lp.top_logprobs![i]!)), 5);
    // Streamed: the prompt first, then the completion.
    const s = await client.completions.create({ model: MODEL, prompt: 'ROMEO: What', max_tokens: 3, temperature: 0, ignore_eos: true, echo: true, stream: true } as never);
    let text = '';
    for await (const c of s as unknown as AsyncIterable<OpenAI.Completion>) text += c.choices[0]?.text ?? '';
    expect(text).toBe(e.text);
  });

  it('seed per choice: choice i of n samples with seed + i; best_of equal to n is taken', async () => {
    const both = (await client.completions.create({ model: MODEL, prompt: 'ROMEO:', max_tokens: 6, temperature: 1, seed: 10, n: 2, best_of: 2, ignore_eos: true } as never)) as OpenAI.Completion;
    for (const i of [0, 1]) {
      const one = (await client.completions.create({ model: MODEL, prompt: 'ROMEO:', max_tokens: 6, temperature: 1, seed: 10 + i, ignore_eos: true } as never)) as OpenAI.Completion;
      expect(both.choices.find((c) => c.index === i)!.text).toBe(one.choices[0].text);
    }
  });

  it('max_completion_tokens caps a chat; stream_options.include_usage adds the usage chunk', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_completion_tokens: 3, temperature: 0, ignore_eos: true } as never);
    expect((r as OpenAI.ChatCompletion).usage!.completion_tokens).toBe(3);
    const s = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_completion_tokens: 3, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } } as never);
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const c of s as unknown as AsyncIterable<OpenAI.ChatCompletionChunk>) if (c.usage) usage = c.usage;
    expect(usage!.completion_tokens).toBe(3);
  });

  it('tool_choice auto with tools: no constraint, content returned; none leaves the tools out of the prompt', async () => {
    const tools = [tool('f')];
    const auto = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], tools, max_tokens: 4, temperature: 0 } as never);
    expect(typeof (auto as OpenAI.ChatCompletion).choices[0].message.content).toBe('string');
    const none = (await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], tools, tool_choice: 'none', max_tokens: 4, temperature: 0 } as never)) as OpenAI.ChatCompletion;
    const bare = (await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0 } as never)) as OpenAI.ChatCompletion;
    expect(none.usage!.prompt_tokens).toBe(bare.usage!.prompt_tokens);
    expect(none.choices[0].message.content).toBe(bare.choices[0].message.content);
  });
});
