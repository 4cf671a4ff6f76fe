import { randomUUID } from 'node:crypto';
import type { GrammarSpec } from '@nerva/engine';
import { badRequest } from './errors.js';

/** One function of a request's `tools`. */
export interface ToolFunction {
  name: string;
  description?: string;
  /** JSON Schema of the arguments object (absent: any object). */
  parameters?: Record<string, unknown>;
}

/** `tool_choice`: none, auto, required, or one named function. */
export type ToolChoice = { kind: 'none' } | { kind: 'auto' } | { kind: 'required' } | { kind: 'function'; name: string };

/** A request's tools, as parsed from its body. */
export interface ToolRequest {
  /** The `tools` array as given (what the chat template renders). */
  raw: unknown[];
  functions: ToolFunction[];
  choice: ToolChoice;
  parallel: boolean;
}

/**
 * How a model writes tool calls:
 * - `hermes` (Qwen2.5/Qwen3, Hermes): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one per call.
 * - `llama3_json` (Llama 3.1+): a JSON object `{"name": ..., "parameters": {...}}` as the whole
 *   output (after `<|python_tag|>` where the model writes it), calls separated by `; `.
 */
export type ToolFormat = 'hermes' | 'llama3_json';

/** The format a chat template teaches its model (Llama 3's names `parameters` and ipython; Hermes otherwise). */
export function toolFormatOf(template: string | undefined): ToolFormat {
  if (template === undefined) return 'hermes';
  if (template.includes('<tool_call>')) return 'hermes';
  if (template.includes('<|python_tag|>') || (template.includes('ipython') && template.includes('"parameters"'))) return 'llama3_json';
  return 'hermes';
}

type Body = Record<string, unknown>;
const isObject = (v: unknown): v is Body => typeof v === 'object' && v !== null && !Array.isArray(v);
const NAME = /^[A-Za-z0-9_-]{1,64}$/;

/** `tools`, `tool_choice` and `parallel_tool_calls` of a chat body (400s name the field); undefined without tools. */
export function readTools(body: Body): ToolRequest | undefined {
  const tools = body.tools;
  const choice = body.tool_choice;
  const parallel = body.parallel_tool_calls;
  if (parallel !== undefined && parallel !== null && typeof parallel !== 'boolean') throw badRequest(`'parallel_tool_calls' must be a boolean`, 'parallel_tool_calls');
  if (tools === undefined || tools === null) {
    if (choice !== undefined && choice !== null && choice !== 'none') throw badRequest(`'tool_choice' needs 'tools'`, 'tool_choice');
    return undefined;
  }
  if (!Array.isArray(tools)) throw badRequest(`'tools' must be an array`, 'tools');
  if (tools.length > 128) throw badRequest(`'tools' holds at most 128 functions`, 'tools');
  const functions = tools.map((t, i): ToolFunction => {
    const p = `tools[${i}]`;
    if (!isObject(t) || t.type !== 'function') throw badRequest(`'${p}' must be {"type": "function", "function": {...}}`, `${p}.type`);
    const f = t.function;
    if (!isObject(f)) throw badRequest(`'${p}.function' must be an object`, `${p}.function`);
    if (typeof f.name !== 'string' || !NAME.test(f.name)) throw badRequest(`'${p}.function.name' must be 1-64 letters, digits, '_' or '-'`, `${p}.function.name`);
    if (f.description !== undefined && typeof f.description !== 'string') throw badRequest(`'${p}.function.description' must be a string`, `${p}.function.description`);
    if (f.parameters !== undefined && f.parameters !== null && !isObject(f.parameters)) throw badRequest(`'${p}.function.parameters' must be a JSON Schema object`, `${p}.function.parameters`);
    const out: ToolFunction = { name: f.name };
    if (typeof f.description === 'string') out.description = f.description;
    if (isObject(f.parameters)) out.parameters = f.parameters;
    return out;
  });
  const names = new Set<string>();
  functions.forEach((f, i) => {
    if (names.has(f.name)) throw badRequest(`'tools[${i}].function.name' ${f.name} is given twice`, `tools[${i}].function.name`);
    names.add(f.name);
  });
  let c: ToolChoice;
  if (choice === undefined || choice === null || choice === 'auto') c = { kind: 'auto' };
  else if (choice === 'none' || choice === 'required') c = { kind: choice };
  else if (isObject(choice) && choice.type === 'function' && isObject(choice.function) && typeof choice.function.name === 'string') {
    if (!names.has(choice.function.name)) throw badRequest(`'tool_choice.function.name' ${choice.function.name} is not one of the tools`, 'tool_choice.function.name');
    c = { kind: 'function', name: choice.function.name };
  } else throw badRequest(`'tool_choice' must be 'none', 'auto', 'required' or {"type": "function", "function": {"name": ...}}`, 'tool_choice');
  if (functions.length === 0 && (c.kind === 'required' || c.kind === 'auto')) {
    if (c.kind === 'required') throw badRequest(`'tool_choice' required needs at least one tool`, 'tool_choice');
  }
  return { raw: tools, functions, choice: c, parallel: parallel ?? true };
}

