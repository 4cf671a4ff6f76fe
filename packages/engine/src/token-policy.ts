import { LedgerAggregator, type TokenLedgerRecord } from '@nerva/core';
import { createDetokenizer, type NervaTokenizer } from '@nerva/models';
import type { GenerateOptions, RequestHandle, RequestOutcome } from './engine-options.js';
import type { GrammarState } from './grammar/grammar-state.js';
import type { SampledToken } from './host-sampler.js';
import type { FinishReason, Request, TokenEvent } from './request.js';
import { TokenStream } from './token-stream.js';

/** A request's live state in its context: its stream, text so far and what it asked to keep. */
export interface Live {
  req: Request;
  stream: TokenStream<TokenEvent>;
  resolve: (o: RequestOutcome) => void;
  detok?: ReturnType<typeof createDetokenizer>;
  text: string;
  emitted: number;
  ledger: LedgerAggregator;
  cleanup?: () => void;
  wantPromptLogits: boolean;
  promptLogits?: Float32Array;
  stepLogits?: Float32Array[];
  forced?: readonly number[];
  /** Constrained decoding: the request's place in its grammar and its next token mask. */
  grammar?: GrammarState;
  /** The error the request ended with, where one ended it (RequestOutcome.error). */
  error?: Error;
}

/**
 * The live state and handle of a request about to be queued: its stream, ledger (starting with
 * `notes`), detokenizer and what it asked to keep. `abort` cancels it (the handle's abort, the
 * stream's early return, `o.signal`).
 */
export function liveRequest(req: Request, o: GenerateOptions, notes: readonly string[], tokenizer: NervaTokenizer | undefined, abort: () => void): { live: Live; handle: RequestHandle } {
  const stream = new TokenStream<TokenEvent>();
  let resolve!: (x: RequestOutcome) => void;
  const done = new Promise<RequestOutcome>((r) => (resolve = r));
  const ledger = new LedgerAggregator();
  for (const n of notes) ledger.note(n);
  const live: Live = { req, stream, resolve, text: '', emitted: 0, ledger, wantPromptLogits: Boolean(o.returnPromptLogits) };
  if (o.returnStepLogits) live.stepLogits = [];
  if (o.forceTokens) live.forced = [...o.forceTokens];
  if (tokenizer) live.detok = createDetokenizer(tokenizer);
  if (o.signal) {
    const signal = o.signal;
    signal.addEventListener('abort', abort, { once: true });
    live.cleanup = () => signal.removeEventListener('abort', abort);
  }
  stream.onReturn = abort;
  return { live, handle: { id: req.id, events: stream, done, abort } };
}

/**
 * Host policies on a sampled token: EOS, stop ids, a complete grammar, stop strings, max tokens. Appends the token,
 * streams its event and returns why the request finishes, if it does (the caller ends it).
 */
export function acceptToken(l: Live, token: number, record: TokenLedgerRecord, s: SampledToken | undefined, limits: { eosTokenIds: readonly number[]; maxModelLen: number }): FinishReason | undefined {
  const req = l.req;
  const p = req.params;
  req.appendToken(token);
  const now = performance.now();
  if (req.times.firstToken === undefined) req.times.firstToken = now;
  req.times.lastToken = now;
  l.ledger.add(record);
  const isEos = !p.ignoreEos && limits.eosTokenIds.includes(token);
  const isStopId = p.stopTokenIds.includes(token);
  // A grammar that accepted its stop token is complete: the request ends there (even with ignoreEos).
  const grammarDone = l.grammar?.terminated === true;
  let finish: FinishReason | undefined;
  let stopReason: string | number | undefined;
  if (req.outputIds.length >= p.minTokens && (isEos || isStopId || grammarDone)) {
    finish = 'stop';
    stopReason = isStopId ? token : undefined;
  }
  // Text: special tokens that end the request are not part of it.
  let piece = '';
  if (l.detok && !finish) piece = l.detok.push(token);
  l.text += piece;
  let emitUpTo = l.text.length;
  if (!finish && p.stop.length > 0) {
    let best = -1;
    let bestStop = '';
    for (const st of p.stop) {
      const from = Math.max(0, l.emitted - st.length + 1);
      const i = l.text.indexOf(st, from);
      if (i >= 0 && (best < 0 || i < best)) {
        best = i;
        bestStop = st;
      }
    }
    if (best >= 0) {
      finish = 'stop';
      stopReason = bestStop;
      l.text = l.text.slice(0, best + (p.includeStopStrInOutput ? bestStop.length : 0));
      emitUpTo = l.text.length;
    } else {
      emitUpTo = l.text.length - holdBack(l.text, p.stop, l.emitted);
    }
  }
  if (!finish && req.outputIds.length >= p.maxTokens) finish = 'length';
  if (!finish && l.forced && req.outputIds.length >= l.forced.length) finish = 'length';
  if (!finish && req.numTokens >= limits.maxModelLen) finish = 'length';
  if (finish && finish !== 'stop' && l.detok) {
    l.text += l.detok.flush();
    emitUpTo = l.text.length;
  }
  if (finish) emitUpTo = l.text.length;
  const text = l.text.slice(l.emitted, Math.max(l.emitted, emitUpTo));
  l.emitted = Math.max(l.emitted, emitUpTo);
  const ev: TokenEvent = { requestId: req.id, index: req.outputIds.length - 1, token, text, ledger: record };
  if (s?.logprob !== undefined) ev.logprob = s.logprob;
  if (s?.topLogprobs) ev.topLogprobs = s.topLogprobs;
  if (finish) {
    ev.finishReason = finish;
    if (stopReason !== undefined) ev.stopReason = stopReason;
  }
  l.stream.push(ev);
  if (finish) req.stopReason = stopReason;
  return finish;
}

/** What a request's `done` resolves with. */
export function outcomeOf(l: Live): RequestOutcome {
  const o: RequestOutcome = {
    requestId: l.req.id,
    promptIds: l.req.promptIds,
    tokenIds: [...l.req.outputIds],
    text: l.text,
    finishReason: l.req.finishReason ?? 'abort',
    numCachedTokens: l.req.numCachedTokens,
    times: l.req.times,
    ledger: l.ledger,
  };
  if (l.req.stopReason !== undefined) o.stopReason = l.req.stopReason;
  if (l.error) {
    const code = (l.error as Error & { code?: unknown }).code;
    o.error = { message: l.error.message, ...(typeof code === 'string' ? { code } : {}) };
  }
  if (l.promptLogits) o.promptLogits = l.promptLogits;
  if (l.stepLogits) o.stepLogits = l.stepLogits;
  return o;
}


/** Length of the longest suffix of text (past `from`) that could start a stop string. */
function holdBack(text: string, stops: readonly string[], from: number): number {
  let hold = 0;
  for (const s of stops) {
    for (let k = Math.min(s.length - 1, text.length - from); k > hold; k--) {
      if (text.endsWith(s.slice(0, k))) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}
