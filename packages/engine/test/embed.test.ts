import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Checkpoint, SafetensorsFile } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DeviceBuffer } from '@nerva/core';
import { EmbeddingConfigError, Engine, InvalidParamsError, readEmbeddingConfig, type Request, type Scheduler } from '../src/index.js';
import { type EmbeddingContext, EmbeddingJobs } from '../src/embedding-jobs.js';
import { DEFAULT_MODEL, fixtureModels, MODELS, nonEmpty, type ReferenceCase } from './fixtures.js';

// The engine's float32 logits of the fixtures are within 1e-6 (relative to the largest) of
// transformers' float64 ones (parity.test.ts measures 4.6e-7 at worst). The embedding's hidden
// state times the LM head, summed here in float64, adds at most one float32 rounding less than the
// engine's logits have, so the same bound holds.
const LOGITS_REL_BOUND = 1e-6;

/** One float32 ulp at |v| (the spacing of float32 values around v). */
function ulp32(v: number): number {
  const a = Math.abs(v);
  if (a < 2 ** -126) return 2 ** -149;
  return 2 ** (Math.floor(Math.log2(a)) - 23);
}

/** Every KV block is back in the pool and no sequence holds any. */
function expectAllFree(e: Engine): void {
  const s = e.kv.stats();
  expect(s.sequences).toBe(0);
  expect(s.freeBlocks).toBe(s.totalBlocks - 1);
  e.kv.checkInvariants();
}

/** The LM head of a checkpoint as float32 [vocab, hidden]: lm_head.weight, or the tied embedding. */
async function lmHead(dir: string): Promise<Float32Array> {
  const ck = await Checkpoint.open(dir);
  try {
    return await ck.readF32(ck.has('lm_head.weight') ? 'lm_head.weight' : 'model.embed_tokens.weight');
  } finally {
    await ck.close();
  }
}

describe.each(fixtureModels())('embeddings are the hidden states of the logits transformers computed: %s', (name) => {
  const dir = join(MODELS, name);
  const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: ReferenceCase[] };
  let engine: Engine;
  let refFile: SafetensorsFile;
  let head: Float32Array;
  beforeAll(async () => {
    engine = await Engine.create({ model: dir, backend: 'cpu' });
    refFile = await SafetensorsFile.open(join(dir, 'reference.safetensors'));
    head = await lmHead(dir);
  });
  afterAll(async () => {
    engine?.dispose();
    await refFile?.close();
  });

  it.each(nonEmpty(ref.cases, `cases in ${name}/reference.json`).map((c, i) => [i, c] as const))('case %i: hidden state x LM head = the engine\'s logits = transformers\' float64 logits', async (_i, c) => {
    // Last-token pooling, not normalized: the final hidden state of the last prompt position.
    const r = await engine.embed([c.prompt_ids], { pooling: 'last', normalize: false });
    const h = r.embeddings[0];
    const H = engine.spec.hiddenSize;
    const V = engine.spec.vocabSize;
    expect(h.length).toBe(H);
    expect(r.promptTokens).toEqual([c.prompt_ids.length]);
    const logits = new Float64Array(V);
    for (let v = 0; v < V; v++) {
      let acc = 0;
      for (let k = 0; k < H; k++) acc += h[k] * head[v * H + k];
      logits[v] = acc;
    }
    // The engine's own logits of that position (what parity.test.ts compares with transformers):
    // the same products, summed in float64 and rounded once to float32 by the CPU backend; a sum
    // order of its own may move a rounding by one ulp, never more (measured: 0 ulps on every case).
    const out = await engine.submit(c.prompt_ids, { temperature: 0, maxTokens: 1, ignoreEos: true, returnPromptLogits: true }).done;
    const engineLogits = out.promptLogits!;
    expect(engineLogits.length).toBe(V);
    let worstUlps = 0;
    for (let v = 0; v < V; v++) worstUlps = Math.max(worstUlps, Math.abs(Math.fround(logits[v]) - engineLogits[v]) / ulp32(engineLogits[v]));
    expect(worstUlps).toBeLessThanOrEqual(1);
    // And transformers' float64 logits directly.
    const want = await refFile.readF32(c.logits_tensor);
    let maxAbs = 0;
    let maxErr = 0;
    for (let v = 0; v < V; v++) {
      maxAbs = Math.max(maxAbs, Math.abs(want[v]));
      maxErr = Math.max(maxErr, Math.abs(logits[v] - want[v]));
    }
    expect(maxErr).toBeLessThanOrEqual(LOGITS_REL_BOUND * maxAbs);
    expectAllFree(engine);
  });
});

