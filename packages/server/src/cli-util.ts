import { InvalidArgumentError } from 'commander';
import { parseSize } from './size.js';

export function parseIntArg(name: string, opts: { positive?: boolean } = {}) {
  return (v: string): number => {
    const n = Number(v);
    if (!Number.isInteger(n)) throw new InvalidArgumentError(`${name} must be an integer, got "${v}"`);
    if (opts.positive && n <= 0) throw new InvalidArgumentError(`${name} must be a positive integer, got "${v}"`);
    return n;
  };
}

export function parseFloatArg(name: string) {
  return (v: string): number => {
    const n = Number(v);
    if (!Number.isFinite(n)) throw new InvalidArgumentError(`${name} must be a number, got "${v}"`);
    return n;
  };
}

/** A number from 0 to 1 (a share); errors name the flag. */
export function parseFractionArg(name: string) {
  return (v: string): number => {
    const n = Number(v);
    if (v.trim() === '' || !(n >= 0 && n <= 1)) throw new InvalidArgumentError(`${name} must be a number from 0 to 1, got "${v}"`);
    return n;
  };
}

/** A byte size flag (`4GiB`, `512MB`, `4G` = 4 GiB, plain bytes; see size.ts); errors name the flag. */
export function parseSizeArg(name: string) {
  return (v: string): number => {
    try {
      return parseSize(v, name);
    } catch (e) {
      throw new InvalidArgumentError((e as Error).message);
    }
  };
}

export function parseIdList(v: string): number[] {
  const ids = v.split(',').map((s) => s.trim()).filter((s) => s.length > 0).map(Number);
  if (ids.length === 0 || ids.some((n) => !Number.isInteger(n) || n < 0)) {
    throw new InvalidArgumentError(`--prompt-ids must be comma-separated non-negative integers, got "${v}"`);
  }
  return ids;
}

/** A one-line progress bar on stderr, only when stderr is a terminal. */
export function progressBar(label: string): (done: number, total: number) => void {
  let last = -1;
  return (done, total) => {
    if (!process.stderr.isTTY || total <= 0) return;
    const pct = Math.floor((100 * done) / total);
    if (pct === last) return;
    last = pct;
    const width = 30;
    const fill = Math.round((width * done) / total);
    process.stderr.write(`\r${label} [${'#'.repeat(fill)}${'.'.repeat(width - fill)}] ${pct}% of ${mib(total)}${done >= total ? '\n' : ''}`);
  };
}

const mib = (bytes: number): string => `${(bytes / 2 ** 20).toFixed(bytes < 10 * 2 ** 20 ? 1 : 0)} MiB`;

/** What {@link loadProgress} hands the engine and the command. */
export interface LoadProgress {
  /** The engine's `onProgress`: bytes of the checkpoint uploaded so far. */
  onProgress(p: { done: number; total: number }): void;
  /** The load finished: one line with the time it took. */
  finish(): void;
}

/**
 * Progress of a model load on stderr, like node-llama-cpp's: once the checkpoint is open (its
 * files checked: a broken folder stays one error line), a line naming the model and its size,
 * then a bar on a terminal, or in a log a line at each quarter of a load that takes over a
 * second; then the time it took.
 */
export function loadProgress(model: string): LoadProgress {
  const out = process.stderr;
  const t0 = performance.now();
  const bar = out.isTTY ? progressBar('nerva: weights') : undefined;
  let started = false;
  let quarter = 0;
  return {
    onProgress({ done, total }) {
      if (total <= 0) return;
      if (!started) {
        started = true;
        out.write(`nerva: loading ${model} (${mib(total)})\n`);
      }
      if (bar) return bar(done, total);
      const slow = performance.now() - t0 > 1000;
      while (quarter < 3 && done * 4 >= total * (quarter + 1)) {
        quarter++;
        if (slow) out.write(`nerva: weights ${quarter * 25}% of ${mib(total)}\n`);
      }
    },
    finish() {
      out.write(`nerva: loaded in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
    },
  };
}
