import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative as relativeTo } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { DEFAULT_CONFIG, loadConfigFile, mergeConfig } from '../src/config.js';
import { ConfigError } from '../src/errors.js';
import { modelConfigs } from '../src/model-set.js';
import { startServer, type RunningServer } from '../src/server.js';
import { CLI, FIXTURES, nervaFails, ROOT } from './cli-helpers.js';

const tmp = mkdtempSync(join(tmpdir(), 'nerva-multi-'));
const SHAKESPEARE = join(FIXTURES, 'models/tiny-shakespeare-qwen3');
const RANDOM = join(FIXTURES, 'models/tiny-random-qwen3');
const ref = (dir: string) => JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')).cases[0] as { prompt_ids: number[]; greedy_f64: number[] };

let server: RunningServer | undefined;
afterAll(async () => {
  await server?.shutdown();
  rmSync(tmp, { recursive: true, force: true });
});

function toml(text: string): string {
  const p = join(tmp, `nerva-${Math.random().toString(36).slice(2)}.toml`);
  writeFileSync(p, text);
  return p;
}
const configError = (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => e as ConfigError);

describe('[[models]] in the TOML file', () => {
  it('each table is a model with its own options over the top-level defaults', async () => {
    const p = toml(`backend = "cpu"\nmax_model_len = 512\n\n[[models]]\nmodel = "a"\nserved_model_name = "first"\nvram_budget = "64MiB"\n\n[[models]]\nmodel = "Org/Name"\nmax_model_len = 256\noffload_dir = "spill"\n`);
    const file = await loadConfigFile(p);
    expect(file.models).toEqual([
      { model: 'a', servedModelName: 'first', vramBudget: 64 * 2 ** 20 },
      // `model` stays as written (a name or a path, resolved at start); other paths resolve against the file.
      { model: 'Org/Name', maxModelLen: 256, offloadDir: join(p, '..', 'spill') },
    ]);
    const each = modelConfigs(mergeConfig(file, {}));
    expect(each.map((c) => [c.model, c.servedModelName, c.vramBudget, c.maxModelLen, c.backend])).toEqual([
      ['a', 'first', 64 * 2 ** 20, 512, 'cpu'],
      ['Org/Name', undefined, undefined, 256, 'cpu'],
    ]);
    expect(modelConfigs({ ...DEFAULT_CONFIG, model: 'x' })).toHaveLength(1);
  });

  it('malformed tables are errors naming the table and key', async () => {
    const cases: [string, string, RegExp][] = [
      ['[[models]]\nserved_model_name = "x"\n', 'models[0].model', /models\[0\] has no "model"/],
      ['[[models]]\nmodel = "a"\nport = 9000\n', 'models[0].port', /"port" is a server-wide key; set it at the top of the file/],
      ['[[models]]\nmodel = "a"\n[[models]]\nmodel = "b"\nvram_budgett = 1\n', 'models[1].vram_budgett', /unknown key "vram_budgett"/],
      ['[[models]]\nmodel = "a"\nvram_budget = "lots"\n', 'models[0].vram_budget', /must be a size/],
      ['[[models]]\nmodel = "a"\nserved_model_name = "x"\n[[models]]\nmodel = "b"\nserved_model_name = "x"\n', 'models[1].served_model_name', /"x" is used twice/],
      ['model = "a"\n[[models]]\nmodel = "b"\n', 'models', /give "model" or \[\[models\]\] tables, not both/],
      ['models = 3\n', 'models', /"models" must be a non-empty list/],
      ['models = [1]\n', 'models[0]', /must be a table/],
    ];
    for (const [text, key, msg] of cases) {
      const e = await configError(loadConfigFile(toml(text)));
      expect(e, text).toBeInstanceOf(ConfigError);
      expect(e?.key, text).toBe(key);
      expect(e?.message, text).toMatch(msg);
    }
    const named = await configError(Promise.resolve().then(() => modelConfigs({ ...DEFAULT_CONFIG, servedModelName: 'x', models: [{ model: 'a' }] })));
    expect(named?.key).toBe('served_model_name');
  });
});