/** Deterministic token ids in [1, vocab). */
function ids(n: number, seed: number, vocab: number): number[] {
  let x = seed >>> 0 || 1;
  return Array.from({ length: n }, () => {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    return 1 + ((x >>> 8) % (vocab - 1));
  });
}

describe('batched embeddings equal embeddings alone (CPU: bit for bit)', () => {
  // The CPU backend computes every row alone (float64 accumulation, one float32 rounding per op):
  // a row's values do not depend on the rows beside it or on how its prompt was chunked, and the
  // mean adds block sums in position order, so batching changes no bit.
  const dir = join(MODELS, 'tiny-random-qwen3');
  let engine: Engine;
  let chunked: Engine;
  let inputs: number[][];
  beforeAll(async () => {
    engine = await Engine.create({ model: dir, backend: 'cpu', maxNumSeqs: 8 });
    // 24-token steps: the longer inputs are prefilled in chunks, beside the others' chunks.
    chunked = await Engine.create({ model: dir, backend: 'cpu', maxNumSeqs: 8, maxNumBatchedTokens: 24 });
    const V = engine.spec.vocabSize;
    inputs = [ids(1, 1, V), ids(7, 2, V), ids(16, 3, V), ids(33, 4, V), ids(70, 5, V)];
  });
  afterAll(() => {
    engine?.dispose();
    chunked?.dispose();
  });

  it.each(['last', 'mean'] as const)('%s pooling: together, beside a generation, and chunked', async (pooling) => {
    const alone: Float32Array[] = [];
    for (const x of inputs) alone.push((await engine.embed([x], { pooling })).embeddings[0]);
    const together = await engine.embed(inputs, { pooling });
    expect(together.embeddings).toEqual(alone);
    expect(together.promptTokens).toEqual(inputs.map((x) => x.length));
    // Beside a generation request, in the same steps.
    const gen = engine.submit(ids(20, 9, engine.spec.vocabSize), { temperature: 0, maxTokens: 30, ignoreEos: true });
    const beside = await engine.embed(inputs.slice().reverse(), { pooling });
    expect(beside.embeddings).toEqual(alone.slice().reverse());
    await gen.done;
    // Prompts cut in chunks and mixed with other inputs' chunks.
    const c = await chunked.embed(inputs, { pooling });
    expect(c.embeddings).toEqual(alone);
    expectAllFree(engine);
    expectAllFree(chunked);
  });

  it('mean pooling is the mean of the prefixes\' last-token states (causal attention)', async () => {
    const x = inputs[3];
    const mean = (await engine.embed([x], { pooling: 'mean', normalize: false })).embeddings[0];
    const prefixes = (await engine.embed(x.map((_, k) => x.slice(0, k + 1)), { pooling: 'last', normalize: false })).embeddings;
    const H = engine.spec.hiddenSize;
    for (let k = 0; k < H; k++) {
      let s = 0;
      for (const p of prefixes) s += p[k];
      // The same float32 values summed in float64 in another order: one float32 rounding apart at most.
      expect(Math.abs(mean[k] - s / x.length)).toBeLessThanOrEqual(ulp32(s / x.length));
    }
  });

  it('normalize gives the unit vector of the raw state; the default here is raw (no modules.json)', async () => {
    const raw = (await engine.embed([inputs[2]])).embeddings[0];
    const explicitRaw = (await engine.embed([inputs[2]], { normalize: false, pooling: 'last' })).embeddings[0];
    expect(raw).toEqual(explicitRaw);
    const unit = await engine.embed([inputs[2]], { normalize: true });
    expect(unit.normalized).toBe(true);
    let ss = 0;
    for (const v of raw) ss += v * v;
    const norm = Math.sqrt(ss);
    for (let k = 0; k < raw.length; k++) expect(unit.embeddings[0][k]).toBe(Math.fround(raw[k] * (1 / norm)));
    await expect(engine.embeddingConfig()).resolves.toEqual({ pooling: 'last', normalize: false, source: 'default' });
  });

  it('mean and last pooling survive preemption by recompute (mean: its own cached blocks found again)', async () => {
    // 8 usable blocks of 16 tokens: a generation growing to 120 tokens (8 blocks) beside 100-token
    // inputs (7 blocks): the younger inputs are preempted and computed again.
    const kvBytesPerBlock = engine.kvCacheBytes / engine.numBlocks;
    const tight = await Engine.create({ model: dir, backend: 'cpu', blockSize: engine.kv.blockSize, kvCacheBytes: 9 * kvBytesPerBlock + 1, maxNumBatchedTokens: 32 });
    try {
      expect(tight.numBlocks).toBe(9);
      // The folder's embedding config read first, so each call queues its inputs before the next step.
      await tight.embeddingConfig();
      let preemptions = 0;
      tight.onStep((s) => (preemptions = s.preemptions));
      const V = engine.spec.vocabSize;
      const long = [ids(100, 11, V), ids(100, 12, V)];
      for (const pooling of ['mean', 'last'] as const) {
        const before = preemptions;
        const want = await engine.embed(long, { pooling });
        const gen = tight.submit(ids(40, 13, V), { temperature: 0, maxTokens: 80, ignoreEos: true });
        const got = await tight.embed(long, { pooling });
        await gen.done;
        expect(got.embeddings).toEqual(want.embeddings);
        expect(preemptions).toBeGreaterThan(before);
      }
      expectAllFree(tight);
    } finally {
      tight.dispose();
    }
  });

  it('an aborted call rejects and frees its KV blocks; the engine serves on', async () => {
    const ac = new AbortController();
    const p = engine.embed([ids(70, 21, engine.spec.vocabSize), ids(70, 22, engine.spec.vocabSize)], { signal: ac.signal });
    ac.abort(new Error('client went away'));
    await expect(p).rejects.toThrow('client went away');
    await engine.idle();
    expectAllFree(engine);
    const after = await engine.embed([inputs[1]]);
    expect(after.embeddings[0].length).toBe(engine.spec.hiddenSize);
  });
});

