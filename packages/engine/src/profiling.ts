import type { PassRunner } from './stages/pipeline.js';

/** Profiled steps ModelContext.takeProfiles keeps between calls (the latest). */
export const PROFILES_KEPT = 1024;

/** Device time of one profiled step by op (ModelContext.setProfiling, takeProfiles). */
export interface PassProfile {
  /** Token rows of the step. */
  rows: number;
  /** Device time of the whole step (its start and end events). */
  deviceMs: number;
  /** By coarse bucket (PROFILE_BUCKETS). */
  buckets: Record<string, number>;
  /** By op class: the projection of each matmul (gemm_qkv, gemm_o, gemm_gate_up, gemm_down, lm_head), else the op's name. */
  ops: Record<string, number>;
}

/**
 * Op-level device times of profiled steps (EngineOptions.profile, setProfiling): a profiled step
 * runs eagerly, op by op, its ops bracketed by device events.
 */
export class StepProfiles {
  on: boolean;
  /** The op-level device times of the profiled steps since take (at most PROFILES_KEPT, the latest). */
  private kept: PassProfile[] = [];

  constructor(
    private readonly runner: PassRunner,
    on: boolean,
  ) {
    this.on = on;
    if (on) runner.setProfiling(true);
  }

  set(on: boolean): void {
    this.on = on;
    this.runner.setProfiling(on);
  }

  /** The step's buckets when profiling (kept with its op times), else undefined. */
  record(rows: number, deviceMs: number): Record<string, number> | undefined {
    if (!this.on) return undefined;
    const ops: Record<string, number> = {};
    const buckets = this.runner.takeProfile(ops);
    this.kept.push({ rows, deviceMs, buckets: { ...buckets }, ops });
    if (this.kept.length > PROFILES_KEPT) this.kept.shift();
    return buckets;
  }

  take(): PassProfile[] {
    const out = this.kept;
    this.kept = [];
    return out;
  }
}
