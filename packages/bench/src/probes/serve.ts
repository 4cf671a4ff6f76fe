import type { StepSignals } from '@nerva/engine';
import { DEFAULT_CONFIG, defaultModelDir, startServer } from '@nerva/server';
import { syntheticPrompt } from '../measure.js';
import { decodeProbe } from './decode.js';
import { type ClientRun, runClients } from './serve-clients.js';

export interface ServeProbeOptions {
  model?: string;
  backend: 'cpu' | 'cuda' | 'auto';
  /** Clients streaming at once. */
  concurrency: number;
  /** Requests in all (default: one per client). */
  requests?: number;
  maxTokens: number;
  /** Prompt tokens of each request: token ids (distinct per request), so a model without a tokenizer serves too. */
  promptLen: number;
  /**
   * Run the engine's own batch-1 decode probe on the same model, backend, prompt length and token
   * count first (its engine disposed before the server starts): its line is returned too, and the
   * serve line gets the ratio of the served stream's decode rate to it.
   */
  vsDecode?: boolean;
  /** Prompt tokens a step may take while others decode (EngineOptions.decodePromptBudget); default: the server's (SERVE_DECODE_PROMPT_BUDGET). */
  decodePromptBudget?: number;
  /** Token budget of one scheduler step (EngineOptions.maxNumBatchedTokens); default: the engine's. */
  maxNumBatchedTokens?: number;
}

const round = (x: number, d = 100) => Math.round(x * d) / d;

function percentile(xs: number[], p: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return round(s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]);
}

const mean = (xs: number[]): number | null => (xs.length === 0 ? null : xs.reduce((a, b) => a + b, 0) / xs.length);

/**
 * The engine's step cadence while it has work: the mean time between a step and the next one
 * after a step that left requests running or waiting (the engine loops on at once then), and the
 * mean of the steps' own host time.
 */
function stepFigures(steps: StepSignals[]): { intervalMs: number | null; stepMs: number | null; steps: number; mixed: number; mixedPromptMax: number | null } {
  const gaps: number[] = [];
  for (let i = 1; i < steps.length; i++) if (steps[i - 1].running + steps[i - 1].waiting > 0) gaps.push(steps[i].time - steps[i - 1].time);
  const ms = mean(steps.map((s) => s.stepMs));
  const iv = mean(gaps);
  // Steps that computed prompt tokens beside other rows: what decodePromptBudget bounds.
  const mixed = steps.filter((s) => s.promptTokens > 0 && s.scheduledTokens > s.promptTokens);
  return {
    intervalMs: iv === null ? null : round(iv, 1000),
    stepMs: ms === null ? null : round(ms, 1000),
    steps: steps.length,
    mixed: mixed.length,
    mixedPromptMax: mixed.length ? Math.max(...mixed.map((s) => s.promptTokens)) : null,
  };
}

/**
 * Serving throughput: an in-process server on a free loopback port, `concurrency` streaming
 * clients in closed loop until `requests` are done, each prompt `promptLen` token ids. TTFT and
 * inter-token latency as clients see them; each stream's decode rate (tokens after the first over
 * the time from the first to the last); the engine's step cadence in the same window (its step
 * signals), and inter-token p99 over it. With `vsDecode`, the decode probe's line first and the
 * ratio of the served stream's decode rate to the engine's own.
 */
