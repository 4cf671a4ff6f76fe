// GPU machine: exactness of the engine on the CUDA backend.
//   parity.mjs fixtures <modelsDir>        every fixture model vs transformers float64 -> $OUT/parity.json
//   parity.mjs synth <config> <outDir>     writes a synthetic bf16 checkpoint (HF layout)
//   parity.mjs force <modelDir> <n>        prompt + n teacher-forced decode steps on CUDA; writes
//                                          <modelDir>/nerva-forced.{json,f32} for oracle_parity.py
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
}

async function fixtures(modelsDir: string): Promise<void> {
  const results: Record<string, unknown>[] = [];
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
  }
  writeFileSync(path.join(out, 'parity.json'), JSON.stringify({ ok, results }, null, 1));
  if (!ok) process.exitCode = 1;
}

async function synth(config: string, dir: string): Promise<void> {
  const t0 = performance.now();
  const r = await writeSyntheticCheckpoint({ config, outDir: dir, seed: 1 });
  console.log(`synth ${dir}: ${(r.totalBytes / 1e9).toFixed(2)} GB in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}

async function force(dir: string, steps: number): Promise<void> {
  const engine = await Engine.create({ model: dir, backend: 'cuda', maxModelLen: 1024, maxNumSeqs: 8 });
  try {
    let x = 12345;
    const rand = () => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) >>> 8) % engine.spec.vocabSize;
    const prompt = Array.from({ length: 64 }, rand);
    const forced = Array.from({ length: steps }, rand);
    const o = await engine.submit(prompt, { temperature: 0, maxTokens: steps, ignoreEos: true, forceTokens: forced, returnStepLogits: true }).done;
    const logits = o.stepLogits!;
    const fd = openSync(path.join(dir, 'nerva-forced.f32'), 'w');
    for (const l of logits) writeSync(fd, new Uint8Array(l.buffer, l.byteOffset, l.byteLength));
    closeSync(fd);
    writeFileSync(path.join(dir, 'nerva-forced.json'), JSON.stringify({ prompt, forced, steps: logits.length, vocab: engine.spec.vocabSize }));
    console.log(`forced ${logits.length} steps on ${dir}`);
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
    const alone = [];
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

if (mode === 'fixtures') await fixtures(a);
else if (mode === 'batch') await batch(a);
else if (mode === 'synth') await synth(a, b);
else if (mode === 'force') await force(a, Number(b));
else {
  console.error('usage: parity.mjs fixtures DIR | synth CONFIG OUT | force DIR N');
  process.exit(2);
}
