import type { StepSignals, TokenEvent, WorkerEngine, WorkerOutcome } from '@nerva/engine';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { MemoryReport } from './memory-report.js';

const LATENCY_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560];
const TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];

/**
 * Prometheus metrics under vLLM's names with the `nerva:` prefix, in a registry of their own (so
 * several servers can live in one process). Scheduler gauges and counters come from the engine's
 * per-step signals; request histograms from each finished request's timestamps.
 */
export class ServerMetrics {
  readonly registry = new Registry();
  private readonly running: Gauge;
  private readonly waiting: Gauge;
  private readonly kvUsage: Gauge;
  private readonly prefixQueries: Counter;
  private readonly prefixHits: Counter;
  private readonly preemptions: Counter;
  private readonly promptTokens: Counter;
  private readonly generationTokens: Counter;
  private readonly success: Counter<'finished_reason'>;
  private readonly slowClients: Counter;
  private readonly ttft: Histogram;
  private readonly itl: Histogram;
  private readonly e2e: Histogram;
  private readonly queue: Histogram;
  private readonly prefill: Histogram;
  private readonly decode: Histogram;
  private readonly reqPrompt: Histogram;
  private readonly reqGen: Histogram;
  private readonly iteration: Histogram;
  private last = { prefixQueries: 0, prefixHits: 0, preemptions: 0 };
  private readonly unsubscribe: (() => void)[] = [];
  // The memory OS (GET /v1/memory's report), refreshed at each scrape (setMemory).
  private readonly tierBytes: Gauge<'tier' | 'holder'>;
  private readonly tierBudget: Gauge<'tier'>;
  private readonly weightBytes: Gauge<'placement'>;
  private readonly weightMovedBytes: Counter<'path'>;
  private readonly weightMoveSeconds: Counter<'path'>;
  private readonly prefetchHits: Counter;
  private readonly prefetchStalls: Counter;
  private readonly prefetchStallSeconds: Counter;
  private readonly kvPages: Gauge<'tier'>;
  private readonly kvPagesCapacity: Gauge<'tier'>;
  private readonly kvDemotions: Counter;
  private readonly kvPromotions: Counter;
  private readonly kvMovedBytes: Counter<'path'>;
  private readonly kvMoveSeconds: Counter<'path'>;
  private readonly kvTieredPasses: Counter;
  private readonly kvHostAttentionSeconds: Counter;
  private readonly kvSwappedOut: Counter;
  private readonly kvStagedBytes: Counter;
  /**
   * Cumulative values last seen, by counter and label: the report is cumulative, counters take
   * increments. A smaller value (an engine started anew) becomes the baseline, never a decrement.
   */
  private readonly seen = new Map<string, number>();