/** The text a call of `f` begins and ends with in `format`, its arguments in between. */
function callTags(format: ToolFormat, name: string): { begin: string; end: string } {
  const n = JSON.stringify(name);
  return format === 'hermes' ? { begin: `<tool_call>\n{"name": ${n}, "arguments": `, end: '}\n</tool_call>' } : { begin: `{"name": ${n}, "parameters": `, end: '}' };
}

/**
 * The grammar that makes the model call tools (tool_choice required or a named function): one
 * call or more (one when parallel_tool_calls is false) of the allowed functions in the model's
 * format, each one's arguments valid against its parameters schema. Undefined for auto and none,
 * whose output is free (and parsed for calls afterwards).
 */
export function toolGrammar(t: ToolRequest, format: ToolFormat): GrammarSpec | undefined {
  if (t.choice.kind === 'none' || t.choice.kind === 'auto') return undefined;
  const named = t.choice.kind === 'function' ? t.choice.name : undefined;
  const fns = named === undefined ? t.functions : t.functions.filter((f) => f.name === named);
  const tags = fns.map((f) => ({ type: 'tag', ...callTags(format, f.name), content: { type: 'json_schema', json_schema: f.parameters ?? { type: 'object' } } }));
  const separator = format === 'hermes' ? '\n' : '; ';
  return { type: 'structural_tag', format: { type: 'tags_with_separator', tags, separator, at_least_one: true, stop_after_first: !t.parallel } };
}

/** One call in OpenAI's shape. */
export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/** A generated text split into content and tool calls. */
export interface ParsedOutput {
  content: string | null;
  calls: ToolCall[];
}

const callId = () => `call_${randomUUID().replaceAll('-', '').slice(0, 24)}`;

/** A call object the model wrote: its name and arguments (an object), or undefined when it is not one. */
function asCall(v: unknown, argsKey: 'arguments' | 'parameters'): ToolCall | undefined {
  if (!isObject(v) || typeof v.name !== 'string') return undefined;
  const args = v[argsKey] ?? v.arguments ?? {};
  if (!isObject(args)) return undefined;
  return { id: callId(), type: 'function', function: { name: v.name, arguments: JSON.stringify(args) } };
}

const OPEN = '<tool_call>';
const CLOSE = '</tool_call>';

/**
 * Split a finished output into content and tool calls. Hermes: every `<tool_call>...</tool_call>`
 * whose JSON parses is a call, the text around them is the content (null when only whitespace);
 * one that does not parse stays in the content. Llama 3: the whole output (after `<|python_tag|>`)
 * is `;`-separated call objects, or it is all content.
 */
