import { InvalidParamsError } from '../sampling-params.js';

/**
 * What a constrained request's output must match (constrained decoding). Every kind compiles to
 * one XGrammar grammar; the engine masks each step's logits with the tokens it allows next.
 *
 * - `json_schema`: a JSON Schema (an object, `true`/`false`, or its JSON text). `strict` (default
 *   true) allows no property or item the schema does not name, as OpenAI's strict mode.
 * - `json_object`: any JSON object (OpenAI's `response_format: {type: 'json_object'}`).
 * - `regex`: the whole output matches the regular expression.
 * - `choice`: the output is exactly one of the strings.
 * - `grammar`: an EBNF grammar (XGrammar's EBNF, which takes GBNF: `root ::= ...`, `|`, `*`, `+`,
 *   `?`, `{m,n}`, character classes, `#` comments); `root` names its start rule.
 * - `structural_tag`: an XGrammar structural tag's `format` (tool calls are built as one).
 *
 * JSON is generated without free whitespace: `{"a": 1, "b": [2, 3]}` (Python's json.dumps
 * separators), so a model cannot pad the output with whitespace instead of closing it.
 */
export type GrammarSpec =
  | { type: 'json_schema'; schema: Record<string, unknown> | boolean | string; strict?: boolean }
  | { type: 'json_object' }
  | { type: 'regex'; pattern: string }
  | { type: 'choice'; choices: string[] }
  | { type: 'grammar'; grammar: string; root?: string }
  | { type: 'structural_tag'; format: Record<string, unknown> };

/** The request options that constrain the output (GenerateOptions' part of them). */
export interface GrammarOptions {
  /** A grammar of any kind, or EBNF/GBNF text (`root` is the start rule). */
  grammar?: GrammarSpec | string;
  /** Shorthand for `grammar: { type: 'json_schema', schema }` (strict). */
  jsonSchema?: Record<string, unknown> | boolean;
}

/** Bounds on a grammar's size, checked before anything compiles it. */
export const GRAMMAR_LIMITS = { textChars: 200_000, choices: 1024 } as const;

/**
 * The grammar a request asked for, checked for shape (throws InvalidParamsError naming `param`,
 * default 'grammar'); undefined when it asked for none. Whether the grammar itself is valid is
 * XGrammar's to say (checkGrammar, or the engine when it compiles it).
 */
export function grammarOf(o: GrammarOptions, param = 'grammar'): GrammarSpec | undefined {
  if (o.grammar !== undefined && o.grammar !== null && o.jsonSchema !== undefined && o.jsonSchema !== null) {
    throw new InvalidParamsError(param, 'give either grammar or jsonSchema, not both');
  }
  if (o.jsonSchema !== undefined && o.jsonSchema !== null) return normalizeGrammar({ type: 'json_schema', schema: o.jsonSchema }, 'json_schema');
  if (o.grammar === undefined || o.grammar === null) return undefined;
  if (typeof o.grammar === 'string') return normalizeGrammar({ type: 'grammar', grammar: o.grammar }, param);
  return normalizeGrammar(o.grammar, param);
}

/** A copy of `g` in canonical form (schemas as JSON text), or InvalidParamsError naming `param`. */
export function normalizeGrammar(g: unknown, param: string): GrammarSpec {
  const bad = (why: string): never => {
    throw new InvalidParamsError(param, why);
  };
  if (g === null || typeof g !== 'object' || Array.isArray(g)) bad('must be an object with a type');
  const s = g as Record<string, unknown>;
  const text = (k: string, v: unknown): string => {
    if (typeof v !== 'string' || v.length === 0) bad(`${k} must be a non-empty string`);
    if ((v as string).length > GRAMMAR_LIMITS.textChars) bad(`${k} is longer than ${GRAMMAR_LIMITS.textChars} characters`);
    return v as string;
  };
  switch (s.type) {
    case 'json_schema': {
      const schema = s.schema;
      let json: string;
      if (typeof schema === 'string') {
        try {
          JSON.parse(schema);
        } catch (e) {
          bad(`schema is not JSON: ${(e as Error).message}`);
        }
        json = schema;
      } else if (typeof schema === 'boolean' || (schema !== null && typeof schema === 'object' && !Array.isArray(schema))) json = JSON.stringify(schema);
      else return bad('schema must be a JSON Schema (an object or a boolean)');
      if (json.length > GRAMMAR_LIMITS.textChars) bad(`schema is longer than ${GRAMMAR_LIMITS.textChars} characters`);
      if (s.strict !== undefined && s.strict !== null && typeof s.strict !== 'boolean') bad('strict must be a boolean');
      return { type: 'json_schema', schema: json, strict: (s.strict as boolean | undefined | null) ?? true };
    }
    case 'json_object':
      return { type: 'json_object' };
    case 'regex':
      return { type: 'regex', pattern: text('pattern', s.pattern) };
    case 'choice': {
      const c = s.choices;
      if (!Array.isArray(c) || c.length === 0 || c.some((x) => typeof x !== 'string' || x.length === 0)) bad('choices must be a non-empty array of non-empty strings');
      if ((c as string[]).length > GRAMMAR_LIMITS.choices) bad(`at most ${GRAMMAR_LIMITS.choices} choices`);
      text('choices', (c as string[]).join(''));
      return { type: 'choice', choices: [...(c as string[])] };
    }
    case 'grammar': {
      const root = s.root ?? 'root';
      if (typeof root !== 'string' || !/^[A-Za-z_][A-Za-z0-9_-]*$/.test(root)) bad('root must be a rule name');
      return { type: 'grammar', grammar: text('grammar', s.grammar), root: root as string };
    }
    case 'structural_tag': {
      const f = s.format;
      if (f === null || typeof f !== 'object' || Array.isArray(f)) bad('format must be an object');
      text('format', JSON.stringify(f));
      return { type: 'structural_tag', format: f as Record<string, unknown> };
    }
    default:
      return bad(`type must be one of json_schema, json_object, regex, choice, grammar, structural_tag; got ${JSON.stringify(s.type)}`);
  }
}

/** A key equal for equal grammars (normalized specs): the compile cache's. */
export function grammarKey(g: GrammarSpec): string {
  return JSON.stringify(g);
}