  constructor(readonly modelName: string) {
    const r = [this.registry];
    this.registry.setDefaultLabels({ model_name: modelName });
    this.running = new Gauge({ name: 'nerva:num_requests_running', help: 'Requests in the running batch.', registers: r });
    this.waiting = new Gauge({ name: 'nerva:num_requests_waiting', help: 'Requests waiting to be scheduled.', registers: r });
    this.kvUsage = new Gauge({ name: 'nerva:kv_cache_usage_perc', help: 'KV cache usage (1 = full).', registers: r });
    this.prefixQueries = new Counter({ name: 'nerva:prefix_cache_queries_total', help: 'Prompt tokens looked up in the prefix cache.', registers: r });
    this.prefixHits = new Counter({ name: 'nerva:prefix_cache_hits_total', help: 'Prompt tokens served from the prefix cache.', registers: r });
    this.preemptions = new Counter({ name: 'nerva:num_preemptions_total', help: 'Preemptions by the scheduler.', registers: r });
    this.promptTokens = new Counter({ name: 'nerva:prompt_tokens_total', help: 'Prefill tokens processed.', registers: r });
    this.generationTokens = new Counter({ name: 'nerva:generation_tokens_total', help: 'Tokens generated.', registers: r });
    this.success = new Counter({ name: 'nerva:request_success_total', help: 'Finished requests by finish reason.', labelNames: ['finished_reason'], registers: r });
    this.slowClients = new Counter({
      name: 'nerva:stream_slow_client_aborts_total',
      help: 'Streaming requests stopped because their client did not read: more output waited for it than sse_buffer_bytes.',
      registers: r,
    });
    const h = (name: string, help: string, buckets: number[]) => new Histogram({ name, help, buckets, registers: r });
    this.ttft = h('nerva:time_to_first_token_seconds', 'Time to first token.', LATENCY_BUCKETS);
    this.itl = h('nerva:inter_token_latency_seconds', 'Time between consecutive output tokens.', LATENCY_BUCKETS);
    this.e2e = h('nerva:e2e_request_latency_seconds', 'Arrival to finish.', LATENCY_BUCKETS);
    this.queue = h('nerva:request_queue_time_seconds', 'Time waiting before first scheduled.', LATENCY_BUCKETS);
    this.prefill = h('nerva:request_prefill_time_seconds', 'First scheduled to first token.', LATENCY_BUCKETS);
    this.decode = h('nerva:request_decode_time_seconds', 'First token to last token.', LATENCY_BUCKETS);
    this.reqPrompt = h('nerva:request_prompt_tokens', 'Prompt tokens per request.', TOKEN_BUCKETS);
    this.reqGen = h('nerva:request_generation_tokens', 'Generated tokens per request.', TOKEN_BUCKETS);
    this.iteration = h('nerva:iteration_tokens_total', 'Tokens scheduled per engine step.', TOKEN_BUCKETS);
    const g = <L extends string>(name: string, help: string, labelNames: L[] = []) => new Gauge<L>({ name, help, labelNames, registers: r });
    const c = <L extends string>(name: string, help: string, labelNames: L[] = []) => new Counter<L>({ name, help, labelNames, registers: r });
    this.tierBytes = g('nerva:memory_tier_bytes', 'Bytes the engine holds in each memory tier, by what holds them (weights, staging, kv, other).', ['tier', 'holder']);
    this.tierBudget = g('nerva:memory_tier_budget_bytes', 'What each memory tier may hold for the engine (its budget, or its capacity).', ['tier']);
    this.weightBytes = g('nerva:weight_bytes', 'Model weight bytes by placement: hot (resident in the compute tier), streamed (from host memory each pass), disk.', ['placement']);
    this.weightMovedBytes = c('nerva:weight_moved_bytes_total', 'Weight bytes moved or computed on by path: h2d (streamed to the device), disk_read, cpu_compute (used in place by the host).', ['path']);
    this.weightMoveSeconds = c('nerva:weight_move_seconds_total', 'Measured time of those weight moves, by path.', ['path']);
    this.prefetchHits = c('nerva:weight_prefetch_hits_total', 'Streamed weight blocks whose copy was issued ahead of the layer that needs them.');
    this.prefetchStalls = c('nerva:weight_prefetch_stalls_total', 'Streamed weight blocks copied at the point of use.');
    this.prefetchStallSeconds = c('nerva:weight_prefetch_stall_seconds_total', 'Device time the compute stream waited for weight copies.');
    this.kvPages = g('nerva:kv_pages', 'Tiered KV: pages holding K/V now, by tier (hot: compute tier, warm: pinned host memory, cold: the offload file).', ['tier']);
    this.kvPagesCapacity = g('nerva:kv_pages_capacity', 'Tiered KV: pages each tier can hold.', ['tier']);
    this.kvDemotions = c('nerva:kv_page_demotions_total', 'Tiered KV: pages moved down a tier (hot to warm, warm to cold).');
    this.kvPromotions = c('nerva:kv_page_promotions_total', 'Tiered KV: pages moved back up a tier.');
    this.kvMovedBytes = c('nerva:kv_moved_bytes_total', 'Tiered KV: page bytes moved, by path (d2h, h2d, disk_write, disk_read).', ['path']);
    this.kvMoveSeconds = c('nerva:kv_move_seconds_total', 'Tiered KV: measured time of those page moves, by path.', ['path']);
    this.kvTieredPasses = c('nerva:kv_tiered_passes_total', 'Tiered KV: forward passes whose attention merged partials over warm pages.');
    this.kvHostAttentionSeconds = c('nerva:kv_host_attention_seconds_total', 'Tiered KV: host CPU time computing attention over warm pages where they lie (the partials merged with the device\'s), where the backend measures it.');
    this.kvSwappedOut = c('nerva:kv_swapped_out_total', 'Tiered KV: sequences written to the cold tier instead of preempted by recompute.');
    this.kvStagedBytes = c('nerva:kv_staged_bytes_total', 'Tiered KV with kv_warm_link_share: warm page bytes gathered over the link into VRAM staging.');
  }

