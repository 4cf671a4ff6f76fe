import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/**
 * A per-layer importance profile (MCAP-style): how much each decoder layer changes the residual
 * stream on a short calibration pass. The residency planner keeps the most important layers hot
 * first. It steers placement only: the math is the same whichever layers are hot.
 */
export interface ImportanceProfile {
  version: 1;
  /** importanceKey() of the architecture and checkpoint it was measured on. */
  key: string;
  /** One score per decoder layer (mean relative update ||h_out - h_in|| / ||h_in|| over the calibration rows). */
  layers: number[];
  /** Calibration tokens it was measured on. */
  tokens: number;
  method: string;
}

/** What identifies a checkpoint: its config, every tensor's name, dtype and shape, and a few tensors' bytes. */
export interface CheckpointFingerprint {
  config: unknown;
  tensors: ReadonlyArray<{ name: string; dtype: string; shape: readonly number[] }>;
  /** Raw bytes of a few small tensors (norm weights), so fine-tunes of one shape differ. */
  samples: readonly Uint8Array[];
}

/** A stable key (sha256, hex) of the architecture and the checkpoint. */
export function importanceKey(f: CheckpointFingerprint): string {
  const h = createHash('sha256');
  h.update(JSON.stringify(f.config));
  for (const t of [...f.tensors].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) h.update(`\n${t.name}:${t.dtype}:${t.shape.join('x')}`);
  for (const s of f.samples) h.update(s);
  return h.digest('hex');
}

/** Where profiles are cached by default: $XDG_CACHE_HOME/nerva/importance, else ~/.cache/nerva/importance. */
export function defaultImportanceDir(): string {
  const base = process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache');
  return path.join(base, 'nerva', 'importance');
}

/**
 * The on-disk cache of importance profiles, one JSON file per key. A missing, unreadable or
 * malformed file is a cache miss with a reason, never an error: the planner then uses execution
 * order. Writes go to a temporary file renamed into place, so a reader never sees half a file.
 */
export class ImportanceCache {
  constructor(readonly dir: string = defaultImportanceDir()) {}

  private file(key: string): string {
    if (!/^[0-9a-f]{64}$/.test(key)) throw new RangeError(`importance key must be a sha256 hex digest, got ${key}`);
    return path.join(this.dir, `${key}.json`);
  }

  /** The profile for `key` and `layers` decoder layers, or why there is none. */
  load(key: string, layers: number): { profile?: ImportanceProfile; miss?: string } {
    const file = this.file(key);
    let text: string;
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch (e) {
      return { miss: (e as NodeJS.ErrnoException).code === 'ENOENT' ? 'no cached profile' : `unreadable (${(e as Error).message})` };
    }
    let p: unknown;
    try {
      p = JSON.parse(text);
    } catch {
      return { miss: `${file} is not JSON` };
    }
    const o = p as Partial<ImportanceProfile>;
    if (o.version !== 1 || o.key !== key || !Array.isArray(o.layers) || o.layers.length !== layers || !o.layers.every((v) => typeof v === 'number' && Number.isFinite(v) && v >= 0)) {
      return { miss: `${file} does not hold a profile of ${layers} layers for this checkpoint` };
    }
    return { profile: o as ImportanceProfile };
  }

  save(profile: ImportanceProfile): string {
    const file = this.file(profile.key);
    fs.mkdirSync(this.dir, { recursive: true });
    const tmp = `${file}.${process.pid}.tmp`;
    try {
      fs.writeFileSync(tmp, JSON.stringify(profile) + '\n');
      fs.renameSync(tmp, file);
    } catch (e) {
      fs.rmSync(tmp, { force: true });
      throw e;
    }
    return file;
  }
}

/**
 * Accumulates the calibration statistic: for each layer, the stream before and after it, row by
 * row (hidden states as float32 [rows, hidden]).
 */
export class ImportanceMeter {
  private readonly sums: Float64Array;
  private readonly counts: Float64Array;

  constructor(readonly numLayers: number) {
    this.sums = new Float64Array(numLayers);
    this.counts = new Float64Array(numLayers);
  }

  /** Layer `l` took `before` to `after` ([rows, hidden] each). */
  add(l: number, before: Float32Array, after: Float32Array, rows: number, hidden: number): void {
    for (let r = 0; r < rows; r++) {
      let d = 0;
      let n = 0;
      for (let i = r * hidden; i < (r + 1) * hidden; i++) {
        const x = before[i];
        const y = after[i] - x;
        n += x * x;
        d += y * y;
      }
      if (n > 0) {
        this.sums[l] += Math.sqrt(d / n);
        this.counts[l] += 1;
      }
    }
  }

  scores(): number[] {
    return Array.from(this.sums, (s, l) => (this.counts[l] > 0 ? s / this.counts[l] : 0));
  }
}