describe('embedding inputs and options are checked', () => {
  let engine: Engine;
  beforeAll(async () => {
    engine = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', maxModelLen: 64 });
  });
  afterAll(() => engine?.dispose());

  it('texts are tokenized with the tokenizer (special tokens as Hugging Face adds them)', async () => {
    const r = await engine.embed(['ROMEO:', 'JULIET:\nAy me']);
    expect(r.promptTokens).toEqual([engine.encode('ROMEO:').length, engine.encode('JULIET:\nAy me').length]);
    const byIds = await engine.embed([engine.encode('ROMEO:')]);
    expect(byIds.embeddings[0]).toEqual(r.embeddings[0]);
  });

  it('a tokenizer that appends its end-of-text token (Qwen3-Embedding\'s TemplateProcessing): last-token pooling reads that token', async () => {
    const d = mkdtempSync(join(tmpdir(), 'nerva-embed-eos-'));
    try {
      for (const f of ['config.json', 'model.safetensors', 'tokenizer_config.json']) copyFileSync(join(DEFAULT_MODEL, f), join(d, f));
      const tok = JSON.parse(readFileSync(join(DEFAULT_MODEL, 'tokenizer.json'), 'utf8')) as Record<string, unknown>;
      const eos = '<|endoftext|>';
      tok.post_processor = {
        type: 'Sequence',
        processors: [
          tok.post_processor,
          {
            type: 'TemplateProcessing',
            single: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: eos, type_id: 0 } }],
            pair: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: eos, type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }, { SpecialToken: { id: eos, type_id: 1 } }],
            special_tokens: { [eos]: { id: eos, ids: [0], tokens: [eos] } },
          },
        ],
      };
      writeFileSync(join(d, 'tokenizer.json'), JSON.stringify(tok));
      const e = await Engine.create({ model: d, backend: 'cpu', maxModelLen: 64 });
      try {
        const plain = engine.encode('ROMEO:');
        expect(e.encode('ROMEO:')).toEqual([...plain, 0]);
        const r = await e.embed(['ROMEO:']);
        expect(r.promptTokens).toEqual([plain.length + 1]);
        expect(r.embeddings[0]).toEqual((await engine.embed([[...plain, 0]])).embeddings[0]);
      } finally {
        e.dispose();
      }
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });

  const bad: [string, unknown, object, string][] = [
    ['no inputs', [], {}, 'input'],
    ['not an array', 'ROMEO:', {}, 'input'],
    ['an empty input', [[1, 2], []], {}, 'input'],
    ['a token id outside the vocabulary', [[1, 999999]], {}, 'input'],
    ['a negative token id', [[-1]], {}, 'input'],
    ['an input longer than the model takes', [Array.from({ length: 65 }, () => 1)], {}, 'input'],
    ['an unknown pooling', [[1]], { pooling: 'cls' }, 'pooling'],
    ['normalize not a boolean', [[1]], { normalize: 'yes' }, 'normalize'],
    ['dimensions zero', [[1]], { dimensions: 0 }, 'dimensions'],
    ['dimensions on a model that is not Matryoshka', [[1]], { dimensions: 8 }, 'dimensions'],
    ['priority a float', [[1]], { priority: 0.5 }, 'priority'],
  ];
  it.each(bad)('%s → InvalidParamsError naming %#', async (_name, inputs, o, param) => {
    const err = await engine.embed(inputs as number[][], o).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(InvalidParamsError);
    expect((err as InvalidParamsError).param).toBe(param);
    expectAllFree(engine);
  });

  it('a stage pipeline refuses embeddings with a coded error (not implemented there)', async () => {
    const p = await Engine.create({ model: DEFAULT_MODEL, backend: 'cpu', pipelineParallel: 2, maxModelLen: 64 });
    try {
      await expect(p.embed([[1, 2, 3]])).rejects.toMatchObject({ code: 'UNSUPPORTED' });
    } finally {
      p.dispose();
    }
  });

  it('an input of exactly the maximum length is taken', async () => {
    const r = await engine.embed([Array.from({ length: 64 }, (_, i) => 1 + (i % 50))]);
    expect(r.promptTokens).toEqual([64]);
    expectAllFree(engine);
  });
});

