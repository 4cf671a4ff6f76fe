import type { DeviceBackend } from '@nerva/core';
import type { ModelRunner } from './model-runner.js';

/** The host side of one step's metadata: what writeStepMeta copies to the runner's buffers. */
export interface StepBuffers {
  ids: Int32Array;
  pos: Int32Array;
  seq: Int32Array;
  slots: Int32Array;
  tables: Int32Array;
  /** Tiered KV: the warm slot of each block (-1 where it is not warm). */
  warmTables?: Int32Array;
  /** Tiered KV with kvWarmLinkShare: the staging index (its warm slot) of each block staged into VRAM (-1 elsewhere). */
  linkTables?: Int32Array;
  logitRows: Int32Array;
  params: Float32Array;
  rng: Int32Array;
}

export function createStepBuffers(maxRows: number, maxNumSeqs: number, maxBlocksPerSeq: number, tiered: boolean, linked: boolean): StepBuffers {
  return {
    ids: new Int32Array(maxRows),
    pos: new Int32Array(maxRows),
    seq: new Int32Array(maxRows),
    slots: new Int32Array(maxRows),
    tables: new Int32Array(maxNumSeqs * maxBlocksPerSeq),
    ...(tiered ? { warmTables: new Int32Array(maxNumSeqs * maxBlocksPerSeq) } : {}),
    ...(linked ? { linkTables: new Int32Array(maxNumSeqs * maxBlocksPerSeq) } : {}),
    logitRows: new Int32Array(maxNumSeqs),
    params: new Float32Array(maxNumSeqs * 4),
    rng: new Int32Array(maxNumSeqs * 2),
  };
}

/** Write a step's metadata (rows, tables, logit rows and, when sampling on the device, its parameters) to one runner. */
export function writeStepMeta(be: DeviceBackend, runner: ModelRunner, st: StepBuffers, rows: number, nl: number, withSampling: boolean): void {
  const m = runner.meta;
  const mb = runner.limits.maxBlocksPerSeq;
  be.write(m.ids, st.ids.subarray(0, rows));
  be.write(m.positions, st.pos.subarray(0, rows));
  be.write(m.rowSeq, st.seq.subarray(0, rows));
  be.write(m.slots, st.slots.subarray(0, rows));
  let seqs = 0;
  for (let r = 0; r < rows; r++) seqs = Math.max(seqs, st.seq[r] + 1);
  be.write(m.blockTables, st.tables.subarray(0, seqs * mb));
  if (m.warmTables && st.warmTables) be.write(m.warmTables, st.warmTables.subarray(0, seqs * mb));
  if (m.linkTables && st.linkTables) be.write(m.linkTables, st.linkTables.subarray(0, seqs * mb));
  if (nl > 0) be.write(m.logitRows, st.logitRows.subarray(0, nl));
  if (withSampling && nl > 0) {
    be.write(m.sampleParams, st.params.subarray(0, nl * 4));
    be.write(m.rng, st.rng.subarray(0, nl * 2));
  }
}

/** Fill a graph bucket's rows past the step's `nSeq` with padding, and logit row r = r. */
export function padBucket(st: StepBuffers, nSeq: number, bucket: number, mb: number): void {
  for (let r = nSeq; r < bucket; r++) {
    // Padding rows: a slot of -1 is skipped by kv_append; their own sequence row has only the null block.
    st.ids[r] = 0;
    st.pos[r] = 0;
    st.seq[r] = r;
    st.slots[r] = -1;
    st.tables.fill(0, r * mb, (r + 1) * mb);
    st.warmTables?.fill(-1, r * mb, (r + 1) * mb);
    st.linkTables?.fill(-1, r * mb, (r + 1) * mb);
    st.params[r * 4] = 0;
    st.rng[r * 2] = 0;
    st.rng[r * 2 + 1] = 0;
  }
  for (let r = 0; r < bucket; r++) st.logitRows[r] = r;
}
