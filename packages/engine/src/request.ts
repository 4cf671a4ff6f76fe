import type { TokenLedgerRecord } from '@nerva/core';
import type { TokenLogprob } from './host-sampler.js';
import type { ResolvedSamplingParams } from './sampling-params.js';

export type RequestStatus =
  | 'WAITING'
  | 'RUNNING'
  | 'PREEMPTED'
  | 'FINISHED_STOPPED'
  | 'FINISHED_LENGTH_CAPPED'
  | 'FINISHED_ABORTED';

/** Why a request ended: OpenAI's `stop`/`length`, plus `abort` for cancellation and errors. */
export type FinishReason = 'stop' | 'length' | 'abort';

export interface TokenEvent {
  requestId: number;
  /** 0-based index of the generated token. */
  index: number;
  token: number;
  /** Text this token completes (may be empty while a multi-byte character or a possible stop string is held back). */
  text: string;
  logprob?: number;
  topLogprobs?: TokenLogprob[];
  /** Set on the last event of the request. */
  finishReason?: FinishReason;
  /** The stop string or stop token id that ended it. */
  stopReason?: string | number;
  ledger: TokenLedgerRecord;
}

export interface RequestTimestamps {
  arrival: number;
  firstScheduled?: number;
  firstToken?: number;
  lastToken?: number;
  finished?: number;
}

/** A request inside the engine: tokens, progress, and its sampling state. */
export class Request {
  status: RequestStatus = 'WAITING';
  readonly outputIds: number[] = [];
  readonly allIds: number[];
  numComputedTokens = 0;
  /** Number of tokens sampled so far: the rng counter of the next draw. */
  sampleCounter = 0;
  readonly seenAll = new Map<number, number>();
  readonly seenOutput = new Map<number, number>();
  finishReason: FinishReason | undefined;
  stopReason: string | number | undefined;
  readonly times: RequestTimestamps;
  numPreemptions = 0;
  /** Prompt tokens served from the prefix cache at the last admission. */
  numCachedTokens = 0;
  /**
   * Shared-prefix forks (Engine.submitFork): on the internal request that prefills the prompt, the
   * forks waiting for it. Its last prompt row is sampled once per fork, after which the forks take
   * its place (sharing its KV blocks) and it is gone. Undefined on every other request.
   */
  forkChildren: Request[] | undefined = undefined;
  /** On a fork whose prompt is still being prefilled: the request prefilling it. */
  forkParent: Request | undefined = undefined;
  /** Id of the prompt request a fork came from (the forks of one prompt share it); undefined otherwise. */
  forkGroup: number | undefined = undefined;

  constructor(
    readonly id: number,
    readonly promptIds: readonly number[],
    readonly params: ResolvedSamplingParams,
    readonly priority: number,
    readonly cacheSalt: string | undefined,
    now: number,
  ) {
    this.allIds = [...promptIds];
    for (const t of promptIds) this.seenAll.set(t, (this.seenAll.get(t) ?? 0) + 1);
    this.times = { arrival: now };
  }

  get numTokens(): number {
    return this.allIds.length;
  }

  /** Batch seats the request takes: one per fork on a prompt request of forks, else one. */
  get forkWidth(): number {
    return this.forkChildren?.length ?? 1;
  }

  get finished(): boolean {
    return this.status.startsWith('FINISHED');
  }

  appendToken(t: number): void {
    this.outputIds.push(t);
    this.allIds.push(t);
    this.sampleCounter++;
    this.seenAll.set(t, (this.seenAll.get(t) ?? 0) + 1);
    this.seenOutput.set(t, (this.seenOutput.get(t) ?? 0) + 1);
  }
}
