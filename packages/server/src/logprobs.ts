import type { TokenEvent } from '@nerva/engine';
import type { NervaTokenizer } from '@nerva/models';

/** Token text as OpenAI reports it: the token decoded alone (byte fragments show as U+FFFD). */
export class TokenTexts {
  private readonly cache = new Map<number, string>();
  constructor(private readonly tokenizer: NervaTokenizer | undefined) {}

  text(id: number): string {
    let s = this.cache.get(id);
    if (s === undefined) {
      try {
        s = this.tokenizer ? this.tokenizer.decode([id]) : `token_id:${id}`;
      } catch {
        s = `token_id:${id}`;
      }
      if (this.cache.size < 65536) this.cache.set(id, s);
    }
    return s;
  }
}

export interface ChatLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

const bytesOf = (s: string) => [...Buffer.from(s, 'utf8')];

/** One entry of a chat choice's `logprobs.content`. */
export function chatLogprob(t: TokenTexts, ev: TokenEvent, top: number): ChatLogprob {
  const token = t.text(ev.token);
  return {
    token,
    logprob: ev.logprob ?? 0,
    bytes: bytesOf(token),
    top_logprobs: (ev.topLogprobs ?? []).slice(0, top).map((a) => {
      const s = t.text(a.token);
      return { token: s, logprob: a.logprob, bytes: bytesOf(s) };
    }),
  };
}

/** Completions' legacy logprobs object, built token by token. */
export class CompletionLogprobs {
  readonly tokens: string[] = [];
  /** null for an echoed prompt's first token (nothing precedes it). */
  readonly token_logprobs: (number | null)[] = [];
  readonly top_logprobs: (Record<string, number> | null)[] = [];
  readonly text_offset: number[] = [];
  private offset: number;

  constructor(
    private readonly t: TokenTexts,
    private readonly top: number,
    startOffset = 0,
  ) {
    this.offset = startOffset;
  }

  add(ev: TokenEvent): void {
    const s = this.t.text(ev.token);
    this.tokens.push(s);
    this.token_logprobs.push(ev.logprob ?? 0);
    const d: Record<string, number> = {};
    for (const a of (ev.topLogprobs ?? []).slice(0, this.top)) d[this.t.text(a.token)] = a.logprob;
    // The sampled token is always listed, as vLLM does.
    if (!(s in d)) d[s] = ev.logprob ?? 0;
    this.top_logprobs.push(d);
    this.text_offset.push(this.offset);
    this.offset += s.length;
  }

  /**
   * An echoed prompt (completions' `echo` with logprobs): its first token without a logprob, as
   * OpenAI reports it, then each later token scored given the tokens before it (`scored[i]` is
   * token i + 1's event: the token forced, its logprob and the alternatives).
   */
  addPrompt(ids: readonly number[], scored: readonly TokenEvent[]): void {
    if (ids.length === 0) return;
    const s = this.t.text(ids[0]);
    this.tokens.push(s);
    this.token_logprobs.push(null);
    this.top_logprobs.push(null);
    this.text_offset.push(this.offset);
    this.offset += s.length;
    for (const ev of scored) this.add(ev);
  }

  toJSON(): Record<string, unknown> {
    return { tokens: this.tokens, token_logprobs: this.token_logprobs, top_logprobs: this.top_logprobs, text_offset: this.text_offset };
  }

  /** The part added since `from` tokens, for a stream chunk. */
  slice(from: number): Record<string, unknown> {
    return {
      tokens: this.tokens.slice(from),
      token_logprobs: this.token_logprobs.slice(from),
      top_logprobs: this.top_logprobs.slice(from),
      text_offset: this.text_offset.slice(from),
    };
  }
}
