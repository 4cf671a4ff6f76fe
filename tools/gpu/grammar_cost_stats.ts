// What tools/gpu/grammar_cost.ts computes without an engine: its arguments and the decode steps'
// times (tested by tools/test/grammar-cost.test.ts).

/** What one decode step says about the batch (a StepSignals subset). */
export interface StepMark {
  /** performance.now() at the step's end. */
  time: number;
  promptTokens: number;
  generationTokens: number;
}

export interface DecodeWindow {
  /** Steps that only decoded (no prompt tokens) and the tokens they produced. */
  decodeSteps: number;
  decodeTokens: number;
  /** Wall time of those steps: each from the end of the step before it. */
  decodeMs: number;
  /** Median step interval over every decode step, and over those where the whole batch decoded. */
  stepMsP50: number | null;
  fullSteps: number;
  fullStepMsP50: number | null;
}

export function median(xs: readonly number[]): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/**
 * The decode steps of one run of `batch` requests, from its step signals in order. A step's time
 * is the interval since the previous step ended (the first step of a run is its prefill). A full
 * step decoded every request of the batch: its interval is each request's time per token.
 */
export function decodeWindow(steps: readonly StepMark[], batch: number): DecodeWindow {
  const all: number[] = [];
  const full: number[] = [];
  let tokens = 0;
  for (let i = 1; i < steps.length; i++) {
    const s = steps[i];
    if (s.promptTokens !== 0 || s.generationTokens === 0) continue;
    const dt = s.time - steps[i - 1].time;
    all.push(dt);
    tokens += s.generationTokens;
    if (s.generationTokens === batch) full.push(dt);
  }
  return {
    decodeSteps: all.length,
    decodeTokens: tokens,
    decodeMs: all.reduce((a, b) => a + b, 0),
    stepMsP50: median(all),
    fullSteps: full.length,
    fullStepMsP50: median(full),
  };
}

export interface Args {
  model: string;
  backend: 'cuda' | 'cpu';
  batches: number[];
  temperatures: number[];
  newTokens: number;
  promptLen: number;
  repeats: number;
  /** Decode steps replaying captured graphs (true), run eagerly (false): one engine each, in this order. */
  graphs: boolean[];
  /** EngineOptions.grammarThreads (undefined: the engine's default). */
  grammarThreads: number | undefined;
}

const USAGE =
  'usage: grammar_cost.mjs MODEL_DIR [--backend cuda|cpu] [--batches 1,32] [--temperatures 1,0] [--new-tokens 64] [--prompt-len 32] [--repeats 3] [--graphs on,off] [--grammar-threads N]';

export function parseArgs(argv: readonly string[]): Args {
  const a: Args = { model: '', backend: 'cuda', batches: [1, 32], temperatures: [1, 0], newTokens: 64, promptLen: 32, repeats: 3, graphs: [true, false], grammarThreads: undefined };
  const positive = (flag: string, v: string | undefined): number => {
    const n = Number(v);
    if (v === undefined || !Number.isInteger(n) || n < 1) throw new RangeError(`${flag} takes a positive integer, got ${String(v)}\n${USAGE}`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const f = argv[i];
    if (f === '--backend') {
      const v = argv[++i];
      if (v !== 'cuda' && v !== 'cpu') throw new RangeError(`--backend takes cuda or cpu, got ${String(v)}\n${USAGE}`);
      a.backend = v;
    } else if (f === '--batches') a.batches = (argv[++i] ?? '').split(',').map((b) => positive('--batches', b));
    else if (f === '--temperatures')
      a.temperatures = (argv[++i] ?? '').split(',').map((t) => {
        const x = Number(t);
        if (t.trim() === '' || !Number.isFinite(x) || x < 0) throw new RangeError(`--temperatures takes non-negative numbers, got ${t}\n${USAGE}`);
        return x;
      });
    else if (f === '--new-tokens') a.newTokens = positive(f, argv[++i]);
    else if (f === '--prompt-len') a.promptLen = positive(f, argv[++i]);
    else if (f === '--repeats') a.repeats = positive(f, argv[++i]);
    else if (f === '--graphs')
      a.graphs = (argv[++i] ?? '').split(',').map((g) => {
        if (g !== 'on' && g !== 'off') throw new RangeError(`--graphs takes on, off or both (on,off), got ${g}\n${USAGE}`);
        return g === 'on';
      });
    else if (f === '--grammar-threads') {
      const v = argv[++i];
      const n = Number(v);
      if (v === undefined || v.trim() === '' || !Number.isInteger(n) || n < 0) throw new RangeError(`--grammar-threads takes a non-negative integer, got ${String(v)}\n${USAGE}`);
      a.grammarThreads = n;
    }
    else if (f.startsWith('--')) throw new RangeError(`unknown flag ${f}\n${USAGE}`);
    else if (a.model === '') a.model = f;
    else throw new RangeError(`one model folder, got ${a.model} and ${f}\n${USAGE}`);
  }
  if (a.model === '') throw new RangeError(USAGE);
  return a;
}

