import type { XGrammarRuntime, XgHandle, XgMatcher } from './xgrammar-runtime.js';

/**
 * One constrained request's place in its grammar (an XGrammar matcher) and the token mask of its
 * next step: bit (t & 31) of `mask[t >> 5]` is set where token t may come next. The mask is
 * computed when the previous token is accepted (a step ahead of the sampling that reads it), on
 * the host; `lastMs` is the time that took, for the token's ledger record.
 */
export class GrammarState {
  readonly mask: Int32Array;
  /** Host time of the last advance (accepting a token and computing the next mask), ms. */
  lastMs = 0;
  private readonly matcher: XgMatcher;
  private done = false;
  private carryMs = 0;

  /**
   * @param compiled a grammar compiled by `rt` for a vocabulary of `vocabSize` ids
   * @param stopTokenIds the tokens that end the output where the grammar accepts (EOS, the request's stop ids)
   */
  constructor(
    private readonly rt: XGrammarRuntime,
    compiled: XgHandle,
    stopTokenIds: readonly number[],
    private readonly vocabSize: number,
  ) {
    this.mask = new Int32Array(Math.ceil(vocabSize / 32));
    const t0 = performance.now();
    this.matcher = rt.call('creating the grammar matcher', () => {
      const b = rt.binding;
      const stops = b.vecIntFromJSArray([...stopTokenIds]);
      try {
        return new b.GrammarMatcher(compiled, stops, false, -1);
      } finally {
        stops.delete();
      }
    });
    this.fill();
    // Starting the matcher (and the first mask) is the first token's grammar time.
    this.carryMs = performance.now() - t0;
  }

  /** True once a stop token was accepted: the output is complete. */
  get terminated(): boolean {
    return this.done;
  }

  /** Whether token `t` may come next. */
  allows(t: number): boolean {
    return t >= 0 && t < this.vocabSize && ((this.mask[t >>> 5] >>> (t & 31)) & 1) === 1;
  }

  /**
   * Accept the sampled token and compute the next mask. False (nothing changed) when the grammar
   * does not allow the token; throws when the grammar engine failed.
   */
  advance(token: number): boolean {
    const t0 = performance.now();
    if (this.done || !this.allows(token)) return false;
    const ok = this.rt.call('accepting a token', () => this.matcher.AcceptToken(token, false));
    if (!ok) return false;
    this.done = this.rt.call('reading the grammar state', () => this.matcher.IsTerminated());
    if (!this.done) this.fill();
    this.lastMs = performance.now() - t0 + this.carryMs;
    this.carryMs = 0;
    return true;
  }

  /** Free the matcher (the request ended). */
  dispose(): void {
    if (!this.rt.dead) this.matcher.delete();
  }

  private fill(): void {
    this.rt.call('computing the token mask', () => {
      const v = this.matcher.GetNextTokenBitmask(this.vocabSize);
      try {
        this.mask.set(this.rt.binding.vecIntToView(v).subarray(0, this.mask.length));
      } finally {
        v.delete();
      }
    });
  }
}
