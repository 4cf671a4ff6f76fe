// What one host-sampled row costs (a row with logprobs, penalties or a logit bias is sampled on
// the host, and its step waits for it): HostSampler.sample over a Qwen-sized vocabulary, per
// sampling setting, and core's sampleRow on the same row both ways: as a float32 row (the radix
// sort) and as a float64 copy (the comparator sort, the same rule). One JSON line per case.
//   npx tsx packages/engine/bench/host-sample.ts [--vocab 151936] [--limit 151669] [--repeats 20]
import { sampleRow } from '@nerva/core';
import { HostSampler } from '../src/host-sampler.js';
import { resolveSamplingParams, type SamplingParams } from '../src/sampling-params.js';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const vocab = arg('vocab', 151936);
const limit = arg('limit', 151669);
const repeats = arg('repeats', 20);

// A flat row (random logits over a few units): the hardest case for cuts that stop early.
let seed = 1;
const rnd = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
const logits = Float32Array.from({ length: vocab }, () => rnd() * 10 - 5);
const time = (fn: (i: number) => void) => {
  fn(0);
  const t0 = performance.now();
  for (let i = 0; i < repeats; i++) fn(i);
  return Math.round(((performance.now() - t0) / repeats) * 1000) / 1000;
};

const sampler = new HostSampler(vocab, limit);
const seen = { all: new Map([[5, 2]]), output: new Map([[5, 1]]) };
const cases: [string, SamplingParams][] = [
  ['temperature 1', { temperature: 1 }],
  ['temperature 1, logprobs with top 5', { temperature: 1, logprobs: true, topLogprobs: 5 }],
  ['temperature 1, presence penalty', { temperature: 1, presencePenalty: 0.5 }],
  ['temperature 100', { temperature: 100 }],
  ['top_k 20', { temperature: 1, topK: 20 }],
  ['top_p 0.9', { temperature: 1, topP: 0.9 }],
  ['min_p 0.05', { temperature: 1, minP: 0.05 }],
];
for (const [name, o] of cases) {
  const p = resolveSamplingParams(o, { maxTokens: 16, vocabSize: vocab });
  const hostMs = time((i) => sampler.sample(logits, 0, p, i, seen));
  const row = logits.subarray(0, limit);
  const row64 = Float64Array.from(row);
  const rule = { temperature: p.temperature, topK: p.topK, topP: p.topP, minP: p.minP };
  const f32Ms = time((i) => sampleRow(row, 0, limit, rule, (i + 0.5) / repeats));
  const f64Ms = time((i) => sampleRow(row64, 0, limit, rule, (i + 0.5) / repeats));
  console.log(JSON.stringify({ probe: 'host_sample', case: name, vocab, limit, repeats, host_sampler_ms: hostMs, sample_row_f32_ms: f32Ms, sample_row_comparator_ms: f64Ms, speedup: Math.round((f64Ms / f32Ms) * 100) / 100 }));
}
