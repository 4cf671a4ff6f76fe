// GPU machine: every model converted to GGUF at each type and run on the CUDA backend against the
// CPU backend over the same file. The CPU run of a quantized file is, bit for bit, the f32 run of
// its dequantized weights (packages/engine/test/quantized-gguf.test.ts), so this holds the CUDA
// run, native block kernels and f32 fallbacks alike, to the dequantized model within the CUDA
// backend's declared f32 bound (capabilities.precision.relTol).
//   gguf_check.mjs [--backend cuda|cpu] [--types F32,Q4_K,...] MODEL_DIR...  -> $OUT/gguf_check.json
// Per model and type: greedy tokens of both runs (equal required at F32/F16, reported for block
// types, where a near-tie may flip), max |logit diff| / max |logit| per position with the CUDA run
// teacher-forced on the CPU run's tokens (required within relTol), and the dtypes the CUDA engine
// stored (blocks kept vs f32 fallback). Exits 1 on a failure, or when CUDA is unavailable.
// `--backend cpu` runs the whole check with the CPU backend on both sides (a dry run without a GPU).
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { isQuantDType } from '@nerva/core';
import { probeCuda } from '@nerva/cuda-backend';
import { Engine, type EngineOptions } from '@nerva/engine';
import { convertToGguf, GGUF_CONVERT_TYPES, type GgufConvertType } from '@nerva/models';

const out = process.env.OUT ?? '.';
const args = process.argv.slice(2);
const flag = (name: string): string | undefined => {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  const v = args[i + 1];
  args.splice(i, 2);
  return v;
};
const deviceBackend = (flag('--backend') ?? 'cuda') as 'cuda' | 'cpu';
const TYPES = (flag('--types')?.split(',') ?? ['F32', 'F16', 'Q8_0', 'Q4_0', 'Q4_K', 'Q6_K', 'Q4_K_M']) as GgufConvertType[];
const NEW_TOKENS = 16;
/** Types whose weights are the checkpoint's own floats: tokens must match, not only logits. */
const FLOAT_TYPES = new Set(['F32', 'F16', 'BF16']);

function fail(msg: string, extra: Record<string, unknown> = {}): never {
  writeFileSync(path.join(out, 'gguf_check.json'), JSON.stringify({ ok: false, error: msg, ...extra }, null, 1));
  console.error(msg);
  process.exit(1);
}
if (deviceBackend !== 'cuda' && deviceBackend !== 'cpu') fail(`--backend must be cuda or cpu, got ${String(deviceBackend)}`);
for (const t of TYPES) if (!(GGUF_CONVERT_TYPES as readonly string[]).includes(t)) fail(`unknown type ${t}; one of ${GGUF_CONVERT_TYPES.join(', ')}`);
if (args.length === 0) fail('usage: gguf_check.mjs [--backend cuda|cpu] [--types LIST] MODEL_DIR...');
if (deviceBackend === 'cuda') {
  const probe = probeCuda();
  if (!probe.available) fail(`CUDA unavailable: ${probe.reason}`, { probe });
}

/** Prompts: the fixture's reference prompts where it has them, else one of 8 ids and one of 33 (a decode-sized and a GEMM-sized prefill). */
function prompts(dir: string, vocab: number): number[][] {
  const ref = path.join(dir, 'reference.json');
  if (existsSync(ref)) return (JSON.parse(readFileSync(ref, 'utf8')) as { cases: { prompt_ids: number[] }[] }).cases.map((c) => c.prompt_ids);
  let x = 12345;
  const rand = () => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) >>> 8) % vocab;
  return [Array.from({ length: 8 }, rand), Array.from({ length: 33 }, rand)];
}

interface Greedy {
  tokens: number[][];
  /** Per prompt: the last prompt position's logits, then each generated position's. */
  logits: Float32Array[][];
}

async function run(engine: Engine, ps: number[][], force?: number[][]): Promise<Greedy> {
  const tokens: number[][] = [];
  const logits: Float32Array[][] = [];
  for (const [i, p] of ps.entries()) {
    const o = await engine.submit(p, {
      temperature: 0,
      maxTokens: NEW_TOKENS,
      ignoreEos: true,
      returnPromptLogits: true,
      returnStepLogits: true,
      ...(force ? { forceTokens: force[i] } : {}),
    }).done;
    tokens.push(o.tokenIds);
    logits.push([o.promptLogits!, ...o.stepLogits!]);
  }
  return { tokens, logits };
}

