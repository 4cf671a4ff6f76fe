import { type DeviceBackend, type DeviceBuffer, NervaError } from '@nerva/core';
import type { NervaTokenizer } from '@nerva/models';
import { GrammarPool, grammarWorkerUrl } from './grammar-pool.js';
import { GrammarService } from './grammar-service.js';
import type { GrammarState } from './grammar-state.js';
import type { GrammarSpec } from './spec.js';
import { encodeVocab } from './vocab.js';
import type { Live } from '../token-policy.js';

/** Op sample's mask arguments over the context's mask buffers. */
export interface DeviceMaskArgs {
  bits: DeviceBuffer;
  index: DeviceBuffer;
  words: number;
}

/**
 * Constrained decoding in one context (the token policy of grammar requests): compiles their
 * grammars, holds the buffers their masks reach the device through, and stages each step's masks.
 *
 * Where a step's grammar rows are sampled: where the backend takes op sample's mask
 * (capabilities.opFields) and the model runs as one stage, on the device, batched with the free
 * rows (each grammar row's mask is copied into `bits`, `index[row]` points at it, the free rows'
 * index is -1); elsewhere on the host, from the row's logits with its mask applied (HostSampler).
 * The buffers have a fixed size (a mask for each of maxSeqs rows), so a decode graph captured
 * with them replays for any mix of grammar and free rows.
 *
 * Where the masks are computed: on a pool of worker threads (GrammarPool; `threads` > 0 and the
 * worker entry built), each started as soon as the token before is known and waited for right
 * before the sampling that reads it; else on the step loop's thread when the token is accepted.
 */
export class ConstrainedDecoding {
  private service: GrammarService | undefined;
  private pool: GrammarPool | undefined;
  private device: DeviceMaskArgs | undefined;
  private hostBits: Int32Array | undefined;
  private hostIndex: Int32Array | undefined;
  /** Worker threads computing masks (0: the step loop's own thread). */
  readonly threads: number;
  private readonly workerEntry: URL | undefined;

  /**
   * @param onDevice masks applied by op sample on the backend (else the host samples grammar rows)
   * @param maxSeqs logit rows of a step at most
   * @param threads grammar worker threads (EngineOptions.grammarThreads, resolved); 0, or no built worker entry: none
   */
  constructor(
    private readonly backend: DeviceBackend,
    private readonly tokenizer: NervaTokenizer | undefined,
    private readonly vocabSize: number,
    private readonly eosTokenIds: readonly number[],
    private readonly maxSeqs: number,
    readonly onDevice: boolean,
    threads: number,
  ) {
    this.workerEntry = threads > 0 ? grammarWorkerUrl() : undefined;
    this.threads = this.workerEntry ? threads : 0;
  }

  /** The mask buffers op sample reads (allocated with the first grammar on the device path). */
  get deviceArgs(): DeviceMaskArgs | undefined {
    return this.device;
  }

  /**
   * Compile `g` and start one matcher per entry of `stops` (each with its request's stop tokens).
   * The first grammar also builds the grammar engine's vocabulary and, on the device path, the
   * mask buffers (here, not on the step's hot path). Rejects with InvalidParamsError for a bad grammar.
   */
  async start(g: GrammarSpec, stops: readonly (readonly number[])[]): Promise<GrammarState[]> {
    const tok = this.tokenizer;
    if (!tok) throw new Error('constrained decoding needs a tokenizer');
    let states: GrammarState[];
    if (this.workerEntry) {
      this.pool ??= new GrammarPool(this.workerEntry, this.threads, () => encodeVocab(tok, this.vocabSize), this.vocabSize, this.eosTokenIds);
      states = await this.pool.start(g, stops);
    } else {
      this.service ??= new GrammarService(tok, this.vocabSize, this.eosTokenIds);
      const compiled = await this.service.compile(g);
      states = [];
      try {
        for (const s of stops) states.push(compiled.start(s));
      } catch (e) {
        for (const st of states) st.dispose();
        throw e;
      }
    }
    try {
      this.allocDevice();
    } catch (e) {
      for (const st of states) st.dispose();
      throw e;
    }
    return states;
  }

  /** The mask buffers, once, at their full size (a mask for each of maxSeqs rows): a captured graph reads them at fixed addresses. */
  private allocDevice(): void {
    if (!this.onDevice || this.device) return;
    const words = Math.ceil(this.vocabSize / 32);
    const bits = this.backend.alloc({ dtype: 'i32', length: this.maxSeqs * words, usage: 'io', label: 'meta.token_masks' });
    try {
      const index = this.backend.alloc({ dtype: 'i32', length: this.maxSeqs, usage: 'io', label: 'meta.token_mask_index' });
      this.device = { bits, index, words };
    } catch (e) {
      this.backend.free(bits);
      throw e;
    }
    this.hostBits = new Int32Array(this.maxSeqs * words);
    this.hostIndex = new Int32Array(this.maxSeqs);
  }

