import type { DeviceBackend, DeviceBuffer } from '@nerva/core';
import type { NervaTokenizer } from '@nerva/models';
import { GrammarService } from './grammar-service.js';
import type { GrammarState } from './grammar-state.js';
import type { GrammarSpec } from './spec.js';
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
 * Either way each mask is computed on the host when the previous token is accepted, a step ahead.
 */
export class ConstrainedDecoding {
  private service: GrammarService | undefined;
  private device: DeviceMaskArgs | undefined;
  private hostBits: Int32Array | undefined;
  private hostIndex: Int32Array | undefined;

  /**
   * @param onDevice masks applied by op sample on the backend (else the host samples grammar rows)
   * @param maxSeqs logit rows of a step at most
   */
  constructor(
    private readonly backend: DeviceBackend,
    private readonly tokenizer: NervaTokenizer | undefined,
    private readonly vocabSize: number,
    private readonly eosTokenIds: readonly number[],
    private readonly maxSeqs: number,
    readonly onDevice: boolean,
  ) {}

  /**
   * Compile `g` and start one matcher per entry of `stops` (each with its request's stop tokens).
   * The first grammar also builds the grammar engine's vocabulary and, on the device path, the
   * mask buffers (here, not on the step's hot path). Rejects with InvalidParamsError for a bad grammar.
   */
  async start(g: GrammarSpec, stops: readonly (readonly number[])[]): Promise<GrammarState[]> {
    if (!this.tokenizer) throw new Error('constrained decoding needs a tokenizer');
    this.service ??= new GrammarService(this.tokenizer, this.vocabSize, this.eosTokenIds);
    const compiled = await this.service.compile(g);
    if (this.onDevice && !this.device) {
      const words = this.service.maskWords;
      this.device = {
        bits: this.backend.alloc({ dtype: 'i32', length: this.maxSeqs * words, usage: 'io', label: 'meta.token_masks' }),
        index: this.backend.alloc({ dtype: 'i32', length: this.maxSeqs, usage: 'io', label: 'meta.token_mask_index' }),
        words,
      };
      this.hostBits = new Int32Array(this.maxSeqs * words);
      this.hostIndex = new Int32Array(this.maxSeqs);
    }
    const states: GrammarState[] = [];
    try {
      for (const s of stops) states.push(compiled.start(s));
    } catch (e) {
      for (const st of states) st.dispose();
      throw e;
    }
    return states;
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
   * Write the masks of a step's logit rows (`states[i]`: row i's grammar, undefined for a free row
   * or one the host samples) to the device and return op sample's mask arguments; undefined when
   * no row has one.
   */
  stageDeviceMasks(states: readonly (GrammarState | undefined)[]): DeviceMaskArgs | undefined {
    const d = this.device;
    if (!d || !states.some((s) => s !== undefined)) return undefined;
    const bits = this.hostBits!;
    const index = this.hostIndex!;
    let k = 0;
    states.forEach((s, i) => {
      if (s === undefined) index[i] = -1;
      else {
        bits.set(s.mask, k * d.words);
        index[i] = k++;
      }
    });
    this.backend.write(d.index, index.subarray(0, states.length));
    this.backend.write(d.bits, bits.subarray(0, k * d.words));
    return d;
  }

  dispose(): void {
    this.service?.dispose();
    if (this.device) {
      this.backend.free(this.device.bits);
      this.backend.free(this.device.index);
      this.device = undefined;
    }
  }
}
