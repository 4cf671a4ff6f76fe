// GPU machine: what constrained decoding costs a token (issue 41's figure). An engine on the model
// folder (which must hold a tokenizer: a grammar needs the vocabulary) per graph mode (--graphs:
// decode steps replaying captured graphs, then run eagerly), then at each batch size:
//   free        every request unconstrained,
//   json_schema every request constrained by SCHEMA (with graphs: the captured variant with masks),
//   mixed       (batches > 1) one constrained request among free ones.
// The masks are computed on the engine's grammar worker threads (--grammar-threads; default the
// engine's), each started when the token before is known and waited for before the sampling.
// Same prompts, seeds and max_tokens in every case; per temperature (default 1, sampled, and 0,
// greedy: argmax with or without a mask, so the grammar's cost alone) a warm-up round (graph
// captures, the grammar engine's vocabulary, the schema's compilation), then `--repeats` rounds of
// the cases in turn.
// One JSON line per case to stdout and appended to $OUT/grammar_cost.jsonl; exit 1 on a failed
// run, on CUDA missing (the line says why) or on a finished JSON output that does not parse.
//   grammar_cost.mjs MODEL_DIR [--backend cuda|cpu] [--batches 1,32] [--temperatures 1,0] [--new-tokens 64] [--prompt-len 32] [--repeats 3]
//                    [--graphs on,off] [--grammar-threads N]
import { appendFileSync, existsSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { syntheticPrompt } from '@nerva/bench';
import { probeCuda } from '@nerva/cuda-backend';
import { Engine, type GenerateOptions, type RequestHandle, type RequestOutcome } from '@nerva/engine';
import { decodeWindow, median, parseArgs, type Args, type DecodeWindow, type StepMark } from './grammar_cost_stats.js';

/**
 * A typical object schema: bounded fields the grammar walks through (a string, an integer, an
 * enum, an array of short strings, a boolean), then a free-text field last. Random weights wander:
 * inside `notes` nearly every token is allowed, so a request mostly runs to max_tokens; one that
 * closes the object earlier ends there (the grammar accepts) and only its tokens count.
 */
export const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 24 },
    age: { type: 'integer', minimum: 0, maximum: 150 },
    role: { enum: ['admin', 'editor', 'viewer'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 12 }, maxItems: 4 },
    active: { type: 'boolean' },
    notes: { type: 'string' },
  },
  required: ['name', 'age', 'role', 'tags', 'active', 'notes'],
  additionalProperties: false,
};

const r3 = (x: number | null) => (x === null ? null : Math.round(x * 1000) / 1000);

type CaseName = 'free' | 'json_schema' | 'mixed';

/** The arguments, with the graph mode of the engine being measured. */
interface ModeArgs extends Args {
  graphMode: 'on' | 'off';
}

interface RunResult extends DecodeWindow {
  outcomes: RequestOutcome[];
  /** Grammar time on decode tokens (the ledger's grammarMs), and on every token. */
  grammarDecodeMs: number;
  grammarMs: number;
  graphReplays: number;
  /** Graph replays of the steps the constrained requests decoded in. */
  constrainedGraphReplays: number;
  ledgerDecodeTokens: number;
}

/** The number of constrained requests of a case at `batch` (request 0 is the mixed case's). */
function constrainedOf(c: CaseName, batch: number): number {
  return c === 'free' ? 0 : c === 'mixed' ? 1 : batch;
}

async function runCase(engine: Engine, a: Args, c: CaseName, batch: number, temperature: number, vocab: number): Promise<RunResult> {
  const n = constrainedOf(c, batch);
  const steps: StepMark[] = [];
  const off = engine.onStep((s) => steps.push({ time: s.time, promptTokens: s.promptTokens, generationTokens: s.generationTokens }));
  let outcomes: RequestOutcome[];
  const handles: RequestHandle[] = [];
  try {
    for (let i = 0; i < batch; i++) {
      const base: GenerateOptions = { maxTokens: a.newTokens, temperature, seed: i + 1 };
      // Free requests run to max_tokens; a constrained one ends where its grammar accepts.
      const o: GenerateOptions = i < n ? { ...base, jsonSchema: SCHEMA } : { ...base, ignoreEos: true };
      handles.push(engine.submit(syntheticPrompt(a.promptLen, vocab, i + 1), o));
    }
    outcomes = await Promise.all(handles.map((h) => h.done));
  } finally {
    off();
  }
  // A request that failed (its grammar, the grammar engine) ends with abort; its event stream,
  // read now that it has ended, carries the error.
  for (const [i, o] of outcomes.entries()) {
    if (o.finishReason !== 'abort') continue;
    let why = 'no error on its stream';
    try {
      for await (const _ of handles[i].events);
    } catch (e) {
      why = (e as Error).message;
    }
    throw new Error(`${c} batch ${batch}: request ${i} (${i < n ? 'constrained' : 'free'}) aborted: ${why}`);
  }
  let grammarDecodeMs = 0;
  let grammarMs = 0;
  let graphReplays = 0;
  let constrainedGraphReplays = 0;
  let ledgerDecodeTokens = 0;
  for (const [i, o] of outcomes.entries()) {
    for (const r of o.ledger.all()) {
      if (i < n && r.phase === 'decode') constrainedGraphReplays += r.graphReplays;
      grammarMs += r.grammarMs ?? 0;
      if (r.phase === 'decode') {
        grammarDecodeMs += r.grammarMs ?? 0;
        ledgerDecodeTokens++;
      }
      graphReplays += r.graphReplays;
    }
  }
  return { ...decodeWindow(steps, batch), outcomes, grammarDecodeMs, grammarMs, graphReplays, constrainedGraphReplays, ledgerDecodeTokens };
}