  /**
   * Start the grammar of requests (`lives`, one matcher each, with their stop tokens: EOS and
   * their stop token ids), then `queue` the request the scheduler takes; `fail` each on a bad
   * grammar. A request that ended meanwhile (`isLive` false) gets no matcher.
   */
  startLives(g: GrammarSpec, lives: readonly Live[], eos: readonly number[], to: { isLive: (l: Live) => boolean; queue: () => void; fail: (l: Live, e: Error) => void }): void {
    const stops = lives.map((l) => [...new Set([...eos, ...l.req.params.stopTokenIds])]);
    this.start(g, stops).then(
      (states) => {
        let any = false;
        lives.forEach((l, i) => {
          if (to.isLive(l)) {
            l.grammar = states[i];
            any = true;
          } else states[i].dispose();
        });
        if (any) to.queue();
      },
      (e: unknown) => {
        for (const l of lives) to.fail(l, e as Error);
      },
    );
  }

  /**
   * Wait for the masks of a step's logit rows (`states[i]`: row i's grammar), right before the
   * sampling that reads them; with a pool, the device runs the step's forward meanwhile. The rows
   * whose grammar failed (their request ends with the error), by row; undefined when none did.
   */
  ready(states: readonly (GrammarState | undefined)[]): Map<number, Error> | undefined {
    let failed: Map<number, Error> | undefined;
    states.forEach((s, i) => {
      try {
        s?.ready();
      } catch (e) {
        (failed ??= new Map()).set(i, e as Error);
      }
    });
    return failed;
  }

  /** Hand the advances submitted since the last flush to the workers (one message a worker). */
  flush(): void {
    this.pool?.flush();
  }

  /**
   * Write the masks of a step's logit rows (`states[i]`: row i's grammar, undefined for a free row
   * or one the host samples; rows up to `rows` are free) to the device and return op sample's mask
   * arguments; undefined when no row has one (and `always` is false: a captured step's op sample
   * reads the index whatever it holds, so it is written then even with every row free).
   */
  stageDeviceMasks(states: readonly (GrammarState | undefined)[], rows = states.length, always = false): DeviceMaskArgs | undefined {
    const d = this.device;
    if (!d || (!always && !states.some((s) => s !== undefined))) return undefined;
    const bits = this.hostBits!;
    const index = this.hostIndex!;
    let k = 0;
    for (let i = 0; i < rows; i++) {
      const s = states[i];
      if (s === undefined) index[i] = -1;
      else {
        bits.set(s.mask, k * d.words);
        index[i] = k++;
      }
    }
    this.backend.write(d.index, index.subarray(0, rows));
    this.backend.write(d.bits, bits.subarray(0, k * d.words));
    return d;
  }

  dispose(): void {
    this.service?.dispose();
    this.pool?.dispose();
    if (this.device) {
      this.backend.free(this.device.bits);
      this.backend.free(this.device.index);
      this.device = undefined;
    }
  }
}

/**
 * The grammar rows of one step: `states[i]` is logit row i's grammar (undefined: a free row),
 * `hostRows` the rows the host samples (their masks are applied there). The step waits for the
 * masks (`ready`) right before the sampling that reads them, stages the device rows' (`stage`),
 * and hands the sampled tokens over (`submit`) before it accepts them.
 */
export class GrammarStep {
  /** Rows whose grammar failed while their mask was computed (sampled free, then ended), by row. */
  private failed: Map<number, Error> | undefined;
  private waited = false;
  readonly any: boolean;

  constructor(
    private readonly c: ConstrainedDecoding,
    readonly states: readonly (GrammarState | undefined)[],
    private readonly hostRows: readonly number[],
  ) {
    this.any = states.some((s) => s !== undefined);
  }

  /** Wait for the rows' masks (each computed since its token before was accepted). */
  ready(): void {
    if (!this.any || this.waited) return;
    this.waited = true;
    this.failed = this.c.ready(this.states);
  }

  /**
   * Wait for the masks if not yet, then enqueue the device rows' copy; op sample's mask arguments.
   * `graphRows`: the rows of a captured step (its bucket; those past the step's are free), whose
   * index is written even where every grammar row failed.
   */
  stage(graphRows?: number): DeviceMaskArgs | undefined {
    if (!this.any) return undefined;
    this.ready();
    const states = this.states.map((g, i) => (this.hostRows.includes(i) || this.failed?.has(i) ? undefined : g));
    return this.c.stageDeviceMasks(states, graphRows, graphRows !== undefined);
  }

  /**
   * Hand each grammar row its sampled token (`tokens[i]`, of request `ids[i]`) and start its next
   * mask (the workers get them at once: one message each). The error that ends each row's
   * request (its grammar failed, or refused the token: a forced token it does not allow), by row.
   */
  submit(tokens: readonly number[], ids: readonly number[]): Map<number, Error> | undefined {
    if (!this.any) return undefined;
    const errors = new Map(this.failed);
    this.states.forEach((g, i) => {
      if (!g || errors.has(i)) return;
      try {
        if (!g.submit(tokens[i])) errors.set(i, new NervaError('GRAMMAR_REJECTED', `request ${ids[i]}: token ${tokens[i]} is not allowed by its grammar`));
      } catch (e) {
        errors.set(i, e as Error);
      }
    });
    this.c.flush();
    return errors;
  }
}
