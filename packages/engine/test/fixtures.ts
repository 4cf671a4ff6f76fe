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

/** Folders of LOCAL_MODELS that carry a reference.json (none when the folder is absent). */
export function localFixtureModels(): string[] {
  if (!existsSync(LOCAL_MODELS)) return [];
  return readdirSync(LOCAL_MODELS).filter((d) => existsSync(join(LOCAL_MODELS, d, 'reference.json')));
}

export function fixtureModels(): string[] {
  return readdirSync(MODELS).filter((d) => existsSync(join(MODELS, d, 'reference.json')));
}

export interface ReferenceCase {
  prompt_ids: number[];
  greedy_f64: number[];
  step_top2_margin: number[];
  logits_tensor: string;
  top5_ids_f64: number[];
  bf16_agrees_for: number;
}
