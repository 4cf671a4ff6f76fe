import type { BackendCapabilities, DeviceBackend, GraphHandle } from '@nerva/core';
import type { WeightPager } from '@nerva/memos';
import type { ModelRunner } from './model-runner.js';
import type { PassRunner } from './stages/pipeline.js';
import type { DeviceMaskArgs } from './grammar/constrained.js';

/** A decode step's token masks (constrained decoding): the buffers op sample reads, and how the host fills them. */
export interface MaskedSampling {
  args: DeviceMaskArgs;
  /** Wait for the step's masks and enqueue their copy to `args` (between the forward and the sampling). */
  stage(): void;
}

/** A tiered pass's graph variant: the staging span its copies were captured with, and whether it has host partials. */
export interface TierPass {
  span: number;
  hostPages: boolean;
}

/**
 * The keys of a one-row decode graph's row for as long as it replays: within the backend's
 * shortContextKeys ('short', captured with that bound as op decoder_layers' maxKeys), at least
 * its longContextKeys ('long', captured with that floor as minKeys), or unknown (undefined).
 */
export type KeyRange = 'short' | 'long' | undefined;

/**
 * The key range of a one-row replay of the steps `first` .. `last` after the current one, for rows
 * that have computed `computed` tokens each: 'short' where every row's keys stay within the
 * backend's bound through the last step, 'long' where every row has at least its floor from the
 * first (keys only grow).
 */
export function keyRangeOf(caps: Pick<BackendCapabilities, 'shortContextKeys' | 'longContextKeys'>, computed: readonly number[], first: number, last: number): KeyRange {
  const short = caps.shortContextKeys ?? 0;
  const long = caps.longContextKeys ?? 0;
  if (short > 0 && computed.every((n) => n + last + 1 <= short)) return 'short';
  if (long > 0 && computed.every((n) => n + first + 1 >= long)) return 'long';
  return undefined;
}

/** Batch-size buckets decode graphs are captured for: a step of n rows replays the first bucket >= n. */
export const BUCKETS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256];

/** The bucket a step of n rows replays: the first of BUCKETS >= n within the context's maxSeqs (n where none is). */
export function bucketFor(n: number, maxSeqs: number): number {
  return BUCKETS.find((b) => b >= n && b <= maxSeqs) ?? n;
}

/**
 * A context's captured decode graphs (a decode step: forward, sampling, advance) and which pass
 * the device's step state was last written for.
 */
export class DecodeGraphs {
  /** Captured decode graphs by bucket, tiered or not, and (tiered) the staging span they copy. */
  private readonly graphs = new Map<string, GraphHandle>();
  /** Host-slice weight bytes one replay of each captured bucket computes. */
  private readonly replayHostBytes = new Map<string, number>();
  /**
   * The pass (passKey) whose step state (ids, positions, slots, tables) the device holds, so a
   * replay of the same pass writes nothing; undefined after anything changed it.
   */
  stateKey: string | undefined;

  constructor(
    private readonly backend: DeviceBackend,
    private readonly runner: PassRunner,
    private readonly pager: WeightPager | undefined,
  ) {}


  /**
   * Replay the decode graph of `steps` steps of this bucket (captured on first use: forward,
   * sampling, advance, `steps` times). Tiered passes (`tier`: some page warm) and others are
   * different graphs; tiered graphs also differ by the staging span their copies were captured
   * with and by whether the host attends over warm pages. One-row steps whose row stays within the
   * backend's shortContextKeys, or has at least its longContextKeys (`keys`), replay graphs of
   * their own ("s" and "l" suffixes; see KeyRange). Several steps: "x<steps>" suffix.
   *
   * A step with grammar rows (`masks`, one step) replays a variant of its own ("m" suffix),
   * captured the first time such a step comes: the forward and the sampling as two graphs, op
   * sample reading the context's token masks. Between them the host stages the step's masks
   * (`masks.stage`: it waits for them, then enqueues their copy), so the device runs the forward
   * while the masks are finished; free rows have mask index -1. Steps without grammar rows keep
   * the graph without masks and pay nothing for them.
   */
  replay(bucket: number, steps: number, tier: TierPass | undefined, keys: KeyRange, masks?: MaskedSampling): void {
    const tiered = tier !== undefined;
    if (masks) {
      if (steps !== 1) throw new RangeError('a decode step with token masks replays one step');
      this.replayForward(bucket, tier, keys);
      this.replaySample(bucket, masks);
      return;
    }
    const gk = this.key(bucket, steps, tier, keys);
    const g = this.graph(gk, keys, true, () => {
      for (let j = 0; j < steps; j++) {
        this.forward(bucket, tiered);
        this.runner.sampleStep(bucket, this.runner.meta.ids);
      }
    });
    this.run(gk, g, tiered, true);
  }

