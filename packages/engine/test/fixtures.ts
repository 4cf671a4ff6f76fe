import { existsSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'pnpm-workspace.yaml'))) {
    const up = dirname(dir);
    if (up === dir) throw new Error('pnpm-workspace.yaml not found above the test directory');
    dir = up;
  }
  return dir;
}

export const ROOT = repoRoot();
/** Shared fixtures: $NERVA_FIXTURES, else <repo root>/../shared/fixtures. */
export const FIXTURES = process.env.NERVA_FIXTURES ?? resolve(ROOT, '../shared/fixtures');
export const MODELS = join(FIXTURES, 'models');
export const DEFAULT_MODEL = join(ROOT, 'models', 'tiny-shakespeare-qwen3');

/** Fixtures made in this repository (<repo root>/fixtures/models), e.g. by tools/gpu/make_swa_fixture.py. */
export const LOCAL_MODELS = join(ROOT, 'fixtures', 'models');

/**
 * `list`, or an error naming `what` when it is empty: a `describe.each` / `it.each` over an empty
 * list yields no test at all and the run passes without checking anything.
 */
export function nonEmpty<T>(list: readonly T[], what: string): T[] {
  if (list.length === 0) throw new Error(`no ${what}: the tests over them would silently not run`);
  return [...list];
}

/**
 * The model folders of `dir` (those with a config.json), each of which must carry its
 * transformers reference (reference.json, reference.safetensors): a folder without one, or no
 * folder at all, is an error rather than fewer tests.
 */
function referencedModels(dir: string): string[] {
  if (!existsSync(dir)) throw new Error(`fixture folder ${dir} is missing (set NERVA_FIXTURES?)`);
  const names = readdirSync(dir).filter((d) => existsSync(join(dir, d, 'config.json')));
  for (const d of names) {
    for (const f of ['reference.json', 'reference.safetensors']) {
      if (!existsSync(join(dir, d, f))) throw new Error(`fixture ${join(dir, d)} has no ${f}`);
    }
  }
  return nonEmpty(names, `fixture models under ${dir}`);
}

/** The sliding-window fixtures made in this repository (LOCAL_MODELS), each with its reference. */
export function localFixtureModels(): string[] {
  return referencedModels(LOCAL_MODELS);
}

/** The shared fixture models (MODELS), each with its reference. */
export function fixtureModels(): string[] {
  return referencedModels(MODELS);
}

export interface ReferenceCase {
  prompt_ids: number[];
  greedy_f64: number[];
  step_top2_margin: number[];
  logits_tensor: string;
  top5_ids_f64: number[];
  bf16_agrees_for: number;
}
