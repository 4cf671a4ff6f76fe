import { Engine } from '@nerva/engine';
import { measureH2dBandwidth, syntheticPrompt, withScratchBackend } from '../measure.js';

export interface LongContextProbeOptions {
  model: string;
  backend: 'cpu' | 'cuda' | 'auto';
  /** Prompt tokens: the context the decode steps attend over. */
  context: number;
  newTokens: number;
  /** KV-to-hot-budget ratios to run besides all-hot (default 2 and 4). */
  ratios?: number[];
  blockSize?: number;
  /**
   * The host's DRAM read rate in GB/s, measured beside this run (tools/gpu phase hostattn): with
   * the link's copy rate (measured by the probe), the limit of each mix (see limit_tok_s).
   */
  hostReadGbps?: number;
  /** KV cache element type of every mix (default 'auto': f32 under exact numerics); bf16 halves the warm bytes the host reads. */
  kvCacheDtype?: 'auto' | 'f32' | 'bf16';
  /**
   * kvWarmLinkShare values to run each ratio with (default: the engine's default alone): the
   * device's own share of the warm pages, read over the link while the host computes the rest.
   */
  linkShares?: number[];
}

/**
 * Decode at a long context with the KV in each tier mix: all hot, then hot budgets of 1/R of the
 * sequence's pages (the rest warm, attended on the host and merged). One engine per mix, run one
 * after the other in the same process on the same prompt; every mix must give the all-hot tokens.
 */