describe('the model folder says how to pool (sentence-transformers files)', () => {
  const src = join(MODELS, 'tiny-random-qwen3');
  const dirs: string[] = [];
  /** A copy of the fixture model with extra files (the weights must lie inside the folder). */
  function folder(files: Record<string, string>): string {
    const d = mkdtempSync(join(tmpdir(), 'nerva-embed-'));
    dirs.push(d);
    for (const f of ['config.json', 'model.safetensors']) copyFileSync(join(src, f), join(d, f));
    for (const [name, text] of Object.entries(files)) {
      mkdirSync(join(d, name, '..'), { recursive: true });
      writeFileSync(join(d, name), text);
    }
    return d;
  }
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });
  const modules = (...types: string[]) =>
    JSON.stringify(types.map((t, i) => ({ idx: i, name: String(i), path: t === 'Pooling' ? '1_Pooling' : t === 'Transformer' ? '' : `${i}_${t}`, type: `sentence_transformers.models.${t}` })));
  const pooling = (flags: Record<string, unknown>) => JSON.stringify({ word_embedding_dimension: 64, pooling_mode_cls_token: false, pooling_mode_mean_tokens: false, pooling_mode_max_tokens: false, pooling_mode_mean_sqrt_len_tokens: false, pooling_mode_weightedmean_tokens: false, pooling_mode_lasttoken: false, include_prompt: true, ...flags });
  const hidden = (): number => (JSON.parse(readFileSync(join(src, 'config.json'), 'utf8')) as { hidden_size: number }).hidden_size;

  it('modules.json with mean Pooling and Normalize: the default is mean pooling, unit length', async () => {
    const H = hidden();
    const d = folder({ 'modules.json': modules('Transformer', 'Pooling', 'Normalize'), '1_Pooling/config.json': pooling({ word_embedding_dimension: H, pooling_mode_mean_tokens: true }) });
    const cfg = await readEmbeddingConfig(d, H);
    expect(cfg).toEqual({ pooling: 'mean', normalize: true, source: 'modules.json, 1_Pooling/config.json' });
    const st = await Engine.create({ model: d, backend: 'cpu' });
    const plain = await Engine.create({ model: src, backend: 'cpu' });
    try {
      const x = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]];
      const byConfig = await st.embed(x);
      expect(byConfig.pooling).toBe('mean');
      expect(byConfig.normalized).toBe(true);
      expect(byConfig.embeddings).toEqual((await plain.embed(x, { pooling: 'mean', normalize: true })).embeddings);
    } finally {
      st.dispose();
      plain.dispose();
    }
  });

  it('last-token pooling (Qwen3-Embedding\'s layout), and a lone 1_Pooling/config.json', async () => {
    const H = hidden();
    const q = folder({ 'modules.json': modules('Transformer', 'Pooling', 'Normalize'), '1_Pooling/config.json': pooling({ word_embedding_dimension: H, pooling_mode_lasttoken: true }) });
    expect(await readEmbeddingConfig(q, H)).toEqual({ pooling: 'last', normalize: true, source: 'modules.json, 1_Pooling/config.json' });
    const lone = folder({ '1_Pooling/config.json': pooling({ pooling_mode_mean_tokens: true, word_embedding_dimension: H }) });
    expect(await readEmbeddingConfig(lone, H)).toEqual({ pooling: 'mean', normalize: false, source: '1_Pooling/config.json' });
  });

  it('Matryoshka dimensions from config.json: truncated and renormalized; others refused', async () => {
    const H = hidden();
    const config = { ...(JSON.parse(readFileSync(join(src, 'config.json'), 'utf8')) as object), matryoshka_dimensions: [16, 32] };
    const d = folder({});
    writeFileSync(join(d, 'config.json'), JSON.stringify(config));
    expect((await readEmbeddingConfig(d, H)).matryoshka).toEqual([16, 32]);
    const e = await Engine.create({ model: d, backend: 'cpu' });
    try {
      const x = [[3, 1, 4, 1, 5, 9, 2, 6]];
      const full = (await e.embed(x)).embeddings[0];
      const r = await e.embed(x, { dimensions: 16 });
      expect(r.dimensions).toBe(16);
      expect(r.normalized).toBe(true);
      let ss = 0;
      for (let k = 0; k < 16; k++) ss += full[k] * full[k];
      const norm = Math.sqrt(ss);
      expect([...r.embeddings[0]]).toEqual([...full.subarray(0, 16)].map((v) => Math.fround(v * (1 / norm))));
      await expect(e.embed(x, { dimensions: 20 })).rejects.toThrow(/dimensions: must be one of the model's Matryoshka dimensions 16, 32/);
      await expect(e.embed(x, { dimensions: H + 1 })).rejects.toBeInstanceOf(InvalidParamsError);
    } finally {
      e.dispose();
    }
  });

  const broken: [string, Record<string, string>, RegExp][] = [
    ['a Dense module', { 'modules.json': modules('Transformer', 'Pooling', 'Dense'), '1_Pooling/config.json': pooling({ pooling_mode_lasttoken: true }) }, /modules\.json \(\[2\]\.type\): module "sentence_transformers\.models\.Dense" is not implemented/],
    ['CLS pooling', { 'modules.json': modules('Transformer', 'Pooling'), '1_Pooling/config.json': pooling({ pooling_mode_cls_token: true }) }, /1_Pooling\/config\.json \(pooling_mode_cls_token\): is not implemented/],
    ['two pooling modes', { 'modules.json': modules('Transformer', 'Pooling'), '1_Pooling/config.json': pooling({ pooling_mode_lasttoken: true, pooling_mode_mean_tokens: true }) }, /several pooling modes/],
    ['no pooling mode', { 'modules.json': modules('Transformer', 'Pooling'), '1_Pooling/config.json': pooling({}) }, /enables no pooling mode/],
    ['a Pooling module without its config', { 'modules.json': modules('Transformer', 'Pooling') }, /1_Pooling\/config\.json: the Pooling module has no config\.json/],
    ['modules.json not JSON', { 'modules.json': '[{' }, /modules\.json: not valid JSON/],
    ['modules.json not an array', { 'modules.json': '{}' }, /modules\.json: must be a JSON array/],
    ['a module without a type', { 'modules.json': '[{"path": ""}]' }, /modules\.json \(\[0\]\.type\): must be a string/],
    ['a pooling width other than the hidden size', { 'modules.json': modules('Transformer', 'Pooling'), '1_Pooling/config.json': pooling({ pooling_mode_lasttoken: true, word_embedding_dimension: 7 }) }, /word_embedding_dimension\): is 7, but the model's hidden size is/],
    ['bad matryoshka_dimensions', { 'config.json': '{"matryoshka_dimensions": [0]}' }, /config\.json \(matryoshka_dimensions\): must be a non-empty array/],
  ];
  it.each(broken)('%s → EmbeddingConfigError naming the file and field', async (_name, files, message) => {
    const d = folder(files);
    const err = await readEmbeddingConfig(d, hidden()).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(EmbeddingConfigError);
    expect((err as EmbeddingConfigError).code).toBe('EMBEDDING_CONFIG');
    expect((err as Error).message).toMatch(message);
  });

  it('an engine on a broken folder rejects embed with that error and keeps serving generation', async () => {
    const d = folder({ 'modules.json': modules('Transformer', 'Pooling', 'Dense'), '1_Pooling/config.json': pooling({ pooling_mode_lasttoken: true }) });
    const e = await Engine.create({ model: d, backend: 'cpu' });
    try {
      await expect(e.embed([[1, 2, 3]])).rejects.toBeInstanceOf(EmbeddingConfigError);
      const out = await e.submit([1, 2, 3], { temperature: 0, maxTokens: 2, ignoreEos: true }).done;
      expect(out.tokenIds.length).toBe(2);
      expectAllFree(e);
    } finally {
      e.dispose();
    }
  });
});

