import { IllegalTransitionError, OwnershipError, StaleReplicaError } from './errors.js';
import type { Tier } from './tiers.js';

/** Residency states of one replica of a block in one tier. */
export type ResidencyState =
  | 'Unmapped'
  | 'Allocated'
  | 'Prefetching'
  | 'Ready'
  | 'InUse'
  | 'Draining'
  | 'Evicting'
  | 'Invalid';

/**
 * Legal transitions. Invalid -> Unmapped is the reclaim edge: an invalidated replica
 * (its data was overwritten elsewhere while in use) can only be dropped, never used again.
 */
export const RESIDENCY_TRANSITIONS: Readonly<Record<ResidencyState, readonly ResidencyState[]>> = {
  Unmapped: ['Allocated'],
  Allocated: ['Prefetching'],
  Prefetching: ['Ready'],
  Ready: ['InUse', 'Draining'],
  InUse: ['Ready', 'Invalid'],
  Draining: ['Evicting'],
  Evicting: ['Unmapped'],
  Invalid: ['Unmapped'],
};

export function canTransition(from: ResidencyState, to: ResidencyState): boolean {
  return RESIDENCY_TRANSITIONS[from].includes(to);
}

export type BlockKind = 'weight' | 'kv' | 'activation' | 'token' | 'sampler' | 'workspace' | 'staging' | 'ledger';

/** Who may write a block right now. Handoff is the only way between the two owners. */
export type OwnershipPhase = 'CpuOwned' | 'GpuOwned' | 'SharedReadOnly' | 'Handoff';

export const OWNERSHIP_TRANSITIONS: Readonly<Record<OwnershipPhase, readonly OwnershipPhase[]>> = {
  CpuOwned: ['Handoff', 'SharedReadOnly'],
  GpuOwned: ['Handoff', 'SharedReadOnly'],
  // A shared block becomes writable again only through a handoff that fences all readers.
  SharedReadOnly: ['Handoff'],
  Handoff: ['CpuOwned', 'GpuOwned', 'SharedReadOnly'],
};

export type Lifetime = 'static' | 'request' | 'step';

export interface Replica {
  readonly tier: Tier;
  state: ResidencyState;
  /** Version of the data this replica holds (0 while it holds none). */
  version: number;
}

export interface ResidentBlockInit {
  id: string;
  kind: BlockKind;
  bytes: number;
  owner?: OwnershipPhase;
  lifetime?: Lifetime;
  /** Step (or any monotone clock) at which the block is needed next; undefined = unknown. */
  nextUse?: number;
}

/**
 * A runtime object with a size, an owner, a lifetime, a next use, and replicas in tiers.
 * `version` counts writes: a producer bumps it, and an executor may only consume a Ready
 * replica whose version is at least the one its dependency names.
 */
export class ResidentBlock {
  readonly id: string;
  readonly kind: BlockKind;
  readonly bytes: number;
  readonly lifetime: Lifetime;
  nextUse: number | undefined;
  private ownerPhase: OwnershipPhase;
  private handoffTarget: OwnershipPhase | undefined;
  private latest = 0;
  private readonly replicas = new Map<Tier, Replica>();

  constructor(init: ResidentBlockInit) {
    if (!(init.bytes >= 0) || !Number.isFinite(init.bytes)) throw new RangeError(`block ${init.id}: bad size ${init.bytes}`);
    this.id = init.id;
    this.kind = init.kind;
    this.bytes = init.bytes;
    this.lifetime = init.lifetime ?? 'static';
    this.nextUse = init.nextUse;
    this.ownerPhase = init.owner ?? 'CpuOwned';
  }

  get owner(): OwnershipPhase {
    return this.ownerPhase;
  }

  get version(): number {
    return this.latest;
  }

  replica(tier: Tier): Readonly<Replica> | undefined {
    return this.replicas.get(tier);
  }

  tiers(): Tier[] {
    return [...this.replicas.values()].filter((r) => r.state !== 'Unmapped').map((r) => r.tier);
  }

  state(tier: Tier): ResidencyState {
    return this.replicas.get(tier)?.state ?? 'Unmapped';
  }

  /** Move the replica in `tier` along one legal edge of the state machine. */
  transition(tier: Tier, to: ResidencyState): void {
    const r = this.replicas.get(tier) ?? { tier, state: 'Unmapped' as ResidencyState, version: 0 };
    if (!canTransition(r.state, to)) throw new IllegalTransitionError(`${this.id}@${tier}`, r.state, to);
    r.state = to;
    if (to === 'Unmapped') r.version = 0;
    this.replicas.set(tier, r);
  }

  /** A copy into `tier` finished: the replica now holds `version` (default: the latest). */
  completePrefetch(tier: Tier, version = this.latest): void {
    this.transition(tier, 'Ready');
    this.replicas.get(tier)!.version = version;
  }

  /** A producer wrote the block in `tier`: that replica holds a new version, others go stale. */
  write(tier: Tier): number {
    const r = this.replicas.get(tier);
    if (!r || (r.state !== 'Ready' && r.state !== 'InUse')) {
      throw new StaleReplicaError(this.id, `cannot write replica in ${tier} in state ${r?.state ?? 'Unmapped'}`);
    }
    if (this.ownerPhase === 'SharedReadOnly' || this.ownerPhase === 'Handoff') {
      throw new OwnershipError(this.id, `cannot write while ${this.ownerPhase}`);
    }
    this.latest += 1;
    r.version = this.latest;
    for (const other of this.replicas.values()) {
      if (other !== r && other.state === 'InUse') other.state = 'Invalid';
    }
    return this.latest;
  }

  /**
   * The executor rule: consume only a Ready replica whose version satisfies the dependency.
   * Moves it to InUse; call `release` when the op is done.
   */
  acquire(tier: Tier, requiredVersion: number): Replica {
    const r = this.replicas.get(tier);
    if (!r || r.state !== 'Ready') {
      throw new StaleReplicaError(this.id, `replica in ${tier} is ${r?.state ?? 'Unmapped'}, not Ready`);
    }
    if (r.version < requiredVersion) {
      throw new StaleReplicaError(this.id, `replica in ${tier} has version ${r.version}, dependency needs ${requiredVersion}`);
    }
    this.transition(tier, 'InUse');
    return r;
  }

  release(tier: Tier): void {
    this.transition(tier, 'Ready');
  }

  /** Begin handing the block to another owner; no writes until `completeHandoff`. */
  beginHandoff(to: OwnershipPhase): void {
    if (to === 'Handoff') throw new OwnershipError(this.id, 'handoff target must be an owner');
    if (!OWNERSHIP_TRANSITIONS[this.ownerPhase].includes('Handoff')) {
      throw new OwnershipError(this.id, `cannot hand off from ${this.ownerPhase}`);
    }
    this.ownerPhase = 'Handoff';
    this.handoffTarget = to;
  }

  completeHandoff(): OwnershipPhase {
    if (this.ownerPhase !== 'Handoff' || !this.handoffTarget) throw new OwnershipError(this.id, 'no handoff in progress');
    this.ownerPhase = this.handoffTarget;
    this.handoffTarget = undefined;
    return this.ownerPhase;
  }

  /** Freeze the block for any number of readers (weights after upload, a shared prefix). */
  share(): void {
    if (!OWNERSHIP_TRANSITIONS[this.ownerPhase].includes('SharedReadOnly')) {
      throw new OwnershipError(this.id, `cannot share from ${this.ownerPhase}`);
    }
    this.ownerPhase = 'SharedReadOnly';
  }
}