export async function longContextProbe(o: LongContextProbeOptions): Promise<Record<string, unknown>> {
  const bs = o.blockSize ?? 16;
  const ratios = o.ratios ?? [2, 4];
  const mixes: Record<string, unknown>[] = [];
  let allHot: { tokS: number; tokens: number[] } | undefined;
  let device = '';
  let backendName = '';
  let kvDtype = '';
  // The link's copy rate (pinned host -> VRAM), on a short-lived backend of the same kind: the
  // rate the link share's staging copies run at. Null on the CPU backend (no link).
  const h2d = o.backend === 'cpu' ? null : ((await withScratchBackend(o.backend, (b) => measureH2dBandwidth(b))) ?? null);
  const linkGbps = h2d ? h2d.bytesPerS / 1e9 : null;
  const shares: Array<number | undefined> = o.linkShares?.length ? o.linkShares : [undefined];
  const runs = [{ ratio: 1, share: undefined as number | undefined }, ...ratios.flatMap((ratio) => shares.map((share) => ({ ratio, share })))];
  for (const { ratio, share } of runs) {
    const base = { model: o.model, backend: o.backend, enablePrefixCaching: false, maxNumSeqs: 4, blockSize: bs, maxModelLen: o.context + o.newTokens + 2 * bs, importanceCache: false as const, kvCacheDtype: o.kvCacheDtype };
    // Pages of the sequence, and one page of KV (every layer's K and V, in the backend's KV dtype).
    let engine = await Engine.create({ ...base, kvCacheBytes: ratio === 1 ? undefined : 1 });
    kvDtype = engine.kvDtype;
    const kvElem = engine.kvDtype === 'f32' ? 4 : 2;
    const pageBytes = 2 * engine.spec.numLayers * engine.spec.numKvHeads * engine.spec.headDim * kvElem * bs;
    const pages = Math.ceil((o.context + o.newTokens) / bs);
    if (ratio !== 1) {
      engine.dispose();
      const hot = Math.max(5, Math.ceil(pages / ratio) + 1);
      engine = await Engine.create({ ...base, kvVramBudget: hot * pageBytes, kvHostBudget: (pages + 4) * pageBytes, kvWarmLinkShare: share });
    }
    try {
      device = engine.backend.capabilities.deviceName;
      backendName = engine.backend.name;
      const prompt = syntheticPrompt(o.context, engine.spec.vocabSize);
      await engine.submit(prompt.slice(0, 16), { maxTokens: 4, temperature: 0, ignoreEos: true }).done;
      const staged0 = engine.memoryReport().kv?.staging?.stagedBytes ?? 0;
      const out = await engine.submit(prompt, { maxTokens: o.newTokens, temperature: 0, ignoreEos: true }).done;
      const staged1 = engine.memoryReport().kv?.staging?.stagedBytes ?? 0;
      const s = out.ledger.summary();
      // Host time near data (the warm partials) per decode step: each decode token's ledger share
      // of its step's host compute (one sequence: the whole step's), where the backend measures it
      // (no weights stream here, so it is all host attention); null where it does not (CPU).
      const hostRecs = out.ledger.all().filter((r) => r.phase === 'decode' && r.cpuActiveMs !== undefined);
      const hostMs = hostRecs.length ? hostRecs.reduce((t, r) => t + r.cpuActiveMs!, 0) / hostRecs.length : null;
      // Device time of the decode steps (graph replay to its end event) against their wall time:
      // what the rest of a step costs on the host (policy, page moves, meta) shows as the gap.
      const dec = out.ledger.all().filter((r) => r.phase === 'decode' && r.deviceActiveMs !== undefined);
      const deviceMs = dec.length ? dec.reduce((t, r) => t + r.deviceActiveMs!, 0) / dec.length : null;
      const kv = engine.memoryReport().kv;
      const tokS = s.decode_tokens_per_s;
      if (ratio === 1) allHot = { tokS, tokens: out.tokenIds };
      // Pages past the hot pool at the middle of the decode (every layer's K and V), read by the
      // host each step; the pool keeps one page for the null block.
      const warmPages = kv ? Math.max(0, Math.ceil((o.context + o.newTokens / 2) / bs) - (kv.tiers.hot.capacity - 1)) : 0;
      const warmBytes = warmPages * pageBytes;
      // The bound at the rates measured here: the host's warm pages (the warm slots past the
      // link share's staging) are serial with the step (every layer's host partial must finish
      // before that layer's merge; its overlap with the hot partial is at most the hot attention,
      // small at 4x), the link's pages overlap it (copied a layer ahead by the copy engine). So a
      // step takes at least max(all-hot step + host bytes / host rate, link bytes / link rate).
      // host_attention_* cover the host's pages only.
      const linkPages = Math.min(warmPages, kv?.staging?.capacityPages ?? 0);
      const hostBytes = (warmPages - linkPages) * pageBytes;
      const linkBytes = linkPages * pageBytes;
      const hostGbps = hostMs !== null && hostMs > 0 && hostBytes > 0 ? hostBytes / (hostMs * 1e6) : null;
      const hostPathMs = hostBytes > 0 ? (o.hostReadGbps ? hostBytes / (o.hostReadGbps * 1e6) : null) : 0;
      const linkPathMs = linkBytes > 0 ? (linkGbps ? linkBytes / (linkGbps * 1e6) : null) : 0;
      const limitTokS =
        allHot && ratio !== 1 && hostPathMs !== null && linkPathMs !== null ? Math.round((1000 / Math.max(1000 / allHot.tokS + hostPathMs, linkPathMs)) * 100) / 100 : null;
      mixes.push({
        kv_to_hot_ratio: ratio,
        warm_link_share: ratio === 1 ? null : (kv?.staging?.share ?? 0),
        hot_pages: kv ? kv.tiers.hot.capacity : pages,
        warm_pages: warmPages,
        tokens_per_s: tokS,
        fraction_of_all_hot: allHot ? Math.round((tokS / allHot.tokS) * 1000) / 1000 : null,
        same_tokens_as_all_hot: allHot ? JSON.stringify(out.tokenIds) === JSON.stringify(allHot.tokens) : null,
        // Warm pages read per decode step (every layer's K and V), and the link share's part of them.
        warm_bytes_per_token: warmBytes,
        link_bytes_per_token: linkBytes,
        host_attention_ms_per_token: hostMs === null ? null : Math.round(hostMs * 1000) / 1000,
        // Warm pages the device staged into VRAM over the link per token (the link share's; every
        // layer's K and V; the prefill step of the run included, so an upper bound per decode step).
        staged_bytes_per_token: Math.round((staged1 - staged0) / Math.max(1, out.tokenIds.length)),
        host_attention_gbps: hostGbps === null ? null : Math.round(hostGbps * 10) / 10,
        host_read_gbps: o.hostReadGbps ?? null,
        link_gbps: linkGbps === null ? null : Math.round(linkGbps * 10) / 10,
        limit_tok_s: limitTokS,
        fraction_of_limit: limitTokS ? Math.round((tokS / limitTokS) * 1000) / 1000 : null,
        ms_per_token_p50: s.ms_per_token_p50,
        device_ms_per_token: deviceMs === null ? null : Math.round(deviceMs * 1000) / 1000,
        added_ms_per_token: allHot && ratio !== 1 ? Math.round((1000 / tokS - 1000 / allHot.tokS) * 1000) / 1000 : 0,
        demotions: kv?.demotions ?? 0,
        moved_d2h_bytes: kv?.moved.d2h.bytes ?? 0,
        tiered_passes: kv?.tieredPasses ?? 0,
        hot_path_allocations: s.hot_path_allocations,
      });
    } finally {
      engine.dispose();
    }
  }
  return { probe: 'long-context', model: o.model, backend: backendName, device, context: o.context, new_tokens: o.newTokens, block_size: bs, kv_cache_dtype: kvDtype, mixes };
}
