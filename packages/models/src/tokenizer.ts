import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { TokenizerError } from './errors.js';
import { ModelFileError, readModelText, readOptionalModelText } from './model-file.js';

/** One chat message as chat templates expect it (extra fields such as `tool_calls` pass through). */
export interface ChatMessage {
  role: string;
  content: string | unknown[] | null;
  [key: string]: unknown;
}

export interface ChatTemplateOptions {
  /** Append the assistant turn opener (HF `add_generation_prompt`). Default true. */
  addGenerationPrompt?: boolean;
  /** Passed as `enable_thinking` (Qwen3); left undefined when not given, as the template checks `is defined`. */
  enableThinking?: boolean;
  /** Tool (function) schemas, passed as `tools`. */
  tools?: unknown[];
  /** Any further template variables (HF `**kwargs`). */
  extra?: Record<string, unknown>;
}

/** Contents of `tokenizer_config.json` that matter here. */
interface TokenizerConfig {
  chat_template?: string | { name: string; template: string }[];
  bos_token?: unknown;
  eos_token?: unknown;
  pad_token?: unknown;
  unk_token?: unknown;
  [key: string]: unknown;
}

/**
 * A Hugging Face tokenizer (`tokenizer.json`) with its `tokenizer_config.json`: encoding,
 * decoding and chat templates. Pure JS; loading the 150k-token Qwen3 vocabulary takes ~1 s.
 */
export class NervaTokenizer {
  private readonly tok: Tokenizer;
  private readonly template?: Template;
  private readonly specialIds: ReadonlySet<number>;
  private readonly config: TokenizerConfig;
  /** Size of the id space: highest id (vocabulary or added token) + 1. */
  readonly vocabSize: number;
  /** Ids of the configured end-of-sequence token (empty when the config names none). */
  readonly eosTokenIds: readonly number[];
  /** Beginning-of-sequence token string, when configured. */
  readonly bosToken?: string;
  /** End-of-sequence token string, when configured. */
  readonly eosToken?: string;
  /** The raw chat template source, when the tokenizer ships one. */
  readonly chatTemplate?: string;

  /**
   * Build from parsed `tokenizer.json` and `tokenizer_config.json` contents. `chatTemplate`
   * overrides the config's template (e.g. from a `chat_template.jinja` file).
   */
  constructor(tokenizerJson: unknown, tokenizerConfig: unknown = {}, chatTemplate?: string, source = 'tokenizer.json') {
    if (typeof tokenizerJson !== 'object' || tokenizerJson === null || !('model' in tokenizerJson)) {
      throw new TokenizerError('MALFORMED', `${source}: not a Hugging Face tokenizer.json (no "model" section)`);
    }
    if (typeof tokenizerConfig !== 'object' || tokenizerConfig === null || Array.isArray(tokenizerConfig)) {
      throw new TokenizerError('MALFORMED', `${source}: tokenizer_config.json is not a JSON object`);
    }
    const config = tokenizerConfig as TokenizerConfig;
    try {
      this.tok = new Tokenizer(tokenizerJson, config);
    } catch (e) {
      throw new TokenizerError('MALFORMED', `${source}: cannot build tokenizer: ${(e as Error).message}`, { cause: e });
    }
    let maxId = -1;
    for (const id of this.tok.get_vocab(true).values()) if (id > maxId) maxId = id;
    this.vocabSize = maxId + 1;
    const special = new Set<number>();
    for (const [id, t] of this.tok.get_added_tokens_decoder()) if (t.special) special.add(id);
    this.specialIds = special;

    this.bosToken = tokenContent(config.bos_token);
    this.eosToken = tokenContent(config.eos_token);
    const eosId = this.eosToken !== undefined ? this.tok.token_to_id(this.eosToken) : undefined;
    this.eosTokenIds = eosId !== undefined ? [eosId] : [];

    const tpl = chatTemplate ?? pickTemplate(config.chat_template);
    if (tpl !== undefined) {
      this.chatTemplate = tpl;
      try {
        this.template = new Template(tpl);
      } catch (e) {
        throw new TokenizerError('MALFORMED', `${source}: chat template does not parse: ${(e as Error).message}`, { cause: e });
      }
    }
    this.config = config;
  }

  /**
   * Load `tokenizer.json` and `tokenizer_config.json` from `dir` (a `chat_template.jinja` file,
   * the newer HF layout, takes precedence over the config's template). Throws
   * {@link TokenizerError} NOT_FOUND or MALFORMED.
   */
  static async fromDir(dir: string): Promise<NervaTokenizer> {
    const tokPath = join(dir, 'tokenizer.json');
    const tokJson = await readTokenizerJson(dir, 'tokenizer.json', true);
    const cfg = (await readTokenizerJson(dir, 'tokenizer_config.json', false)) ?? {};
    // Confined to the folder: a template symlinked elsewhere is refused, not read and echoed back.
    const tpl = await readOptionalModelText(dir, 'chat_template.jinja');
    return new NervaTokenizer(tokJson, cfg, tpl, tokPath);
  }

