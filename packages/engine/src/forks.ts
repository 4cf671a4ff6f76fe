import type { KvCacheManager } from '@nerva/kv';
import type { DecodeGraphs } from './decode-graphs.js';
import type { ModelRunner } from './model-runner.js';
import { Request } from './request.js';
import type { ResolvedSamplingParams } from './sampling-params.js';
import type { Scheduler } from './scheduler.js';

// Shared-prefix forks (ModelContext.submitFork): one prompt request prefilled once, whose KV the
// forks take over when its last position has been sampled once per fork.

/** The prompt's request (prefilled once, never sampled itself) and its `n` forks, fork i seeded `seed + i`. */
export function forkRequests(nextId: () => number, ids: number[], params: ResolvedSamplingParams, n: number, priority: number, cacheSalt: string | undefined, now: number): { parent: Request; children: Request[] } {
  const parent = new Request(nextId(), ids, params, priority, cacheSalt, now);
  parent.forkChildren = [];
  const children: Request[] = [];
  for (let i = 0; i < n; i++) {
    const child = new Request(nextId(), ids, { ...params, seed: (params.seed + i) | 0 }, priority, cacheSalt, now);
    child.forkParent = parent;
    child.forkGroup = parent.id;
    parent.forkChildren.push(child);
    children.push(child);
  }
  return { parent, children };
}

/**
 * A fork that ends before its prompt was prefilled leaves the prompt's request; the last one to
 * leave removes it (and frees its blocks).
 */
export function detachFork(req: Request, scheduler: Scheduler, graphs: DecodeGraphs): void {
  const p = req.forkParent;
  if (!p) return;
  req.forkParent = undefined;
  const kids = p.forkChildren ?? [];
  const k = kids.indexOf(req);
  if (k >= 0) kids.splice(k, 1);
  if (kids.length === 0) {
    p.forkChildren = undefined;
    scheduler.remove(p);
    p.status = 'FINISHED_ABORTED';
    graphs.stateKey = undefined;
  }
}

/**
 * The step that computed the last prompt token of a prompt request with forks has sampled one
 * token per fork: the forks take over its KV (full blocks shared, the partial last block copied
 * into a block of each fork's own) and its place in the running batch.
 */
export function forkOut(parent: Request, ctx: { kv: KvCacheManager; tiered: boolean; scheduler: Scheduler; graphs: DecodeGraphs; runners: readonly ModelRunner[] }): void {
  const kids = parent.forkChildren ?? [];
  parent.forkChildren = undefined;
  const seated: Request[] = [];
  const queued: Request[] = [];
  const { kv, tiered, scheduler, graphs } = ctx;
  const bs = kv.blockSize;
  // Tiered KV pages are placed per step by the page policy: no in-place copy; the forks share the
  // full pages and recompute the partial one (as long as there is a full page to share).
  const share = !tiered || (parent.numTokens >= bs && kv.numReleasedBlocks(parent.id) === 0);
  for (const c of kids) {
    c.forkParent = undefined;
    c.times.firstScheduled = parent.times.firstScheduled;
    c.numCachedTokens = parent.numCachedTokens;
    const f = share ? kv.forkSequence(parent.id, c.id, !tiered) : null;
    if (f === null) {
      // No block for its copy: recomputed when admitted, like a preempted request.
      queued.push(c);
      continue;
    }
    if (f.copy) copyKvBlock(ctx.runners, f.copy.src, f.copy.dst);
    c.numComputedTokens = f.numTokens;
    c.status = 'RUNNING';
    seated.push(c);
  }
  scheduler.replaceWithForks(parent, seated, queued);
  parent.status = 'FINISHED_STOPPED';
  graphs.stateKey = undefined;
}

/** Copy one KV block's K and V (every layer, every stage) to another block, on the compute stream. */
function copyKvBlock(runners: readonly ModelRunner[], src: number, dst: number): void {
  for (const r of runners) r.copyKvPage({ from: 'hot', fromSlot: src, to: 'hot', toSlot: dst });
}
