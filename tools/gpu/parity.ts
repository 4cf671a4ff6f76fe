// GPU machine: exactness of the engine on the CUDA backend.
//   parity.mjs fixtures <modelsDir>        every fixture model vs transformers float64 -> $OUT/parity.json
//   parity.mjs synth <config> <outDir>     writes a synthetic bf16 checkpoint (HF layout)
//   parity.mjs force <modelDir> <n>        prompt + n teacher-forced decode steps on CUDA; writes
//                                          <modelDir>/nerva-forced.{json,f32} (and -bf16.f32, bf16
//                                          numerics) for oracle_parity.py
//   parity.mjs paged <dir> [<dir> ...]     paged weights (memory OS) vs the resident run, greedy
//                                          tokens, at the smallest VRAM budget and at 4 GiB /
//                                          NERVA_PAGED_BUDGETS -> $OUT/paged.json
//   parity.mjs tiered <dir> [<dir> ...]    tiered KV (a hot budget of a few pages, the rest warm in
//                                          pinned memory, attended by the host and merged) vs all
//                                          hot: greedy tokens, last prompt position's logits, 1 and
//                                          4 concurrent requests -> $OUT/tiered.json
//                                          (NERVA_TIERED_LINK_SHARES=0,0.5,1: each budget per kvWarmLinkShare)
import { readdirSync, readFileSync, existsSync, writeFileSync, openSync, writeSync, closeSync } from 'node:fs';
import path from 'node:path';
import { Engine } from '@nerva/engine';
import { SafetensorsFile, writeSyntheticCheckpoint } from '@nerva/models';

const out = process.env.OUT ?? '.';
const [mode, a, b] = process.argv.slice(2);

interface Case {
  prompt_ids: number[];
  greedy_f64: number[];
  logits_tensor: string;
  bf16_agrees_for: number;
  greedy_bf16_gpu: number[];
}

/** One bf16 ulp at |v|. */
const bf16Ulp = (v: number) => 2 ** (Math.floor(Math.log2(Math.abs(v))) - 7);

/**
 * bf16 numerics against transformers' own bf16 greedy run, teacher-forced on its tokens: per step,
 * how many bf16 ulps transformers' token lies below our top logit (0: our argmax or tied).
 */
async function bf16Gaps(engine: Engine, c: Case): Promise<number[]> {
  const want = c.greedy_bf16_gpu;
  const o = await engine.submit(c.prompt_ids, { temperature: 0, maxTokens: want.length, ignoreEos: true, forceTokens: want, returnStepLogits: true }).done;
  return o.stepLogits!.map((l, k) => {
    let top = -Infinity;
    for (const v of l) top = Math.max(top, v);
    return (top - l[want[k]]) / bf16Ulp(top);
  });
}

async function fixtures(modelsDir: string): Promise<void> {
  const results: Record<string, unknown>[] = [];
  const bf16: Record<string, unknown>[] = [];
  let ok = true;
  for (const name of readdirSync(modelsDir).sort()) {
    const dir = path.join(modelsDir, name);
    if (!existsSync(path.join(dir, 'reference.json'))) continue;
    const ref = JSON.parse(readFileSync(path.join(dir, 'reference.json'), 'utf8')) as { cases: Case[] };
    const engine = await Engine.create({ model: dir, backend: 'cuda', deviceArenaBytes: 2 * 2 ** 30, maxModelLen: 512 });
    const ls = await SafetensorsFile.open(path.join(dir, 'reference.safetensors'));
    try {
      for (const [i, c] of ref.cases.entries()) {
        const o = await engine.submit(c.prompt_ids, { temperature: 0, maxTokens: c.greedy_f64.length, ignoreEos: true, returnPromptLogits: true }).done;
        let agree = 0;
        while (agree < c.greedy_f64.length && o.tokenIds[agree] === c.greedy_f64[agree]) agree++;
        const want = await ls.readF32(c.logits_tensor);
        let maxAbs = 0;
        let maxErr = 0;
        for (let k = 0; k < want.length; k++) {
          maxAbs = Math.max(maxAbs, Math.abs(want[k]));
          maxErr = Math.max(maxErr, Math.abs(o.promptLogits![k] - want[k]));
        }
        const rel = maxErr / maxAbs;
        const pass = agree >= Math.min(c.bf16_agrees_for, c.greedy_f64.length) && rel <= 1e-2;
        ok &&= pass;
        results.push({ model: name, case: i, agree_steps: agree, hf_bf16_agrees_for: c.bf16_agrees_for, steps: c.greedy_f64.length, logits_rel_err: rel, pass });
        console.log(`${name}#${i}: agree ${agree}/${c.greedy_f64.length} (HF bf16 ${c.bf16_agrees_for}), logits rel err ${rel.toExponential(2)} ${pass ? 'ok' : 'FAIL'}`);
      }
    } finally {
      engine.dispose();
      await ls.close();
    }
    // bf16 numerics: transformers' bf16 choices, up to one bf16 rounding (see engine's bf16-numerics test).
    const b16 = await Engine.create({ model: dir, backend: 'cuda', deviceArenaBytes: 2 * 2 ** 30, maxModelLen: 512, numerics: 'bf16' });
    try {
      for (const [i, c] of ref.cases.entries()) {
        const gaps = await bf16Gaps(b16, c);
        const worst = Math.max(...gaps);
        const same = gaps.filter((g) => g === 0).length;
        const pass = worst <= 1;
        ok &&= pass;
        bf16.push({ model: name, case: i, steps: gaps.length, steps_on_transformers_bf16_token: same, worst_gap_ulps: worst, pass });
        console.log(`${name}#${i} bf16 numerics: ${same}/${gaps.length} steps pick transformers-bf16's token, worst gap ${worst.toFixed(2)} ulp ${pass ? 'ok' : 'FAIL'}`);
      }
    } finally {
      b16.dispose();
    }
  }
  writeFileSync(path.join(out, 'parity.json'), JSON.stringify({ ok, results, bf16 }, null, 1));
  if (!ok) process.exitCode = 1;
}