describe('mean pooling over a recomputation (EmbeddingJobs with a scripted pass)', () => {
  it('rows of a prompt recomputed from a cached block boundary are summed once', async () => {
    // The hidden state of position p is [p, 2p, 3p] here; a step hands the jobs the rows it computed.
    const H = 3;
    const bs = 4;
    const queued: Request[] = [];
    const removed: number[] = [];
    let stepRows: Float32Array = new Float32Array(0);
    let lastId = 0;
    /** The call reads the model's config first: wait until it has queued its requests. */
    const until = async (f: () => boolean) => {
      while (!f()) await new Promise((r) => setTimeout(r, 1));
    };
    const ctx = {
      spec: { hiddenSize: H, vocabSize: 100 },
      backend: { read: (_b: unknown, off: number, len: number) => stepRows.slice(off, off + len) },
      modelDir: join(MODELS, 'tiny-random-qwen3'),
      limits: { vocabSize: 100, maxModelLen: 64, numBlocks: 32, blockSize: bs, hasTokenizer: false },
      kv: { blockSize: bs },
      encode: () => [],
    } as unknown as EmbeddingContext;
    const jobs = new EmbeddingJobs(ctx, {
      scheduler: { add: (r: Request) => queued.push(r), remove: (r: Request) => removed.push(r.id) } as unknown as Scheduler,
      finalHidden: () => ({}) as DeviceBuffer,
      nextId: () => ++lastId,
      kick: () => {},
      batchChanged: () => {},
      disposed: () => false,
    });
    const p = jobs.embed([Array.from({ length: 10 }, () => 7)], { pooling: 'mean', normalize: false });
    await until(() => queued.length === 1);
    const req = queued[0];
    const step = (from: number, n: number) => {
      stepRows = new Float32Array(n * H);
      for (let j = 0; j < n; j++) for (let k = 0; k < H; k++) stepRows[j * H + k] = (from + j) * (k + 1);
      req.numComputedTokens = from;
      jobs.collect([{ req, numTokens: n }]);
      req.numComputedTokens = from + n;
    };
    step(0, 3);
    step(3, 4); // covered: 7 (blocks 0 and 1, the second partly)
    step(4, 6); // preempted, found its first block in the cache again: rows 4.. recomputed
    expect(jobs.finishRow(req)).toBe(true);
    const r = await p;
    // mean of 0..9 = 4.5
    expect([...r.embeddings[0]]).toEqual([4.5, 9, 13.5]);
    // Recomputation from inside a block cannot come from the cache: the call fails (not a wrong
    // mean) when that input finishes, and its other input, finishing in the same step, is dropped.
    const q = jobs.embed([[1, 2, 3, 4, 5, 6], [7, 8]], { pooling: 'mean' });
    await until(() => queued.length === 3);
    const [req2, req3] = queued.slice(1);
    stepRows = new Float32Array(7 * H);
    req2.numComputedTokens = 0;
    jobs.collect([{ req: req2, numTokens: 5 }]);
    req2.numComputedTokens = 3;
    req3.numComputedTokens = 0;
    jobs.collect([{ req: req2, numTokens: 3 }, { req: req3, numTokens: 2 }]);
    expect(jobs.finishRow(req2)).toBe(true);
    await expect(q).rejects.toThrow(/recomputation from position 3, inside a KV block/);
    expect(removed).toEqual([req.id, req2.id, req3.id]);
    expect(jobs.finishRow(req3)).toBe(true);
  });
});