/** The constrained outputs that finished (their grammar accepted) must parse as JSON. */
function parseCheck(runs: readonly RunResult[], n: number): { finished: number; parseFailures: number; failure: string | null } {
  let finished = 0;
  let parseFailures = 0;
  let failure: string | null = null;
  for (const r of runs)
    for (const o of r.outcomes.slice(0, n)) {
      if (o.finishReason !== 'stop') continue;
      finished++;
      try {
        JSON.parse(o.text);
      } catch {
        parseFailures++;
        failure ??= o.text.slice(0, 300);
      }
    }
  return { finished, parseFailures, failure };
}

function caseLine(engine: Engine, a: ModeArgs, c: CaseName, batch: number, temperature: number, runs: readonly RunResult[]): Record<string, unknown> {
  const n = constrainedOf(c, batch);
  const perReq = runs.flatMap((r) => r.outcomes.map((o) => o.tokenIds.length));
  const finish: Record<string, number> = {};
  for (const r of runs) for (const o of r.outcomes.slice(0, Math.max(n, 1))) finish[o.finishReason] = (finish[o.finishReason] ?? 0) + 1;
  const tokS = runs.map((r) => (r.decodeMs > 0 ? (r.decodeTokens * 1000) / r.decodeMs : 0));
  const sum = (f: (r: RunResult) => number) => runs.reduce((s, r) => s + f(r), 0);
  const decodeSteps = sum((r) => r.decodeSteps);
  const ledgerDecode = sum((r) => r.ledgerDecodeTokens);
  const check = parseCheck(runs, n);
  return {
    probe: 'grammar_cost',
    case: c,
    batch,
    constrained: n,
    temperature,
    model: a.model,
    backend: engine.backend.name,
    device: engine.backend.capabilities.deviceName,
    graphs: a.graphMode,
    grammar_threads: engine.grammarThreads,
    vocab_size: engine.spec.vocabSize,
    prompt_len: a.promptLen,
    max_tokens: a.newTokens,
    repeats: runs.length,
    // Each request's time per token with the whole batch decoding (median step interval of the
    // full steps, median over the rounds), per round, and over all decode steps.
    ms_per_token: r3(median(runs.map((r) => r.fullStepMsP50).filter((x): x is number => x !== null))),
    ms_per_token_rounds: runs.map((r) => r3(r.fullStepMsP50)),
    full_batch_steps_per_round: runs.map((r) => r.fullSteps),
    step_ms_p50_all_steps: r3(median(runs.map((r) => r.stepMsP50).filter((x): x is number => x !== null))),
    // Decode tokens of the batch per second of decode wall time (median over the rounds).
    tok_s: r3(median(tokS)),
    tok_s_rounds: tokS.map(r3),
    decode_tokens_per_round: runs.map((r) => r.decodeTokens),
    decode_steps_per_round: runs.map((r) => r.decodeSteps),
    // Tokens each request produced (first token included), over every round.
    tokens_per_request: { min: Math.min(...perReq), mean: r3(perReq.reduce((s, x) => s + x, 0) / perReq.length), max: Math.max(...perReq) },
    // The constrained requests' finish reasons (the free ones' for case free): stop = the grammar accepted.
    finish_reasons: finish,
    json_outputs_finished: check.finished,
    json_parse_failures: check.parseFailures,
    ...(check.failure !== null ? { json_parse_failure: check.failure } : {}),
    // The first constrained request's text in the last round (cut by max_tokens: a prefix of the schema's JSON).
    ...(n > 0 ? { json_example: runs[runs.length - 1].outcomes[0].text.slice(0, 160) } : {}),
    // The ledger's grammarMs: the time the steps waited for the masks (the part of the workers'
    // mask time that was not overlapped with the device's forward).
    grammar_ms_total: r3(sum((r) => r.grammarMs)),
    grammar_ms_per_step: decodeSteps > 0 ? r3(sum((r) => r.grammarDecodeMs) / decodeSteps) : null,
    grammar_ms_per_token: ledgerDecode > 0 ? r3(sum((r) => r.grammarDecodeMs) / ledgerDecode) : null,
    // Any decode step of the case replayed a captured graph (mixed: the steps after its
    // constrained request ended), and any step a constrained request decoded in did.
    graphs_used: sum((r) => r.graphReplays) > 0,
    ...(n > 0 ? { graphs_used_with_grammar_rows: sum((r) => r.constrainedGraphReplays) > 0 } : {}),
    graph_replays_per_decode_token: ledgerDecode > 0 ? r3(sum((r) => r.graphReplays) / ledgerDecode) : 0,
  };
}

