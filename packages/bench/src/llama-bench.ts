import { execFile } from 'node:child_process';
import { accessSync, constants, statSync } from 'node:fs';

/**
 * llama.cpp's own `llama-bench` binary as a decode peer: where a build for the device was brought
 * along (node-llama-cpp installs only its CPU build here, so on a GPU the peer is a llama.cpp
 * built for it), `nerva-bench llama-cpp --llama-bench PATH` runs it on the same GGUF file.
 * llama-bench prints one JSON object per test with `-o jsonl`; its token-generation test (`-p 0
 * -n N`) decodes N tokens from an empty context and reports their mean rate over its repetitions.
 */
export interface LlamaBenchResult {
  /** Mean decode rate over the repetitions (tokens/s): llama-bench's avg_ts. */
  tokensPerS: number;
  stddevTokensPerS: number;
  /** Tokens generated a repetition (n_gen) and the context they started from (n_depth). */
  nGen: number;
  nDepth: number;
  buildCommit: string | null;
  /** The device llama.cpp reports (gpu_info, else its CPU), and its backends ("CUDA", "CPU"). */
  device: string | null;
  backends: string | null;
  gpuLayers: number | null;
}

/** Refuse a path that is not an executable file, before anything loads. */
export function checkLlamaBench(path: string): void {
  let isFile = false;
  try {
    isFile = statSync(path).isFile();
  } catch {
    throw new Error(`--llama-bench: no such file: ${path}`);
  }
  if (!isFile) throw new Error(`--llama-bench: not a file: ${path}`);
  try {
    accessSync(path, constants.X_OK);
  } catch {
    throw new Error(`--llama-bench: not executable: ${path}`);
  }
}

/**
 * The token-generation result in llama-bench's JSON-lines output: the last line with n_prompt 0
 * and n_gen > 0. Throws with the reason when there is none or it is malformed.
 */
export function parseLlamaBench(stdout: string): LlamaBenchResult {
  const objects: Record<string, unknown>[] = [];
  for (const line of stdout.split('\n')) {
    const t = line.trim();
    if (!t.startsWith('{')) continue;
    try {
      const v: unknown = JSON.parse(t);
      if (v && typeof v === 'object' && !Array.isArray(v)) objects.push(v as Record<string, unknown>);
    } catch {
      throw new Error(`llama-bench printed a line that is not JSON: ${t.slice(0, 120)}`);
    }
  }
  const tg = objects.filter((o) => o.n_prompt === 0 && typeof o.n_gen === 'number' && o.n_gen > 0).at(-1);
  if (!tg) throw new Error(`llama-bench printed no token-generation result (a JSON line with n_prompt 0 and n_gen > 0); ${objects.length} JSON line(s) in all`);
  const num = (k: string): number => {
    const v = tg[k];
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw new Error(`llama-bench's result has no valid "${k}": ${JSON.stringify(v)}`);
    return v;
  };
  const str = (k: string): string | null => (typeof tg[k] === 'string' && tg[k] !== '' ? (tg[k] as string) : null);
  const tokensPerS = num('avg_ts');
  if (tokensPerS === 0) throw new Error('llama-bench reports 0 tokens/s');
  return {
    tokensPerS,
    stddevTokensPerS: typeof tg.stddev_ts === 'number' ? tg.stddev_ts : 0,
    nGen: num('n_gen'),
    nDepth: typeof tg.n_depth === 'number' ? tg.n_depth : 0,
    buildCommit: str('build_commit'),
    device: str('gpu_info') ?? str('cpu_info'),
    backends: str('backends'),
    gpuLayers: typeof tg.n_gpu_layers === 'number' ? tg.n_gpu_layers : null,
  };
}

/**
 * Run `llama-bench` on `model`: `tokens` generated from an empty context, every layer on the GPU
 * unless `gpu` is false (then `threads` CPU threads). Rejects with its exit status and the tail of
 * its stderr when it fails, or with the parse error when its output holds no result.
 */
export function runLlamaBench(path: string, o: { model: string; tokens: number; gpu: boolean; threads: number; timeoutMs?: number }): Promise<LlamaBenchResult> {
  const args = ['-m', o.model, '-p', '0', '-n', String(o.tokens), '-o', 'jsonl', ...(o.gpu ? ['-ngl', '99'] : ['-ngl', '0', '-t', String(o.threads)])];
  return new Promise((resolve, reject) => {
    execFile(path, args, { timeout: o.timeoutMs ?? 600_000, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (err) {
        const tail = String(stderr).trim().split('\n').slice(-3).join(' | ');
        const how = err.killed ? `was stopped (${err.signal ?? 'timeout'})` : `exited with ${String(err.code)}`;
        reject(new Error(`llama-bench ${how}${tail ? `: ${tail}` : ''}`));
        return;
      }
      try {
        resolve(parseLlamaBench(String(stdout)));
      } catch (e) {
        reject(e as Error);
      }
    });
  });
}
