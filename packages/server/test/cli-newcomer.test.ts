/**
 * What a new user hits first: the version, the default prompt, a model folder without a
 * tokenizer, silence while a checkpoint loads, `pnpm nerva` away from the repository root and
 * stopping it with a signal, the bin before a build, and `tokenize --chat` on a base model.
 * The `pnpm` cases need pnpm on PATH, as CI has (it runs through pnpm).
 */
import { execFile, spawn } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { CLI, FIXTURES, lastJson, nerva, nervaFails, ROOT } from './cli-helpers.js';
import { hubSnapshot } from './hub-cache.js';

const run = promisify(execFile);
const tmp = mkdtempSync(join(tmpdir(), 'nerva-newcomer-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const SERVER_PKG = JSON.parse(readFileSync(join(ROOT, 'packages/server/package.json'), 'utf8'));
const EMBEDDED = join(ROOT, 'models/tiny-shakespeare-qwen3');

/** A model folder whose config is fine, whose weights are garbage, and which has no tokenizer.json. */
function noTokenizerModel(): string {
  const dir = join(tmp, 'no-tokenizer');
  mkdirSync(dir, { recursive: true });
  copyFileSync(join(FIXTURES, 'models/tiny-random-qwen3/config.json'), join(dir, 'config.json'));
  writeFileSync(join(dir, 'model.safetensors'), Buffer.from([1, 2, 3]));
  return dir;
}

describe('nerva, as a newcomer runs it', () => {
  it('--version and -V print the package version', async () => {
    expect((await nerva(['--version'])).stdout.trim()).toBe(SERVER_PKG.version);
    expect((await nerva(['-V'])).stdout.trim()).toBe(SERVER_PKG.version);
  });

  it('run without a prompt starts from the default prompt its --help states, not from token 0', async () => {
    expect((await nerva(['run', '--help'])).stdout).toContain('prompt text (default: "ROMEO:")');
    const j = lastJson((await nerva(['run', '--backend', 'cpu', '--max-tokens', '4', '--json'])).stdout);
    const ids = JSON.parse((await nerva(['tokenize', '--text', 'ROMEO:'])).stdout).ids;
    expect(ids.length).toBeGreaterThan(1);
    expect(j.prompt_ids).toEqual(ids);
  });

  it('a missing tokenizer.json is reported before the weights load (the broken weights are never read)', async () => {
    const dir = noTokenizerModel();
    for (const args of [
      ['run', '--model', dir, '--prompt', 'hi'],
      ['run', '--model', dir],
      ['chat', '--model', dir],
    ]) {
      const err = await nervaFails([...args, '--backend', 'cpu']);
      expect(err?.code, args.join(' ')).toBe(1);
      expect(err?.stderr, args.join(' ')).toContain(`nerva: error: ${join(dir, 'tokenizer.json')} is missing`);
      expect(err?.stderr).not.toContain('model.safetensors');
      expect(err?.stderr).not.toContain('nerva: loading');
    }
    // Token ids need no tokenizer: then the weights are what fails, naming their file.
    const ids = await nervaFails(['run', '--model', dir, '--prompt-ids', '1,2', '--backend', 'cpu']);
    expect(ids?.stderr).toContain('model.safetensors');
  });

  it('a load says what it loads and how long it took, on stderr', async () => {
    const { stdout, stderr } = await nerva(['run', '--backend', 'cpu', '--max-tokens', '2', '--prompt', 'ROMEO:']);
    expect(stderr).toMatch(new RegExp(`^nerva: loading ${EMBEDDED.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} \\(13 MiB\\)$`, 'm'));
    expect(stderr).toMatch(/^nerva: loaded in \d+\.\d s$/m);
    expect(stdout).not.toContain('nerva:');
  });

  it('tokenize --chat renders a model without a chat template with the server\'s fallback template', async () => {
    const file = join(tmp, 'chat.json');
    writeFileSync(file, JSON.stringify([{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'hi' }]));
    const { stdout, stderr } = await nerva(['tokenize', '--chat', file]);
    const j = JSON.parse(stdout);
    expect(j.rendered).toBe('SYSTEM:\nBe brief.\n\nUSER:\nhi\n\nASSISTANT:\n');
    expect(j.ids.length).toBeGreaterThan(5);
    expect(stderr).toContain('has no chat template; using the plain "ROLE:" transcript template');
  });

  it('the bins are committed shims outside dist/ (no bin warnings before a build) that say when dist/ is missing', async () => {
    for (const [pkg, name] of [
      ['server', 'nerva'],
      ['bench', 'nerva-bench'],
    ]) {
      const json = JSON.parse(readFileSync(join(ROOT, 'packages', pkg, 'package.json'), 'utf8'));
      const bin = json.bin[name] as string;
      expect(bin.startsWith('./dist/')).toBe(false);
      expect(existsSync(join(ROOT, 'packages', pkg, bin))).toBe(true);
      expect(json.files).toContain(bin.split('/')[1]);
      // The shim alone, as an install sees it before `pnpm build`.
      const lone = join(tmp, `lone-${pkg}`, 'bin');
      mkdirSync(lone, { recursive: true });
      writeFileSync(join(tmp, `lone-${pkg}`, 'package.json'), '{"type":"module"}');
      copyFileSync(join(ROOT, 'packages', pkg, bin), join(lone, `${name}.js`));
      const err = await run(process.execPath, [join(lone, `${name}.js`), '--help']).then(
        () => undefined,
        (e: { code: number; stderr: string }) => e,
      );
      expect(err?.code).toBe(1);
      expect(err?.stderr).toContain(`@nerva/${pkg} is not built (no dist/cli.js); run \`pnpm build\` first`);
    }
    // The shim in the checkout runs the built CLI.
    expect((await run(process.execPath, [join(ROOT, 'packages/server/bin/nerva.js'), '--version'])).stdout.trim()).toBe(SERVER_PKG.version);
    expect(CLI).toBe(join(ROOT, 'packages/server/dist/cli.js'));
  });
});

describe('pnpm nerva away from the repository root', () => {
  const pnpmNerva = (cwd: string, args: string[]) => run('pnpm', ['--silent', 'nerva', ...args], { cwd, env: process.env });

  it('works from a folder and from a workspace package, with --model relative to that folder', async () => {
    const docs = join(ROOT, 'docs');
    const fromDocs = JSON.parse((await pnpmNerva(docs, ['tokenize', '--model', relative(docs, EMBEDDED), '--text', 'ROMEO:'])).stdout);
    const pkg = join(ROOT, 'packages/server');
    const fromPkg = JSON.parse((await pnpmNerva(pkg, ['tokenize', '--model', relative(pkg, EMBEDDED), '--text', 'ROMEO:'])).stdout);
    expect(fromDocs.ids.length).toBeGreaterThan(1);
    expect(fromPkg).toEqual(fromDocs);
  });

  it('SIGTERM to the pnpm process drains and stops the server; a hub model is served under its repo id', async () => {
    // A model named as an HF repo id, found in a hub cache laid out as huggingface_hub does.
    hubSnapshot(join(tmp, 'hub'), 'nerva-test/tiny-shakespeare', 'f00d', EMBEDDED);
    const child = spawn('pnpm', ['--silent', 'nerva', 'serve', '--backend', 'cpu', '--port', '0', '--model', 'nerva-test/tiny-shakespeare'], {
      cwd: ROOT,
      env: { ...process.env, HF_HUB_CACHE: join(tmp, 'hub') },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    const until = async (re: RegExp, what: string): Promise<RegExpMatchArray> => {
      for (let i = 0; i < 600; i++) {
        const m = re.exec(out);
        if (m) return m;
        await new Promise((r) => setTimeout(r, 100));
      }
      throw new Error(`no ${what} within 60 s; output:\n${out}`);
    };
    let pid = '';
    try {
      const [, url] = await until(/nerva: ready at (http:\/\/\S+)\/v1/, 'ready line');
      pid = (await until(/"pid":(\d+)/, 'server pid'))[1];
      expect(Number(pid)).not.toBe(child.pid);
      const models = (await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] };
      expect(models.data.map((m) => m.id)).toEqual(['nerva-test/tiny-shakespeare']);
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
      expect(out).toContain('nerva: SIGTERM: draining in-flight requests');
      // pnpm waited for the server: it is gone, not orphaned.
      let alive = true;
      for (let i = 0; i < 100 && alive; i++) {
        try {
          process.kill(Number(pid), 0);
          await new Promise((r) => setTimeout(r, 100));
        } catch {
          alive = false;
        }
      }
      expect(alive).toBe(false);
    } finally {
      // On a failure, leave no process behind: the server's, then pnpm's.
      for (const p of [Number(pid), child.pid]) {
        try {
          if (p) process.kill(p, 'SIGKILL');
        } catch {
          // Already gone.
        }
      }
    }
  });
});