  /**
   * Refresh the memory OS metrics from the engine's report (at each scrape). Gauges take the
   * values; counters advance by what the cumulative figures grew since the last report. The KV
   * series appear only when the engine runs tiered KV.
   */
  setMemory(m: MemoryReport): void {
    const adv = <L extends string>(ctr: Counter<L>, key: string, value: number, labels?: Record<L, string>) => {
      const prev = this.seen.get(key) ?? 0;
      if (value > prev) {
        if (labels) ctr.inc(labels, value - prev);
        else (ctr as Counter).inc(value - prev);
      }
      this.seen.set(key, value);
    };
    for (const t of m.tiers) {
      this.tierBudget.set({ tier: t.tier }, t.budgetBytes);
      this.tierBytes.set({ tier: t.tier, holder: 'weights' }, t.weightBytes);
      this.tierBytes.set({ tier: t.tier, holder: 'staging' }, t.stagingBytes);
      this.tierBytes.set({ tier: t.tier, holder: 'kv' }, t.kvBytes);
      this.tierBytes.set({ tier: t.tier, holder: 'other' }, t.otherBytes);
    }
    const w = m.weights;
    this.weightBytes.set({ placement: 'hot' }, w.hotBytes);
    this.weightBytes.set({ placement: 'streamed' }, w.streamedBytes);
    this.weightBytes.set({ placement: 'disk' }, w.diskBytes);
    for (const [path, t] of [['h2d', m.moved.h2d], ['disk_read', m.moved.diskRead], ['cpu_compute', m.moved.cpuCompute]] as const) {
      adv(this.weightMovedBytes, `weight_bytes:${path}`, t.bytes, { path });
      adv(this.weightMoveSeconds, `weight_s:${path}`, t.ms / 1000, { path });
    }
    adv(this.prefetchHits, 'prefetch_hits', m.prefetch.hits);
    adv(this.prefetchStalls, 'prefetch_stalls', m.prefetch.stalls);
    adv(this.prefetchStallSeconds, 'prefetch_stall_s', m.prefetch.stallMs / 1000);
    const kv = m.kv;
    if (!kv) return;
    for (const tier of ['hot', 'warm', 'cold'] as const) {
      this.kvPages.set({ tier }, kv.tiers[tier].used);
      this.kvPagesCapacity.set({ tier }, kv.tiers[tier].capacity);
    }
    adv(this.kvDemotions, 'kv_demotions', kv.demotions);
    adv(this.kvPromotions, 'kv_promotions', kv.promotions);
    for (const [path, t] of [['d2h', kv.moved.d2h], ['h2d', kv.moved.h2d], ['disk_write', kv.moved.diskWrite], ['disk_read', kv.moved.diskRead]] as const) {
      adv(this.kvMovedBytes, `kv_bytes:${path}`, t.bytes, { path });
      adv(this.kvMoveSeconds, `kv_s:${path}`, t.ms / 1000, { path });
    }
    adv(this.kvTieredPasses, 'kv_tiered_passes', kv.tieredPasses);
    if (kv.hostAttentionMs !== undefined) adv(this.kvHostAttentionSeconds, 'kv_host_attention_s', kv.hostAttentionMs / 1000);
    adv(this.kvSwappedOut, 'kv_swapped_out', kv.swappedOut);
    adv(this.kvStagedBytes, 'kv_staged_bytes', kv.staging?.stagedBytes ?? 0);
  }

  /** Follow an engine's steps and finished requests. */
  attach(engine: WorkerEngine): void {
    this.unsubscribe.push(engine.onStep((s) => this.onStep(s)));
    this.unsubscribe.push(engine.onFinish((o) => this.onFinish(o)));
  }

  detach(): void {
    for (const u of this.unsubscribe.splice(0)) u();
  }

  /** Refresh the gauges from the engine's last reported state (aborts happen between steps). */
  setLoad(running: number, waiting: number, kvUsage: number): void {
    this.running.set(running);
    this.waiting.set(waiting);
    this.kvUsage.set(kvUsage);
  }

  onStep(s: StepSignals): void {
    this.setLoad(s.running, s.waiting, s.kvUsage);
    // Counters in the signals are cumulative; Prometheus counters take increments.
    const inc = (c: Counter, key: keyof typeof this.last, v: number) => {
      if (v > this.last[key]) c.inc(v - this.last[key]);
      this.last[key] = v;
    };
    inc(this.prefixQueries, 'prefixQueries', s.prefixQueries);
    inc(this.prefixHits, 'prefixHits', s.prefixHits);
    inc(this.preemptions, 'preemptions', s.preemptions);
    if (s.promptTokens > 0) this.promptTokens.inc(s.promptTokens);
    if (s.generationTokens > 0) this.generationTokens.inc(s.generationTokens);
    if (s.scheduledTokens > 0) this.iteration.observe(s.scheduledTokens);
  }

  /** One output token after the first: its engine-side gap to the previous token. */
  onToken(ev: TokenEvent): void {
    if (ev.index > 0 && Number.isFinite(ev.ledger?.wallMs)) this.itl.observe(ev.ledger.wallMs / 1000);
  }

  /** A stream stopped at the SSE buffer cap (its client stopped reading). */
  onSlowClient(): void {
    this.slowClients.inc();
  }

  onFinish(o: WorkerOutcome): void {
    this.success.inc({ finished_reason: o.finishReason });
    const t = o.times;
    const s = (a: number | undefined, b: number | undefined) => (a !== undefined && b !== undefined ? Math.max(0, (b - a) / 1000) : undefined);
    const obs = (hist: Histogram, v: number | undefined) => v !== undefined && hist.observe(v);
    obs(this.ttft, s(t.arrival, t.firstToken));
    obs(this.e2e, s(t.arrival, t.finished));
    obs(this.queue, s(t.arrival, t.firstScheduled));
    obs(this.prefill, s(t.firstScheduled, t.firstToken));
    obs(this.decode, s(t.firstToken, t.lastToken));
    this.reqPrompt.observe(o.promptIds.length);
    this.reqGen.observe(o.tokenIds.length);
  }

  /** Prometheus text exposition. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
