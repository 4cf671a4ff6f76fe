import type { DeviceBackend } from '@nerva/core';
import type { ModelSpec } from '@nerva/models';
import type { EngineOptions } from './engine-options.js';
import { planKvTiers, type KvTierPlan } from './kv-tiering.js';
import { type KvCacheDtype, kvDtypeOf } from './model-weights.js';
import type { RunnerLimits } from './runner-base.js';
import { kvBytesPerToken, type RunnerShape } from './weight-residency.js';

// How much memory a context takes beside the weights: its runner's shapes and its KV cache.

/** Runner shapes from the options and the backend (smaller defaults under a VRAM budget). */
export function runnerShape(backend: DeviceBackend, s: ModelSpec, o: Partial<EngineOptions>): RunnerShape {
  const cpu = backend.capabilities.deviceKind === 'cpu';
  const budgeted = o.vramBudget !== undefined || o.stageVramBudgets !== undefined;
  const maxNumSeqs = o.maxNumSeqs ?? (cpu ? 64 : budgeted ? 32 : 128);
  const maxRows = Math.max(o.maxNumBatchedTokens ?? (cpu ? 256 : budgeted ? 512 : 2048), maxNumSeqs);
  const inter = s.moe ? Math.max(s.intermediateSize, s.moe.moeIntermediateSize) : s.intermediateSize;
  const qkvOut = (s.numHeads + 2 * s.numKvHeads) * s.headDim;
  // Per row: the residual stream and its norm (and a sparse MLP's sum), qkv, the attention, gate_up and the MLP activation.
  const hiddenRows = s.moe ? 3 : 2;
  const activationBytes = 4 * (maxRows * (hiddenRows * s.hiddenSize + qkvOut + s.numHeads * s.headDim + 3 * inter) + maxNumSeqs * (s.vocabSize + s.hiddenSize));
  return { maxRows, maxNumSeqs, activationBytes, kvBytesPerToken: kvBytesPerToken(backend, s, kvDtypeOf(backend, o.kvCacheDtype)) };
}

/**
 * KV cache bytes: the option, else a share of what the weights leave (nano-vllm sizes it after a
 * warm-up pass; our activations are known up front, so they are subtracted instead). Under a
 * VRAM budget the weights are placed after the cache: it gets a quarter of the budget, at most
 * one full-length sequence, so the rest can hold weights.
 */
export function kvCacheBytesFor(backend: DeviceBackend, shape: RunnerShape, maxModelLen: number, o: Partial<EngineOptions>): number | undefined {
  if (o.kvVramBudget !== undefined) return o.kvVramBudget;
  if (o.kvCacheBytes !== undefined) return o.kvCacheBytes;
  if (backend.capabilities.deviceKind === 'cpu') return o.vramBudget !== undefined ? Math.min(256 * 2 ** 20, Math.max(shape.kvBytesPerToken * 64, Math.floor(o.vramBudget / 4))) : 256 * 2 ** 20;
  if (o.vramBudget !== undefined) return Math.max(shape.kvBytesPerToken * 64, Math.min(Math.floor(o.vramBudget / 4), shape.kvBytesPerToken * maxModelLen));
  return undefined;
}

/** The unbudgeted default, once the weights are in: a share of what they left free. */
export function kvCacheBytesAfterUpload(backend: DeviceBackend, shape: RunnerShape): number {
  const tier = backend.capabilities.computeTier;
  const free = (backend.capabilities.memory[tier] ?? 0) - backend.stats().liveBytes;
  return Math.min(16 * 2 ** 30, Math.max(32 * 2 ** 20, 0.6 * (free - shape.activationBytes)));
}

/**
 * Pinned host memory the CUDA backend reserves: the master copies of streamed weight blocks (a
 * VRAM budget) and the warm KV pool (tiered KV, float32 pages), plus room for host buffers and the
 * start-up rate measurement.
 */
export function pinnedBytesFor(o: Partial<EngineOptions>, s: ModelSpec, checkpointBytes: number, budgeted: boolean): number {
  let bytes = 320 * 2 ** 20;
  if (budgeted) bytes += Math.min(o.hostBudget ?? Number.POSITIVE_INFINITY, checkpointBytes);
  if (o.kvVramBudget !== undefined) {
    const pageBytes = 2 * s.numLayers * s.numKvHeads * s.headDim * 4 * (o.blockSize ?? 16);
    const hot = Math.floor(o.kvVramBudget / pageBytes);
    bytes += Math.max(1, Math.floor((o.kvHostBudget ?? 8 * hot * pageBytes) / pageBytes)) * pageBytes;
  }
  return bytes;
}

/**
 * A context's runner limits and KV pages: the tier plan under a hot KV budget (kvVramBudget), else
 * as many pages as `kvBytes` holds. Throws RangeError where tiered KV needs an op the backend lacks.
 */
export function contextLimits(
  backend: DeviceBackend,
  s: ModelSpec,
  shape: RunnerShape,
  kvBytes: number,
  maxModelLen: number,
  blockSize: number,
  kvDtype: KvCacheDtype,
  o: Partial<EngineOptions>,
): { tierPlan: KvTierPlan | undefined; numBlocks: number; maxBlocksPerSeq: number; limits: RunnerLimits } {
  const { maxRows, maxNumSeqs, kvBytesPerToken: perToken } = shape;
  if (o.kvVramBudget !== undefined && !backend.capabilities.ops.includes('attention_merge')) {
    throw new RangeError(`tiered KV (kvVramBudget) needs op attention_merge, which backend ${backend.name} does not have yet`);
  }
  // With KV in VRAM the device reads the warm pages itself over the link by default (as many as
  // a staging of a quarter of the hot budget holds): staged by the copy engine, it overlaps the
  // step and does not depend on the host's DRAM rate or cores (measured on an H100, 8B at 4096
  // tokens with KV 4x the hot budget: 0.81-0.85 of all-hot at share 1, 0.42 at 0). Where the
  // compute tier is host memory there is no link: the host attends.
  const tierPlan =
    o.kvVramBudget !== undefined ? planKvTiers(o, perToken * blockSize, backend.capabilities.computeTier === 'vram' ? { numLayers: s.numLayers } : undefined) : undefined;
  const numBlocks = tierPlan?.hotSlots ?? Math.max(2, Math.floor(kvBytes / (perToken * blockSize)));
  const maxBlocksPerSeq = Math.ceil(maxModelLen / blockSize);
  const limits: RunnerLimits = {
    maxRows,
    maxSeqs: maxNumSeqs,
    blockSize,
    numBlocks,
    maxBlocksPerSeq,
    ringCapacity: Math.max(4096, 4 * maxNumSeqs),
    ...(tierPlan ? { warmBlocks: Math.max(1, tierPlan.warmSlots) } : {}),
    // The link share: that share of the warm pool (its leading slots) is staged into VRAM, per
    // layer (two layers' worth in VRAM).
    ...(tierPlan && tierPlan.linkPages > 0 ? { linkPages: tierPlan.linkPages } : {}),
    kvDtype,
  };
  return { tierPlan, numBlocks, maxBlocksPerSeq, limits };
}