export function parseToolCalls(text: string, format: ToolFormat): ParsedOutput {
  const calls: ToolCall[] = [];
  if (format === 'llama3_json') {
    const body = text.replace(/^\s*<\|python_tag\|>/, '').trim();
    const objs = splitJsonObjects(body);
    const parsed = objs?.map((o) => asCall(o, 'parameters'));
    if (parsed && parsed.length > 0 && parsed.every((c) => c !== undefined)) return { content: null, calls: parsed as ToolCall[] };
    return { content: text, calls };
  }
  let content = '';
  let at = 0;
  for (;;) {
    const open = text.indexOf(OPEN, at);
    if (open < 0) break;
    const close = text.indexOf(CLOSE, open + OPEN.length);
    if (close < 0) break;
    let call: ToolCall | undefined;
    try {
      call = asCall(JSON.parse(text.slice(open + OPEN.length, close)), 'arguments');
    } catch {
      call = undefined;
    }
    if (call) {
      content += text.slice(at, open);
      calls.push(call);
    } else content += text.slice(at, close + CLOSE.length);
    at = close + CLOSE.length;
  }
  content += text.slice(at);
  if (calls.length === 0) return { content: text, calls };
  const trimmed = content.trim();
  return { content: trimmed.length > 0 ? trimmed : null, calls };
}

/** `;`-separated JSON objects making up all of `s`, or undefined. */
function splitJsonObjects(s: string): unknown[] | undefined {
  const out: unknown[] = [];
  let i = 0;
  while (i < s.length) {
    while (i < s.length && /\s/.test(s[i])) i++;
    if (s[i] !== '{') return undefined;
    const end = jsonObjectEnd(s, i);
    if (end < 0) return undefined;
    try {
      out.push(JSON.parse(s.slice(i, end)));
    } catch {
      return undefined;
    }
    i = end;
    while (i < s.length && /\s/.test(s[i])) i++;
    if (i < s.length) {
      if (s[i] !== ';') return undefined;
      i++;
    }
  }
  return out;
}

/** Index just past the JSON object starting at `start` (braces matched outside strings), or -1. */
function jsonObjectEnd(s: string, start: number): number {
  let depth = 0;
  let inStr = false;
  for (let i = start; i < s.length; i++) {
    const c = s[i];
    if (inStr) {
      if (c === '\\') i++;
      else if (c === '"') inStr = false;
    } else if (c === '"') inStr = true;
    else if (c === '{') depth++;
    else if (c === '}' && --depth === 0) return i + 1;
  }
  return -1;
}

/** What a streamed piece of output becomes: content to send, and calls completed by it. */
export interface StreamDelta {
  content: string;
  calls: ToolCall[];
}

/**
 * Tool calls out of a token stream, for streamed responses. Hermes: content streams as it comes
 * except text that may begin `<tool_call>` (held back until it cannot); a call is sent whole once
 * its `</tool_call>` arrives. Llama 3: an output that begins with `{` or `<|python_tag|>` is held
 * to the end and parsed as calls (else sent as content), any other streams as content.
 */
export class ToolCallStream {
  private buf = '';
  private mode: 'undecided' | 'content' | 'json' = 'undecided';
  readonly calls: ToolCall[] = [];

  constructor(private readonly format: ToolFormat) {}

  push(text: string): StreamDelta {
    this.buf += text;
    return this.format === 'hermes' ? this.hermes(false) : this.llama(false);
  }

  /** The end of the output: whatever is held back, as content or calls. */
  finish(): StreamDelta {
    return this.format === 'hermes' ? this.hermes(true) : this.llama(true);
  }

