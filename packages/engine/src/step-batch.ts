import type { DeviceBackend } from '@nerva/core';
import type { KvCacheManager } from '@nerva/kv';
import type { TieredKv } from './kv-tiering.js';
import type { ModelRunner } from './model-runner.js';
import type { Request } from './request.js';
import type { RowOrder } from './row-layout.js';
import type { SharedBlockReads } from './step-stats.js';

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

/**
 * Stage row r as padding, sequence k (its logit row and sampling parameters at k: a decode
 * graph samples every row). A slot of -1 is skipped by kv_append; its sequence has only the null
 * block, so the positions the device advances it to stay in that block's table.
 */
export function padRow(st: StepBuffers, r: number, k: number, mb: number): void {
  st.ids[r] = 0;
  st.pos[r] = 0;
  st.seq[r] = k;
  st.slots[r] = -1;
  st.tables.fill(0, k * mb, (k + 1) * mb);
  st.warmTables?.fill(-1, k * mb, (k + 1) * mb);
  st.linkTables?.fill(-1, k * mb, (k + 1) * mb);
  st.params[k * 4] = 0;
  st.rng[k * 2] = 0;
  st.rng[k * 2 + 1] = 0;
}

/** Fill a graph bucket's rows past the step's `nSeq` with padding, and logit row r = r. */
export function padBucket(st: StepBuffers, nSeq: number, bucket: number, mb: number): void {
  for (let r = nSeq; r < bucket; r++) padRow(st, r, r, mb);
  for (let r = 0; r < bucket; r++) st.logitRows[r] = r;
}

/** What stageBatch wrote: rows, prompt tokens among them, the requests sampled (logit row i: sampling[i]), whether a prompt with forks finished, the warm slots the link stages ([0, linkUsed)) and whether the host attends over any warm page. */
export interface StagedBatch {
  rows: number;
  promptTokens: number;
  sampling: Request[];
  forks: boolean;
  linkUsed: number;
  hostPages: boolean;
}

/**
 * Stage a scheduled batch into the step buffers: each row's token, position, sequence and KV
 * slot, each sequence's block table (under tiered KV, its views per tier: hot slots for the
 * device, warm slots for the host, staging indexes for the link's warm slots [0, linkPages)),
 * and a logit row with sampling parameters for each request whose last row is in the step.
 * A hole (a decode layout's finished row, RowLayout) is staged as a pad row at its place, its
 * sampling parameters at its place too: holes come only in decode graph steps, where every row
 * is sampled and logit row r is row r.
 */
export function stageBatch(st: StepBuffers, scheduled: RowOrder, kv: KvCacheManager, tiers: TieredKv['tiers'] | undefined, mb: number, linkPages: number, shared: SharedBlockReads, t0: number): StagedBatch {
  const bs = kv.blockSize;
  const sampling: Request[] = [];
  let rows = 0;
  let promptTokens = 0;
  let forks = false;
  let linkUsed = 0;
  let hostPages = false;
  const holes = scheduled.includes(undefined);
  scheduled.forEach((row, k) => {
    if (row === undefined) {
      padRow(st, rows++, k, mb);
      return;
    }
    const { req, numTokens } = row;
    const start = req.numComputedTokens;
    if (req.times.firstScheduled === undefined) req.times.firstScheduled = t0;
    const table = kv.blockTable(req.id);
    for (let p = start; p < start + numTokens; p++) {
      st.ids[rows] = req.allIds[p];
      st.pos[rows] = p;
      st.seq[rows] = k;
      st.slots[rows] = tiers ? tiers.hotSlot(table[Math.floor(p / bs)]) * bs + (p % bs) : kv.slotFor(req.id, p);
      rows++;
      if (p < req.promptIds.length) promptTokens++;
    }
    st.tables.fill(0, k * mb, (k + 1) * mb);
    if (tiers) {
      // Views of one table: the hot slot of each block for the device, the warm slot for the
      // host, and with a link share the staging index (the same warm slot) of the pages in the
      // device's slots. A page shared by several sequences is staged once.
      const wt = st.warmTables!;
      const lt = st.linkTables;
      wt.fill(-1, k * mb, (k + 1) * mb);
      lt?.fill(-1, k * mb, (k + 1) * mb);
      for (let b = 0; b < table.length; b++) {
        st.tables[k * mb + b] = tiers.hotSlot(table[b]);
        const w = tiers.warmSlot(table[b]);
        if (w >= 0 && lt && w < linkPages) {
          lt[k * mb + b] = w;
          if (w >= linkUsed) linkUsed = w + 1;
        } else {
          wt[k * mb + b] = w;
          if (w >= 0) hostPages = true;
        }
      }
    } else for (let b = 0; b < table.length; b++) st.tables[k * mb + b] = table[b];
    shared.add(table);
    if (start + numTokens === req.numTokens) {
      // A prompt request with forks: its last row is sampled once per fork, each with its own seed.
      const samplers = req.forkChildren ?? [req];
      if (req.forkChildren) forks = true;
      for (const r of samplers) {
        const i = holes ? k : sampling.length;
        st.logitRows[i] = rows - 1;
        const p = r.params;
        st.params[i * 4] = p.temperature;
        st.params[i * 4 + 1] = p.topK;
        st.params[i * 4 + 2] = p.topP;
        st.params[i * 4 + 3] = p.minP;
        st.rng[i * 2] = p.seed;
        st.rng[i * 2 + 1] = r.sampleCounter;
        sampling.push(r);
      }
    }
  });
  return { rows, promptTokens, sampling, forks, linkUsed, hostPages };
}