/** The largest max |a - b| / max |b| over positions. */
function worstRel(a: Float32Array[][], b: Float32Array[][]): number {
  let worst = 0;
  for (let i = 0; i < b.length; i++) {
    for (let k = 0; k < b[i].length; k++) {
      let maxRef = 0;
      let maxErr = 0;
      for (let j = 0; j < b[i][k].length; j++) {
        maxRef = Math.max(maxRef, Math.abs(b[i][k][j]));
        maxErr = Math.max(maxErr, Math.abs(a[i][k][j] - b[i][k][j]));
      }
      worst = Math.max(worst, maxRef > 0 ? maxErr / maxRef : maxErr);
    }
  }
  return worst;
}

const engineOpts: Partial<EngineOptions> = { maxModelLen: 512, maxNumSeqs: 4 };
const tmp = mkdtempSync(path.join(tmpdir(), 'nerva-gguf-check-'));
const results: Record<string, unknown>[] = [];
let ok = true;
try {
  for (const dir of args) {
    const model = path.basename(path.resolve(dir));
    for (const type of TYPES) {
      const file = path.join(tmp, `${model}-${type}.gguf`);
      const t0 = performance.now();
      try {
        await convertToGguf({ source: dir, out: file, type });
        const convertS = (performance.now() - t0) / 1000;
        const cpu = await Engine.create({ ...engineOpts, model: file, backend: 'cpu' });
        let ps: number[][];
        let ref: Greedy;
        try {
          ps = prompts(dir, cpu.spec.vocabSize);
          ref = await run(cpu, ps);
        } finally {
          cpu.dispose();
        }
        const dev = await Engine.create({ ...engineOpts, model: file, backend: deviceBackend, ...(deviceBackend === 'cuda' ? { deviceArenaBytes: 2 * 2 ** 30 } : {}) });
        let free: Greedy;
        let forced: Greedy;
        let relTol: number;
        let format: ReturnType<Engine['memoryReport']>['weights']['format'];
        try {
          relTol = dev.backend.capabilities.precision.relTol;
          free = await run(dev, ps);
          forced = await run(dev, ps, ref.tokens);
          format = dev.memoryReport().weights.format;
        } finally {
          dev.dispose();
        }
        const tokensEqual = JSON.stringify(free.tokens) === JSON.stringify(ref.tokens);
        const firstDivergence = free.tokens.map((t, i) => {
          const k = t.findIndex((v, j) => v !== ref.tokens[i][j]);
          return k < 0 ? null : k;
        });
        const rel = worstRel(forced.logits, ref.logits);
        const stored = format?.storedBytes ?? {};
        const blockBytes = Object.entries(stored).filter(([d]) => isQuantDType(d)).reduce((s, [, b]) => s + b, 0);
        const total = Object.values(stored).reduce((s, b) => s + b, 0);
        const pass = rel <= relTol && (tokensEqual || !FLOAT_TYPES.has(type));
        ok &&= pass;
        const r = {
          model,
          type,
          backend: deviceBackend,
          prompts: ps.length,
          new_tokens: NEW_TOKENS,
          tokens_equal: tokensEqual,
          first_divergence: firstDivergence,
          logits_rel_err: rel,
          rel_tol: relTol,
          checkpoint_types: format?.types,
          stored_bytes: stored,
          block_fraction: total > 0 ? blockBytes / total : 0,
          exact: format?.exact,
          convert_s: Math.round(convertS * 100) / 100,
          pass,
        };
        results.push(r);
        console.log(
          `${model} ${type}: tokens ${tokensEqual ? 'equal' : `differ at ${JSON.stringify(firstDivergence)}`}, logits rel ${rel.toExponential(2)} (bound ${relTol}), stored ${JSON.stringify(stored)} ${pass ? 'ok' : 'FAIL'}`,
        );
      } catch (e) {
        ok = false;
        results.push({ model, type, backend: deviceBackend, error: (e as Error).message, pass: false });
        console.log(`${model} ${type}: ERROR ${(e as Error).message}`);
      } finally {
        rmSync(file, { force: true });
      }
    }
  }
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
writeFileSync(path.join(out, 'gguf_check.json'), JSON.stringify({ ok, backend: deviceBackend, types: TYPES, results }, null, 1));
console.log(`gguf check: ${results.filter((r) => r.pass).length} of ${results.length} passed`);
process.exit(ok ? 0 : 1);