async function synth(config: string, dir: string): Promise<void> {
  const t0 = performance.now();
  const r = await writeSyntheticCheckpoint({ config, outDir: dir, seed: 1 });
  console.log(`synth ${dir}: ${(r.totalBytes / 1e9).toFixed(2)} GB in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}

async function force(dir: string, steps: number, numerics: 'exact' | 'bf16'): Promise<void> {
  const engine = await Engine.create({ model: dir, backend: 'cuda', maxModelLen: 1024, maxNumSeqs: 8, numerics });
  const suffix = numerics === 'bf16' ? '-bf16' : '';
  try {
    let x = 12345;
    const rand = () => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) >>> 8) % engine.spec.vocabSize;
    const prompt = Array.from({ length: 64 }, rand);
    const forced = Array.from({ length: steps }, rand);
    const o = await engine.submit(prompt, { temperature: 0, maxTokens: steps, ignoreEos: true, forceTokens: forced, returnStepLogits: true }).done;
    const logits = o.stepLogits!;
    const fd = openSync(path.join(dir, `nerva-forced${suffix}.f32`), 'w');
    for (const l of logits) writeSync(fd, new Uint8Array(l.buffer, l.byteOffset, l.byteLength));
    closeSync(fd);
    writeFileSync(path.join(dir, 'nerva-forced.json'), JSON.stringify({ prompt, forced, steps: logits.length, vocab: engine.spec.vocabSize }));
    console.log(`forced ${logits.length} steps on ${dir} (numerics ${numerics})`);
  } finally {
    engine.dispose();
  }
}

/**
 * Batching on CUDA: the same seeded requests alone and 16 at a time (decode graphs per batch
 * bucket, cuBLAS above 8 rows). f32 activations are row-independent up to GEMV-vs-GEMM summation
 * order, so outputs should match except after a near-tie; report where they diverge.
 */
async function batch(dir: string): Promise<void> {
  const engine = await Engine.create({ model: dir, backend: 'cuda', deviceArenaBytes: 4 * 2 ** 30, maxModelLen: 512 });
  try {
    const prompts = ['ROMEO:', 'JULIET:', 'First Citizen:', 'KING RICHARD III:', 'O, ', 'Good my lord,', 'MENENIUS:', 'To be'];
    const reqs = Array.from({ length: 16 }, (_, i) => ({ prompt: prompts[i % prompts.length], seed: 1000 + i, temperature: i % 2 ? 0 : 0.8 }));
    const opts = (r: (typeof reqs)[number]) => ({ temperature: r.temperature, topK: 40, seed: r.seed, maxTokens: 48, ignoreEos: true });
    const alone: Awaited<ReturnType<Engine['submit']>['done']>[] = [];
    for (const r of reqs) alone.push(await engine.submit(r.prompt, opts(r)).done);
    const together = await Promise.all(reqs.map((r) => engine.submit(r.prompt, opts(r)).done));
    const firstDiff = together.map((o, i) => {
      const k = o.tokenIds.findIndex((t, j) => t !== alone[i].tokenIds[j]);
      return k;
    });
    const identical = firstDiff.filter((k) => k < 0).length;
    const s = together[0].ledger.summary();
    const res = { model: dir, requests: reqs.length, identical, first_divergence_step: firstDiff, graph_nodes: engine.graphNodes(), sample_ledger: s };
    writeFileSync(path.join(out, 'batch.json'), JSON.stringify(res, null, 1));
    console.log(`batch: ${identical}/${reqs.length} identical alone vs batched; graphs ${JSON.stringify(engine.graphNodes())}`);
  } finally {
    engine.dispose();
  }
}

/** The smallest VRAM budget the engine accepts for a model, read off the error a tiny one gives. */
async function minimumBudget(dir: string, base: Record<string, unknown>): Promise<number> {
  try {
    (await Engine.create({ model: dir, ...base, vramBudget: 2 ** 20 })).dispose();
  } catch (e) {
    const min = (e as { minimumBytes?: number }).minimumBytes;
    if (typeof min === 'number') return min;
    throw e;
  }
  throw new Error(`${dir}: a 1 MiB budget was accepted`);
}

async function paged(dirs: string[]): Promise<void> {
  const results: unknown[] = [];
  const prompt = Array.from({ length: 24 }, (_, i) => (i * 37 + 11) % 500); // every fixture vocab has 512+
  const n = 24;
  const base = { backend: 'cuda' as const, maxModelLen: 512, maxNumSeqs: 4, maxNumBatchedTokens: 64, kvCacheBytes: 64 * 2 ** 20 };
  for (const dir of dirs) {
    const name = path.basename(dir);
    const resident = await Engine.create({ model: dir, ...base });
    const want = (await resident.submit(prompt, { temperature: 0, maxTokens: n, ignoreEos: true }).done).tokenIds;
    const total = resident.memoryReport().weights.totalBytes;
    resident.dispose();
    const min = await minimumBudget(dir, base);
    const budgets = (process.env.NERVA_PAGED_BUDGETS ?? '').split(',').filter(Boolean).map(Number);
    for (const budget of [min, ...(budgets.length ? budgets : [4 * 2 ** 30])]) {
      if (budget > total + 2 * 2 ** 30 && budget !== min) continue;
      const e = await Engine.create({ model: dir, ...base, vramBudget: budget });
      const out = await e.submit(prompt, { temperature: 0, maxTokens: n, ignoreEos: true }).done;
      const r = e.memoryReport();
      const s = out.ledger.summary();
      const identical = out.tokenIds.length === want.length && out.tokenIds.every((t, i) => t === want[i]);
      const first = out.tokenIds.findIndex((t, i) => t !== want[i]);
      results.push({ model: name, budget, mode: r.mode, slots: r.weights.slots, streamed_blocks: r.weights.streamedBlocks, hot_bytes: r.weights.hotBytes, streamed_bytes: r.weights.streamedBytes, identical, first_divergence: first, decode_tok_s: s.decode_tokens_per_s, graph_replays_per_decode_token: s.graph_replays_per_decode_token, hot_path_allocations: s.hot_path_allocations, stalls: r.prefetch.stalls, notes: s.notes });
      console.log(`paged ${name} budget ${(budget / 2 ** 20).toFixed(1)} MiB: ${r.mode} slots ${r.weights.slots} streamed ${r.weights.streamedBlocks}: ${identical ? 'identical' : `DIVERGES at ${first}`} (${s.decode_tokens_per_s} tok/s)`);
      e.dispose();
    }
  }
  writeFileSync(path.join(out, 'paged.json'), JSON.stringify(results, null, 1));
}

async function tiered(dirs: string[]): Promise<void> {
  const results: unknown[] = [];
  const n = 24;
  const base = { backend: 'cuda' as const, maxModelLen: 1024, maxNumSeqs: 4, blockSize: 16, importanceCache: false as const };
  let ok = true;
  for (const dir of dirs) {
    const name = path.basename(dir.replace(/\/$/, ''));
    const allHot = await Engine.create({ model: dir, ...base });
    const vocab = allHot.spec.vocabSize;
    const promptLen = Math.min(Number(process.env.NERVA_TIERED_PROMPT ?? 300), allHot.maxModelLen - n - 1);
    const prompts = [0, 1, 2, 3].map((k) => Array.from({ length: promptLen - 17 * k }, (_, i) => (i * 37 + 11 + 101 * k) % Math.min(vocab, 500)));
    const want = await Promise.all(prompts.map((p) => allHot.submit(p, { temperature: 0, maxTokens: n, ignoreEos: true, returnPromptLogits: true }).done));
    const kvElem = allHot.backend.capabilities.numerics === 'bf16' ? 2 : 4;
    const pageBytes = 2 * allHot.spec.numLayers * allHot.spec.numKvHeads * allHot.spec.headDim * kvElem * 16;
    allHot.dispose();
    // NERVA_TIERED_LINK_SHARES (e.g. "0,0.5,1"): each hot budget once per kvWarmLinkShare (the
    // device's own share of the warm pages, staged through VRAM); default: the engine's default alone.
    const shares = process.env.NERVA_TIERED_LINK_SHARES ? process.env.NERVA_TIERED_LINK_SHARES.split(',').map(Number) : [undefined];
    for (const [hotPages, share] of [6, 12].flatMap((h) => shares.map((sh) => [h, sh] as const))) {
      const e = await Engine.create({
        model: dir,
        ...base,
        kvVramBudget: hotPages * pageBytes,
        kvHostBudget: 4 * (Math.ceil((promptLen + n) / 16) + 2) * pageBytes,
        ...(share !== undefined ? { kvWarmLinkShare: share } : {}),
      });
      try {
        const t0 = performance.now();
        const one = await e.submit(prompts[0], { temperature: 0, maxTokens: n, ignoreEos: true, returnPromptLogits: true }).done;
        if (!one.promptLogits) throw new Error(`${name}: the tiered run failed: ${JSON.stringify(one).slice(0, 400)}`);
        const oneMs = performance.now() - t0;
        const four = await Promise.all(prompts.map((p) => e.submit(p, { temperature: 0, maxTokens: n, ignoreEos: true }).done));
        // promptLogits: the raw logits of the last prompt position.
        const a = one.promptLogits!, w = want[0].promptLogits!;
        let maxErr = 0, maxAbs = 0;
        for (let i = 0; i < w.length; i++) {
          maxErr = Math.max(maxErr, Math.abs(a[i] - w[i]));
          maxAbs = Math.max(maxAbs, Math.abs(w[i]));
        }
        const same = (x: number[], y: number[]) => x.length === y.length && x.every((t, i) => t === y[i]);
        const kv = e.memoryReport().kv!;
        const r = {
          model: name, hot_pages: hotPages, prompt_len: promptLen, warm_link_share: share ?? 'default', staging_pages: kv.staging?.capacityPages ?? 0, staged_bytes: kv.staging?.stagedBytes ?? 0,
          identical_1: same(one.tokenIds, want[0].tokenIds),
          identical_4: four.every((o, i) => same(o.tokenIds, want[i].tokenIds)),
          last_logits_rel_err: maxErr / maxAbs,
          tiered_passes: kv.tieredPasses, demotions: kv.demotions, promotions: kv.promotions, warm_used: kv.tiers.warm.used,
          ms_one_request: Math.round(oneMs), hot_path_allocations: one.ledger.summary().hot_path_allocations,
        };
        if (!r.identical_1 || !r.identical_4 || !(r.last_logits_rel_err < 1e-4) || r.tiered_passes === 0) ok = false;
        results.push(r);
        console.log(`tiered ${name} hot ${hotPages} pages, link share ${share ?? 'default'}: ${JSON.stringify(r)}`);
      } finally {
        e.dispose();
      }
    }
  }
  writeFileSync(path.join(out, 'tiered.json'), JSON.stringify(results, null, 1));
  if (!ok) {
    console.error('tiered: a run differs from all-hot (or never used the warm tier)');
    process.exitCode = 1;
  }
}

if (mode === 'fixtures') await fixtures(a);
else if (mode === 'tiered') await tiered(process.argv.slice(3));
else if (mode === 'paged') await paged(process.argv.slice(3));
else if (mode === 'batch') await batch(a);
else if (mode === 'synth') await synth(a, b);
else if (mode === 'force') {
  await force(a, Number(b), 'exact');
  await force(a, Number(b), 'bf16');
}
else {
  console.error('usage: parity.mjs fixtures DIR | synth CONFIG OUT | force DIR N');
  process.exit(2);
}
