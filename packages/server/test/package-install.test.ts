/**
 * The published package runs on its own: `pnpm pack` of @nerva/server and the workspace packages
 * it depends on, installed into an empty folder outside the repository, then `npx @nerva/server
 * run` there (CPU) generates from the embedded model the package carries. Needs pnpm and npx on
 * PATH, as CI has; the third-party dependencies come from the pnpm store (the registry when
 * missing there).
 */
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { lastJson, ROOT } from './cli-helpers.js';

const run = promisify(execFile);
const tmp = mkdtempSync(join(tmpdir(), 'nerva-pack-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** Folder names under packages/ of @nerva/server and every workspace package it depends on. */
function workspaceClosure(): string[] {
  const byName = new Map<string, string>();
  for (const d of readdirSync(join(ROOT, 'packages'))) {
    try {
      byName.set(JSON.parse(readFileSync(join(ROOT, 'packages', d, 'package.json'), 'utf8')).name, d);
    } catch {
      // Not a package folder.
    }
  }
  const seen = new Set<string>();
  const visit = (name: string): void => {
    const dir = byName.get(name);
    if (dir === undefined || seen.has(dir)) return;
    seen.add(dir);
    const deps = JSON.parse(readFileSync(join(ROOT, 'packages', dir, 'package.json'), 'utf8')).dependencies ?? {};
    for (const [dep, spec] of Object.entries(deps)) if (String(spec).startsWith('workspace:')) visit(dep);
  };
  visit('@nerva/server');
  return [...seen];
}

describe('the packed @nerva/server', () => {
  it('installs into an empty folder and `npx @nerva/server run` generates from the embedded model it ships', async () => {
    const packs = join(tmp, 'packs');
    mkdirSync(packs);
    const tarballs: Record<string, string> = {};
    for (const dir of workspaceClosure()) {
      const pkgDir = join(ROOT, 'packages', dir);
      const before = new Set(readdirSync(packs));
      await run('pnpm', ['pack', '--pack-destination', packs], { cwd: pkgDir });
      const made = readdirSync(packs).filter((f) => !before.has(f));
      expect(made, dir).toHaveLength(1);
      tarballs[JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8')).name] = `file:${join(packs, made[0])}`;
    }
    const { stdout: list } = await run('tar', ['-tzf', tarballs['@nerva/server'].slice(5)]);
    expect(list).toContain('package/embedded/tiny-shakespeare-qwen3/model.safetensors');
    expect(list).toContain('package/bin/nerva.js');
    // Packing leaves the checkout as it was: the copy of the weights went away again.
    expect(readdirSync(join(ROOT, 'packages/server'))).not.toContain('embedded');

    const app = join(tmp, 'app');
    mkdirSync(app);
    // The unpublished @nerva/* dependencies of the tarballs resolve to the other tarballs.
    writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', private: true, dependencies: { '@nerva/server': tarballs['@nerva/server'] }, pnpm: { overrides: tarballs } }));
    const install = await run('pnpm', ['install', '--prefer-offline', '--ignore-workspace'], { cwd: app, maxBuffer: 1 << 24 });
    expect(install.stdout + install.stderr).not.toMatch(/Failed to create bin/);

    const env = { ...process.env, NERVA_DEFAULT_MODEL: '' };
    const { stdout } = await run('npx', ['--no', '@nerva/server', 'run', '--backend', 'cpu', '--max-tokens', '8', '--seed', '1', '--json'], { cwd: app, env, maxBuffer: 1 << 24 });
    const j = lastJson(stdout);
    expect(j.model.startsWith(realpathSync(join(app, 'node_modules')))).toBe(true);
    expect(j.model).toMatch(/embedded[/\\]tiny-shakespeare-qwen3$/);
    expect(j.token_ids).toHaveLength(8);
    expect(j.text.length).toBeGreaterThan(0);
    const { stdout: version } = await run('npx', ['--no', '--', '@nerva/server', '--version'], { cwd: app, env });
    expect(version.trim()).toBe(JSON.parse(readFileSync(join(ROOT, 'packages/server/package.json'), 'utf8')).version);
  }, 300_000);
});
