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
    process.stderr.write(`\r${label} [${'#'.repeat(fill)}${'.'.repeat(width - fill)}] ${pct}%${done >= total ? '\n' : ''}`);
  };
}