  /** Token ids of `text`. `addSpecialTokens` (default true, as HF) applies the post-processor's BOS/EOS. */
  encode(text: string, opts: { addSpecialTokens?: boolean } = {}): number[] {
    return this.tok.encode(text, { add_special_tokens: opts.addSpecialTokens ?? true }).ids;
  }

  /** Text of `ids`. Throws INVALID_ID for an id outside the vocabulary. */
  decode(ids: readonly number[], opts: { skipSpecialTokens?: boolean } = {}): string {
    if (ids.length === 0) return '';
    for (const id of ids) this.checkId(id);
    return this.tok.decode(ids as number[], { skip_special_tokens: opts.skipSpecialTokens ?? false });
  }

  /** The vocabulary string of one token (byte-level form, e.g. `Ġthe`), or undefined for an unused id. */
  tokenToString(id: number): string | undefined {
    return this.tok.id_to_token(id);
  }

  /** The id of a vocabulary string, or undefined. */
  tokenToId(token: string): number | undefined {
    return this.tok.token_to_id(token);
  }

  /** True for added tokens marked special (e.g. `<|im_end|>`). */
  isSpecial(id: number): boolean {
    return this.specialIds.has(id);
  }

  /**
   * Render `messages` with the tokenizer's chat template, as HF `apply_chat_template(tokenize=False)`:
   * the context carries `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools`,
   * `enable_thinking` when given and any `extra` variables. `raise_exception` and `strftime_now`
   * are globals of the jinja runtime (as in HF); a raised exception, like any template failure,
   * surfaces as {@link TokenizerError} TEMPLATE_ERROR carrying the template's message.
   */
  applyChatTemplate(messages: readonly ChatMessage[], opts: ChatTemplateOptions = {}): string {
    if (!this.template) throw new TokenizerError('NO_CHAT_TEMPLATE', 'this tokenizer has no chat template (tokenizer_config.json "chat_template" or chat_template.jinja)');
    const ctx: Record<string, unknown> = {
      bos_token: this.bosToken ?? '',
      eos_token: this.eosToken ?? '',
      pad_token: tokenContent(this.config.pad_token) ?? '',
      unk_token: tokenContent(this.config.unk_token) ?? '',
      ...opts.extra,
      messages,
      add_generation_prompt: opts.addGenerationPrompt ?? true,
    };
    if (opts.tools !== undefined) ctx.tools = opts.tools;
    if (opts.enableThinking !== undefined) ctx.enable_thinking = opts.enableThinking;
    try {
      return this.template.render(ctx);
    } catch (e) {
      throw new TokenizerError('TEMPLATE_ERROR', `chat template failed: ${(e as Error).message}`, { cause: e });
    }
  }

  /** Render and encode a chat, as HF `apply_chat_template(tokenize=True)` (no extra special tokens). */
  encodeChat(messages: readonly ChatMessage[], opts: ChatTemplateOptions = {}): number[] {
    return this.encode(this.applyChatTemplate(messages, opts), { addSpecialTokens: false });
  }

  /** True when `id` names a token (ids in a padded embedding beyond the tokenizer's do not). */
  hasId(id: number): boolean {
    return Number.isInteger(id) && id >= 0 && id < this.vocabSize && this.tok.id_to_token(id) !== undefined;
  }

  private checkId(id: number): void {
    if (!this.hasId(id)) {
      throw new TokenizerError('INVALID_ID', `token id ${id} is not in the vocabulary (size ${this.vocabSize})`);
    }
  }
}

/** Special-token fields are either a string or an AddedToken dict `{content, ...}`. */
function tokenContent(v: unknown): string | undefined {
  if (typeof v === 'string') return v;
  if (typeof v === 'object' && v !== null && typeof (v as { content?: unknown }).content === 'string') return (v as { content: string }).content;
  return undefined;
}

/** A config may hold one template or a named list; HF uses the one named "default". */
function pickTemplate(t: TokenizerConfig['chat_template']): string | undefined {
  if (typeof t === 'string') return t;
  if (Array.isArray(t)) return (t.find((x) => x?.name === 'default') ?? t[0])?.template;
  return undefined;
}

/**
 * `tokenizer.json` or `tokenizer_config.json` of model folder `dir`, parsed: confined to the
 * folder and size-capped (see model-file.ts).
 */
export async function readTokenizerJson(dir: string, name: string, required: boolean): Promise<unknown> {
  const path = join(dir, name);
  let text: string;
  try {
    text = await readModelText(dir, name);
  } catch (e) {
    if (!required && e instanceof ModelFileError && e.code === 'NOT_FOUND') return undefined;
    if (e instanceof ModelFileError && e.code !== 'NOT_FOUND') throw e;
    throw new TokenizerError('NOT_FOUND', `${path}: cannot read: ${(e as Error).message}`, { cause: e });
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new TokenizerError('MALFORMED', `${path}: not valid JSON: ${(e as Error).message}`, { cause: e });
  }
}