  private hermes(end: boolean): StreamDelta {
    let content = '';
    const calls: ToolCall[] = [];
    for (;;) {
      const open = this.buf.indexOf(OPEN);
      if (open < 0) {
        // Hold back a tail that could start "<tool_call>".
        const keep = end ? 0 : partialPrefix(this.buf, OPEN);
        content += this.buf.slice(0, this.buf.length - keep);
        this.buf = this.buf.slice(this.buf.length - keep);
        break;
      }
      const close = this.buf.indexOf(CLOSE, open + OPEN.length);
      if (close < 0) {
        content += this.buf.slice(0, open);
        this.buf = this.buf.slice(open);
        if (end) {
          content += this.buf;
          this.buf = '';
        }
        break;
      }
      let call: ToolCall | undefined;
      try {
        call = asCall(JSON.parse(this.buf.slice(open + OPEN.length, close)), 'arguments');
      } catch {
        call = undefined;
      }
      content += this.buf.slice(0, open);
      if (call) calls.push(call);
      else content += this.buf.slice(open, close + CLOSE.length);
      this.buf = this.buf.slice(close + CLOSE.length);
    }
    this.calls.push(...calls);
    // Whitespace between calls is no content.
    return { content: this.calls.length > 0 && content.trim() === '' ? '' : content, calls };
  }

  private llama(end: boolean): StreamDelta {
    if (this.mode === 'undecided') {
      const s = this.buf.trimStart();
      if (s.length === 0 && !end) return { content: '', calls: [] };
      if (s.startsWith('{') || s.startsWith('<|python_tag|>')) this.mode = 'json';
      else if ('<|python_tag|>'.startsWith(s) && !end) return { content: '', calls: [] };
      else this.mode = 'content';
    }
    if (this.mode === 'content') {
      const content = this.buf;
      this.buf = '';
      return { content, calls: [] };
    }
    if (!end) return { content: '', calls: [] };
    const p = parseToolCalls(this.buf, 'llama3_json');
    this.buf = '';
    this.calls.push(...p.calls);
    return { content: p.content ?? '', calls: p.calls };
  }
}

/** Length of the longest suffix of `s` that is a proper prefix of `tag`. */
function partialPrefix(s: string, tag: string): number {
  for (let k = Math.min(tag.length - 1, s.length); k > 0; k--) if (s.endsWith(tag.slice(0, k))) return k;
  return 0;
}

/**
 * Chat messages as the template takes them: an assistant message's tool_calls checked (their
 * arguments must be JSON text) and its null content made empty (templates test it as a string),
 * a tool message's tool_call_id a string. 400s name the field.
 */
export function checkToolMessages(messages: Body[]): void {
  messages.forEach((m, i) => {
    const p = `messages[${i}]`;
    if (m.role === 'assistant' && m.tool_calls !== undefined && m.tool_calls !== null) {
      if (!Array.isArray(m.tool_calls)) throw badRequest(`'${p}.tool_calls' must be an array`, `${p}.tool_calls`);
      m.tool_calls.forEach((c: unknown, j: number) => {
        const q = `${p}.tool_calls[${j}]`;
        if (!isObject(c) || !isObject(c.function)) throw badRequest(`'${q}' must be {"id", "type": "function", "function": {"name", "arguments"}}`, q);
        if (c.type !== undefined && c.type !== 'function') throw badRequest(`'${q}.type' must be 'function'`, `${q}.type`);
        if (typeof c.function.name !== 'string' || c.function.name.length === 0) throw badRequest(`'${q}.function.name' must be a non-empty string`, `${q}.function.name`);
        const args = c.function.arguments;
        if (typeof args !== 'string') throw badRequest(`'${q}.function.arguments' must be a string of JSON`, `${q}.function.arguments`);
        try {
          JSON.parse(args);
        } catch {
          throw badRequest(`'${q}.function.arguments' is not JSON`, `${q}.function.arguments`);
        }
      });
      if (m.content === null) m.content = '';
    }
    if (m.role === 'tool' && m.tool_call_id !== undefined && typeof m.tool_call_id !== 'string') throw badRequest(`'${p}.tool_call_id' must be a string`, `${p}.tool_call_id`);
  });
}
