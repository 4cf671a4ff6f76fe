import type { DeviceBackend } from '@nerva/core';
import type { ModelSpec } from '@nerva/models';
import type { EngineOptions } from './engine-options.js';
import { kvDtypeOf } from './model-weights.js';
import { kvBytesPerToken, type RunnerShape } from './weight-residency.js';

// How much memory a context takes beside the weights: its runner's shapes and its KV cache.

/** Runner shapes from the options and the backend (smaller defaults under a VRAM budget). */
export function runnerShape(backend: DeviceBackend, s: ModelSpec, o: Partial<EngineOptions>): RunnerShape {
  const cpu = backend.capabilities.deviceKind === 'cpu';
  const budgeted = o.vramBudget !== undefined;
  const maxNumSeqs = o.maxNumSeqs ?? (cpu ? 64 : budgeted ? 32 : 128);
  const maxRows = Math.max(o.maxNumBatchedTokens ?? (cpu ? 256 : budgeted ? 512 : 2048), maxNumSeqs);
  const inter = s.moe ? Math.max(s.intermediateSize, s.moe.moeIntermediateSize) : s.intermediateSize;
  const qkvOut = (s.numHeads + 2 * s.numKvHeads) * s.headDim;
  const activationBytes = 4 * (maxRows * (4 * s.hiddenSize + qkvOut + s.numHeads * s.headDim + 3 * inter) + maxNumSeqs * (s.vocabSize + s.hiddenSize));
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
