import { checkGrammar, type GrammarSpec, InvalidParamsError, normalizeGrammar } from '@nerva/engine';
import { badRequest } from './errors.js';

/** A request's output constraint: the grammar, and the field that asked for it (errors name it). */
export interface RequestGrammar {
  spec: GrammarSpec;
  field: string;
}

type Body = Record<string, unknown>;

const isObject = (v: unknown): v is Body => typeof v === 'object' && v !== null && !Array.isArray(v);

/** normalizeGrammar with its InvalidParamsError as a 400 naming `field`. */
function spec(g: unknown, field: string): GrammarSpec {
  try {
    return normalizeGrammar(g, field);
  } catch (e) {
    if (e instanceof InvalidParamsError) throw badRequest(e.message, field);
    throw e;
  }
}

/** OpenAI's `response_format`: text (no constraint), json_object, json_schema {name, schema, strict}. */
function responseFormat(v: unknown): GrammarSpec | undefined {
  if (!isObject(v)) throw badRequest(`'response_format' must be an object with a type`, 'response_format');
  switch (v.type) {
    case 'text':
      return undefined;
    case 'json_object':
      return spec({ type: 'json_object' }, 'response_format');
    case 'json_schema': {
      const js = v.json_schema;
      if (!isObject(js)) throw badRequest(`'response_format.json_schema' must be an object with name and schema`, 'response_format.json_schema');
      if (typeof js.name !== 'string' || !/^[A-Za-z0-9_-]{1,64}$/.test(js.name)) {
        throw badRequest(`'response_format.json_schema.name' must be 1-64 letters, digits, '_' or '-'`, 'response_format.json_schema.name');
      }
      if (js.strict !== undefined && js.strict !== null && typeof js.strict !== 'boolean') throw badRequest(`'response_format.json_schema.strict' must be a boolean`, 'response_format.json_schema.strict');
      // No schema: any JSON object, as OpenAI's json_object.
      if (js.schema === undefined || js.schema === null) return spec({ type: 'json_object' }, 'response_format');
      if (!isObject(js.schema)) throw badRequest(`'response_format.json_schema.schema' must be a JSON Schema object`, 'response_format.json_schema.schema');
      return spec({ type: 'json_schema', schema: js.schema, strict: js.strict ?? false }, 'response_format.json_schema.schema');
    }
    default:
      throw badRequest(`'response_format.type' must be 'text', 'json_object' or 'json_schema', got ${JSON.stringify(v.type)}`, 'response_format.type');
  }
}

/** vLLM's guided_* fields (and its newer structured_outputs object), each as a grammar. */
const GUIDED: Record<string, (v: unknown, field: string) => GrammarSpec> = {
  guided_json: (v, field) => {
    if (typeof v === 'string') {
      try {
        return spec({ type: 'json_schema', schema: JSON.parse(v) as unknown }, field);
      } catch (e) {
        if (e instanceof SyntaxError) throw badRequest(`'${field}' is not JSON: ${e.message}`, field);
        throw e;
      }
    }
    if (!isObject(v) && typeof v !== 'boolean') throw badRequest(`'${field}' must be a JSON Schema (an object, or its JSON text)`, field);
    return spec({ type: 'json_schema', schema: v }, field);
  },
  guided_regex: (v, field) => {
    if (typeof v !== 'string') throw badRequest(`'${field}' must be a string`, field);
    return spec({ type: 'regex', pattern: v }, field);
  },
  guided_choice: (v, field) => {
    if (!Array.isArray(v)) throw badRequest(`'${field}' must be an array of strings`, field);
    return spec({ type: 'choice', choices: v }, field);
  },
  guided_grammar: (v, field) => {
    if (typeof v !== 'string') throw badRequest(`'${field}' must be a string (an EBNF/GBNF grammar)`, field);
    return spec({ type: 'grammar', grammar: v }, field);
  },
};

/** structured_outputs' keys and the guided_* field each one is. */
const STRUCTURED: Record<string, string> = { json: 'guided_json', regex: 'guided_regex', choice: 'guided_choice', grammar: 'guided_grammar' };

/** Every request field that constrains the output. */
export const GRAMMAR_FIELDS = ['response_format', 'structured_outputs', ...Object.keys(GUIDED)] as const;

/**
 * The output constraint of a request body: at most one of response_format (json_object,
 * json_schema), vLLM's guided_json / guided_regex / guided_choice / guided_grammar, or
 * structured_outputs {json | regex | choice | grammar | json_object}. Throws a 400 naming the field.
 */
export function readGrammar(body: Body): RequestGrammar | undefined {
  const found: RequestGrammar[] = [];
  for (const field of GRAMMAR_FIELDS) {
    const v = body[field];
    if (v === undefined || v === null) continue;
    if (field === 'response_format') {
      const g = responseFormat(v);
      // A schema that does not compile is the schema's fault.
      if (g) found.push({ spec: g, field: g.type === 'json_schema' ? 'response_format.json_schema.schema' : field });
    } else if (field === 'structured_outputs') {
      if (!isObject(v)) throw badRequest(`'structured_outputs' must be an object`, field);
      const keys = Object.keys(v).filter((k) => v[k] !== undefined && v[k] !== null);
      if (keys.length !== 1) throw badRequest(`'structured_outputs' must hold exactly one of json, regex, choice, grammar, json_object`, field);
      const k = keys[0];
      const f = `structured_outputs.${k}`;
      if (k === 'json_object') {
        if (v[k] !== true) throw badRequest(`'${f}' must be true`, f);
        found.push({ spec: spec({ type: 'json_object' }, f), field: f });
      } else if (STRUCTURED[k]) found.push({ spec: GUIDED[STRUCTURED[k]](v[k], f), field: f });
      else throw badRequest(`'structured_outputs.${k}' is not supported by this server`, f, 'unsupported_parameter');
    } else found.push({ spec: GUIDED[field](v, field), field });
  }
  if (found.length > 1) throw badRequest(`give one output constraint, not ${found.map((g) => `'${g.field}'`).join(' and ')}`, found[1].field);
  return found[0];
}

/** Compile the grammar once to check it (XGrammar, on this thread): a bad one is a 400 naming its field. */
export async function checkRequestGrammar(g: RequestGrammar): Promise<void> {
  try {
    await checkGrammar(g.spec, g.field);
  } catch (e) {
    if (e instanceof InvalidParamsError) throw badRequest(e.message, g.field);
    throw e;
  }
}