/**
 * The cases at one batch size and temperature: a warm-up round, `repeats` rounds, one line per
 * case (with its ratios to the free case). False when a finished JSON output did not parse.
 */
async function measure(engine: Engine, a: ModeArgs, batch: number, temperature: number, vocab: number, emit: (l: Record<string, unknown>) => void): Promise<boolean> {
  const cases: CaseName[] = batch > 1 ? ['free', 'json_schema', 'mixed'] : ['free', 'json_schema'];
  // Warm-up: every case once (graph captures, the vocabulary, the schema's compilation).
  for (const c of cases) await runCase(engine, a, c, batch, temperature, vocab);
  const runs = new Map<CaseName, RunResult[]>(cases.map((c) => [c, []]));
  for (let r = 0; r < a.repeats; r++) for (const c of cases) runs.get(c)!.push(await runCase(engine, a, c, batch, temperature, vocab));
  const lines = cases.map((c) => caseLine(engine, a, c, batch, temperature, runs.get(c)!));
  const free = lines[0];
  let ok = true;
  for (const l of lines) {
    // A token's cost against the free case at the same batch and temperature: the ratio of the
    // time per token with the whole batch decoding, and of the free case's tok/s to this one's.
    const ms = l.ms_per_token as number | null;
    const freeMs = free.ms_per_token as number | null;
    l.cost_ratio_vs_free = ms !== null && freeMs !== null && freeMs > 0 ? r3(ms / freeMs) : null;
    l.tok_s_ratio_vs_free = (l.tok_s as number) > 0 ? r3((free.tok_s as number) / (l.tok_s as number)) : null;
    // Issue 41's target: at most 10 % more per token at batch 32.
    if (l.case !== 'free' && batch === 32) l.within_target_10pct = l.cost_ratio_vs_free !== null && (l.cost_ratio_vs_free as number) <= 1.1;
    if ((l.json_parse_failures as number) > 0) ok = false;
    emit(l);
  }
  return ok;
}

async function main(): Promise<number> {
  const out = process.env.OUT ?? '.';
  mkdirSync(out, { recursive: true });
  const emit = (line: Record<string, unknown>) => {
    const s = JSON.stringify(line);
    console.log(s);
    appendFileSync(path.join(out, 'grammar_cost.jsonl'), s + '\n');
  };
  let a: Args;
  try {
    a = parseArgs(process.argv.slice(2));
  } catch (e) {
    console.error((e as Error).message);
    return 2;
  }
  if (!existsSync(path.join(a.model, 'tokenizer.json'))) {
    emit({ probe: 'grammar_cost', model: a.model, backend: a.backend, error: `${path.join(a.model, 'tokenizer.json')} is missing: a grammar needs the model's vocabulary (run.sh's phase grammar puts Qwen3's beside the synthetic weights)` });
    return 2;
  }
  if (a.backend === 'cuda') {
    const probe = probeCuda();
    if (!probe.available) {
      emit({ probe: 'grammar_cost', model: a.model, backend: 'cuda', error: `CUDA unavailable: ${probe.reason}` });
      return 1;
    }
  }
  const maxBatch = Math.max(...a.batches);
  let status = 0;
  for (const useGraphs of a.graphs) {
    const engine = await Engine.create({
      model: a.model,
      backend: a.backend,
      maxNumSeqs: maxBatch,
      maxModelLen: a.promptLen + a.newTokens + 16,
      enablePrefixCaching: false,
      useGraphs,
      ...(a.grammarThreads !== undefined ? { grammarThreads: a.grammarThreads } : {}),
    });
    const m: ModeArgs = { ...a, graphMode: useGraphs ? 'on' : 'off' };
    try {
      const tok = engine.tokenizer;
      if (!tok || tok.vocabSize > engine.spec.vocabSize) {
        emit({ probe: 'grammar_cost', model: a.model, error: `the tokenizer has ${tok?.vocabSize ?? 0} ids, the model ${engine.spec.vocabSize} logit rows` });
        return 2;
      }
      const vocab = Math.min(10000, engine.spec.vocabSize);
      for (const temperature of a.temperatures) for (const batch of a.batches) if (!(await measure(engine, m, batch, temperature, vocab, emit))) status = 1;
    } catch (e) {
      emit({ probe: 'grammar_cost', model: a.model, backend: a.backend, graphs: m.graphMode, error: (e as Error).stack ?? String(e) });
      status = 1;
    } finally {
      engine.dispose();
    }
  }
  return status;
}

if (process.argv[1] && /grammar_cost\.(mjs|ts)$/.test(process.argv[1])) process.exitCode = await main();