export async function serveProbe(o: ServeProbeOptions): Promise<Record<string, unknown>[]> {
  const lines: Record<string, unknown>[] = [];
  let decodeTokS: number | undefined;
  if (o.vsDecode) {
    const d = await decodeProbe({ model: o.model ?? defaultModelDir(), backend: o.backend, promptLen: o.promptLen, newTokens: o.maxTokens });
    lines.push(d);
    decodeTokS = d.tokens_per_s as number;
  }
  // The probe's clients share one address: the per-client cap must let all of them in.
  const server = await startServer({
    ...DEFAULT_CONFIG,
    model: o.model,
    backend: o.backend,
    port: 0,
    maxQueue: Math.max(256, o.concurrency),
    maxSequencesPerClient: Math.max(1, o.concurrency),
    ...(o.decodePromptBudget !== undefined ? { decodePromptBudget: o.decodePromptBudget } : {}),
    ...(o.maxNumBatchedTokens !== undefined ? { maxNumBatchedTokens: o.maxNumBatchedTokens } : {}),
  });
  try {
    await server.ready;
    const engine = server.state.engine!;
    const model = server.state.modelName;
    const vocab = engine.info.vocabSize;
    const prompt = (i: number) => syntheticPrompt(o.promptLen, vocab, 1000 + i);
    const total = o.requests ?? o.concurrency;
    const steps: StepSignals[] = [];
    let off: (() => void) | undefined;
    let run: ClientRun;
    try {
      run = await runClients(
        {
          url: server.url,
          model,
          concurrency: o.concurrency,
          // Warm-up, outside the figures: one request per client at once, the i-th for 32 + i
          // tokens, so the batch shrinks one row at a time and the engine's decode graphs of
          // every batch size the run will see are captured before it.
          warm: Array.from({ length: o.concurrency }, (_, i) => ({ prompt: prompt(-1 - i), maxTokens: 32 + i })),
          prompts: Array.from({ length: total }, (_, i) => prompt(i)),
          maxTokens: o.maxTokens,
        },
        () => (off = engine.onStep((s) => steps.push(s))),
      );
    } finally {
      off?.();
    }
    const results = run.results;
    const wallS = run.wallMs / 1000;
    const tokens = results.reduce((a, r) => a + r.tokens, 0);
    const ttft = results.flatMap((r) => (r.ttftMs === undefined ? [] : [r.ttftMs]));
    const itl = results.flatMap((r) => r.gapsMs);
    // A stream's decode rate, as the decode probe counts it: the tokens after the first over the time they took.
    const rates = results.flatMap((r) => (r.tokens > 1 && r.lastMs! > r.firstMs! ? [((r.tokens - 1) * 1000) / (r.lastMs! - r.firstMs!)] : []));
    const step = stepFigures(steps);
    const itlP99 = percentile(itl, 99);
    const streamRate = mean(rates);
    const line: Record<string, unknown> = {
      probe: 'serve',
      model: server.state.modelDir,
      backend: engine.info.backendName,
      concurrency: o.concurrency,
      requests: total,
      prompt_len: o.promptLen,
      max_tokens: o.maxTokens,
      wall_s: round(wallS, 1000),
      output_tokens: tokens,
      output_tokens_per_s: round(tokens / wallS),
      requests_per_s: round(results.filter((r) => r.ok).length / wallS, 1000),
      // Mean over requests of each stream's decode rate (tokens after the first over their time).
      stream_decode_tok_s: streamRate === null ? null : round(streamRate),
      ttft_ms_p50: percentile(ttft, 50),
      ttft_ms_p99: percentile(ttft, 99),
      itl_ms_mean: itl.length ? round(mean(itl)!, 1000) : null,
      itl_ms_p50: percentile(itl, 50),
      itl_ms_p99: itlP99,
      // The engine's steps in the same window: the mean time from a step to the next while it had work, and the steps' own host time.
      engine_steps: step.steps,
      step_interval_ms_mean: step.intervalMs,
      step_ms_mean: step.stepMs,
      itl_p99_over_step: itlP99 !== null && step.intervalMs ? round(itlP99 / step.intervalMs, 1000) : null,
      // Steps with prompt tokens beside other rows, and the most prompt tokens one of them took.
      mixed_steps: step.mixed,
      mixed_step_prompt_tokens_max: step.mixedPromptMax,
      errors: results.filter((r) => !r.ok).length,
      decode_prompt_budget: server.state.config.decodePromptBudget ?? null,
      notes: [...engine.info.notes],
    };
    if (decodeTokS !== undefined) {
      line.decode_tok_s = decodeTokS;
      line.stream_over_decode = streamRate !== null && decodeTokS > 0 ? round(streamRate / decodeTokS, 1000) : null;
    }
    lines.push(line);
    return lines;
  } finally {
    await server.shutdown();
  }
}