describe('a server of two models', () => {
  const post = (path: string, body: unknown) => fetch(server!.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

  it('routes each request to the model it names, each with its own memory settings', async () => {
    server = await startServer({
      ...DEFAULT_CONFIG,
      port: 0,
      backend: 'cpu',
      models: [
        { model: SHAKESPEARE, servedModelName: 'shakespeare', vramBudget: 64 * 2 ** 20 },
        { model: RANDOM, servedModelName: 'random', maxModelLen: 128 },
      ],
    });
    await server.ready;
    expect(server.states.map((s) => s.modelName)).toEqual(['shakespeare', 'random']);

    const models = (await (await fetch(`${server.url}/v1/models`)).json()) as { data: { id: string; root: string; max_model_len: number }[] };
    expect(models.data.map((m) => [m.id, m.root])).toEqual([
      ['shakespeare', SHAKESPEARE],
      ['random', RANDOM],
    ]);
    expect(models.data[1].max_model_len).toBe(128);

    // Each model's greedy tokens are its transformers reference: the request went to the model it named.
    for (const [name, dir] of [
      ['shakespeare', SHAKESPEARE],
      ['random', RANDOM],
    ]) {
      const r = ref(dir);
      const res = await post('/v1/completions', { model: name, prompt: r.prompt_ids, max_tokens: 6, temperature: 0, return_token_ids: true });
      expect(res.status, name).toBe(200);
      const body = (await res.json()) as { model: string; choices: { token_ids: number[] }[] };
      expect(body.model).toBe(name);
      const ids = body.choices[0].token_ids;
      expect(ids.length, name).toBeGreaterThan(0);
      expect(ids, name).toEqual(r.greedy_f64.slice(0, ids.length));
    }

    const unknown = await post('/v1/completions', { model: 'nope', prompt: 'x' });
    expect(unknown.status).toBe(404);
    expect(((await unknown.json()) as { error: { message: string } }).error.message).toContain('This server serves `shakespeare`, `random`.');

    // The random model has no tokenizer: its chat is refused; the other model's chat answers.
    expect((await post('/v1/chat/completions', { model: 'random', messages: [{ role: 'user', content: 'hi' }] })).status).toBe(400);
    expect((await post('/v1/chat/completions', { model: 'shakespeare', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 })).status).toBe(200);

    // Memory per model: ?model= picks it; its own budget and context length.
    const mem = async (q: string) => (await fetch(`${server!.url}/v1/memory${q}`)).json() as Promise<Record<string, any>>;
    expect((await mem('?model=shakespeare')).vram_budget_bytes).toBe(64 * 2 ** 20);
    expect((await mem('?model=random')).vram_budget_bytes).toBeNull();
    const noModel = await fetch(`${server.url}/v1/memory`);
    expect(noModel.status).toBe(400);
    expect(((await noModel.json()) as { error: { code: string } }).error.code).toBe('model_required');

    expect((await fetch(`${server.url}/health`)).status).toBe(200);
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    expect(metrics).toContain('nerva:num_requests_running{model_name="shakespeare"}');
    expect(metrics).toContain('nerva:num_requests_running{model_name="random"}');
    // One exposition: each metric's TYPE line once.
    expect(metrics.split('\n').filter((l) => l === '# TYPE nerva:num_requests_running gauge')).toHaveLength(1);
    const generated = /^nerva:generation_tokens_total\{model_name="random"\} (\d+)$/m.exec(metrics);
    expect(Number(generated?.[1])).toBeGreaterThan(0);
  });
});

/** `nerva serve ARGS` until ready (its ready line matching `ready`), then its /v1/models ids; stopped with SIGTERM. */
async function serveIds(args: string[], ready: RegExp): Promise<string[]> {
  const child = spawn(process.execPath, [CLI, 'serve', '--backend', 'cpu', '--port', '0', '--no-access-log', ...args], { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] });
  let out = '';
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
  try {
    for (let i = 0; i < 600 && !/nerva: ready at/.test(out) && child.exitCode === null; i++) await new Promise((r) => setTimeout(r, 100));
    expect(out).toMatch(ready);
    const url = /nerva: ready at (http:\/\/\S+)\/v1/.exec(out)![1];
    const ids = ((await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] }).data.map((m) => m.id);
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    return ids;
  } finally {
    child.kill('SIGKILL');
  }
}

describe('nerva serve with several models', () => {
  it('--model given twice serves both under their names; --served-model-name with two models is an error', async () => {
    const err = await nervaFails(['serve', '--backend', 'cpu', '--port', '0', '--model', SHAKESPEARE, '--model', RANDOM, '--served-model-name', 'x']);
    expect(err?.code).toBe(1);
    expect(err?.stderr).toContain('--served-model-name names one model');

    expect(await serveIds(['--model', SHAKESPEARE, '--model', RANDOM], /\(the 2 models loaded in/)).toEqual(['tiny-shakespeare-qwen3', 'tiny-random-qwen3']);
  });

  it('serves the [[models]] of a config file, their paths relative to the file', async () => {
    const p = toml(`[[models]]\nmodel = "${relativeTo(tmp, RANDOM)}"\nserved_model_name = "r"\n\n[[models]]\nmodel = "${relativeTo(tmp, SHAKESPEARE)}"\nmax_model_len = 64\n`);
    expect(await serveIds(['--config', p], /\(the 2 models loaded in/)).toEqual(['r', 'tiny-shakespeare-qwen3']);
  });

  it('one model named in the file resolves against the file too; a flag replaces the file\'s models', async () => {
    const p = toml(`model = "${relativeTo(tmp, RANDOM)}"\n`);
    expect(await serveIds(['--config', p], /\(the model loaded in/)).toEqual(['tiny-random-qwen3']);
    const two = toml(`[[models]]\nmodel = "${relativeTo(tmp, RANDOM)}"\n[[models]]\nmodel = "${relativeTo(tmp, SHAKESPEARE)}"\n`);
    expect(await serveIds(['--config', two, '--model', SHAKESPEARE, '--served-model-name', 'only'], /\(the model loaded in/)).toEqual(['only']);
  });
});
