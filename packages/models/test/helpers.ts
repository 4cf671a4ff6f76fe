import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll } from 'vitest';

function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'pnpm-workspace.yaml'))) {
    const up = dirname(dir);
    if (up === dir) throw new Error('pnpm-workspace.yaml not found above the test directory');
    dir = up;
  }
  return dir;
}

/** Shared fixtures: $NERVA_FIXTURES, else <repo root>/../shared/fixtures. */
export const FIXTURES = process.env.NERVA_FIXTURES ?? resolve(repoRoot(), '../shared/fixtures');
export const MODELS = join(FIXTURES, 'models');
export const QWEN3_TOKENIZER = join(FIXTURES, 'tokenizers', 'qwen3');
export const CONFIGS = resolve(FIXTURES, '../configs');
/** Fixtures made in this repository (tools/gpu/make_swa_fixture.py). */
export const LOCAL_MODELS = join(repoRoot(), 'fixtures', 'models');

const made: string[] = [];
afterAll(async () => {
  await Promise.all(made.map((d) => rm(d, { recursive: true, force: true })));
});

/** A fresh temp directory removed after the test file. */
export async function tempDir(): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'nerva-models-'));
  made.push(d);
  return d;
}

/** Write a safetensors file from a header object (or raw header text) and data bytes. */
export async function writeSafetensors(path: string, header: unknown, data: Uint8Array = new Uint8Array(0)): Promise<string> {
  const text = typeof header === 'string' ? header : JSON.stringify(header);
  const hdr = Buffer.from(text, 'utf8');
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(hdr.length));
  await writeFile(path, Buffer.concat([len, hdr, data]));
  return path;
}