  /** The forward of a step with token masks (its graph captured on first use): the first half of `replay` with masks. */
  replayForward(bucket: number, tier: TierPass | undefined, keys: KeyRange): void {
    const fk = `${this.key(bucket, 1, tier, keys)}m`;
    this.run(fk, this.graph(fk, keys, true, () => this.forward(bucket, tier !== undefined)), tier !== undefined, true);
  }

  /** The sampling of a step with token masks, after its forward: stages the masks, then replays op sample reading them. */
  replaySample(bucket: number, masks: MaskedSampling): void {
    const sk = `${bucket}m:sample`;
    const runner = this.runner as ModelRunner;
    const g = this.graph(sk, undefined, false, () => {
      runner.sampleMask = masks.args;
      try {
        runner.sampleStep(bucket, runner.meta.ids);
      } finally {
        runner.sampleMask = undefined;
      }
    });
    masks.stage();
    this.run(sk, g, false, false);
  }

  private key(bucket: number, steps: number, tier: TierPass | undefined, keys: KeyRange): string {
    const k = keys === 'short' ? 's' : keys === 'long' ? 'l' : '';
    return (tier ? `t${bucket}:${tier.span}${tier.hostPages ? 'h' : ''}` : `${bucket}`) + k + (steps > 1 ? `x${steps}` : '');
  }

  private forward(bucket: number, tiered: boolean): void {
    if (tiered) (this.runner as ModelRunner).forward(bucket, bucket, undefined, undefined, true);
    else this.runner.forward(bucket, bucket);
  }

  /** The graph of key `gk`, captured from `body` on first use (`paged`: a forward, whose weight loads the pager records). */
  private graph(gk: string, keys: KeyRange, paged: boolean, body: () => void): GraphHandle {
    let g = this.graphs.get(gk);
    if (g) return g;
    const be = this.backend;
    const pager = paged ? this.pager : undefined;
    be.beginCapture();
    pager?.beginCapture();
    const hostBefore = this.runner.hostComputeBytes;
    const runner = this.runner as ModelRunner;
    if (keys === 'short') runner.decodeKeyBound = be.capabilities.shortContextKeys ?? 0;
    if (keys === 'long') runner.decodeKeyFloor = be.capabilities.longContextKeys ?? 0;
    try {
      body();
    } catch (err) {
      // End the failed capture, so the stream is usable (and disposable) again; its error stands.
      try {
        be.destroyGraph(be.endCapture());
      } catch {
        // an invalidated capture ends with an error of its own
      }
      throw err;
    } finally {
      if (keys === 'short') runner.decodeKeyBound = 0;
      if (keys === 'long') runner.decodeKeyFloor = 0;
      pager?.endCapture();
      // Captured, not run: counted on each replay instead.
      this.replayHostBytes.set(gk, this.runner.hostComputeBytes - hostBefore);
      this.runner.hostComputeBytes = hostBefore;
    }
    g = be.endCapture();
    this.graphs.set(gk, g);
    return g;
  }

  private run(gk: string, g: GraphHandle, tiered: boolean, paged: boolean): void {
    const be = this.backend;
    be.setHotPath(true);
    try {
      be.replay(g);
      if (paged) this.pager?.replayed();
      this.runner.hostComputeBytes += this.replayHostBytes.get(gk) ?? 0;
      if (tiered) (this.runner as ModelRunner).tieredPasses++;
    } finally {
      be.setHotPath(false);
    }
  }

  /** Nodes of each captured decode graph, by key. */
  nodes(): Record<string, number> {
    return Object.fromEntries([...this.graphs].map(([b, g]) => [b, g.nodes]));
  }

  dispose(): void {
    for (const g of this.graphs.values()) this.backend.destroyGraph(g);
    this.graphs.clear();
  }
}
