// GPU machine: the decode benchmark (same code as `nerva-bench decode`) -> one JSON line per run,
// appended to $OUT/bench.jsonl.
//   bench.mjs MODEL_DIR [promptLen newTokens] [--profile]
import { appendFileSync } from 'node:fs';
import path from 'node:path';
import { decodeProbe } from '@nerva/bench';
import { GgufFile } from '@nerva/models';

const args = process.argv.slice(2);
const profile = args.includes('--profile');
const [model, pl, nt] = args.filter((x) => !x.startsWith('--'));
// NERVA_KV_DTYPE: the KV cache element type (auto, f32, bf16).
const kvCacheDtype = (process.env.NERVA_KV_DTYPE ?? 'auto') as 'auto' | 'f32' | 'bf16';
// NERVA_RUN_AHEAD=0: the engine waits for each step's tokens before enqueuing the next.
const runAhead = process.env.NERVA_RUN_AHEAD === '0' ? false : undefined;
// NERVA_RUN_AHEAD_STEPS: decode steps one replay enqueued ahead may run (engine default if unset).
const steps = process.env.NERVA_RUN_AHEAD_STEPS;
const runAheadSteps = steps ? Number(steps) : undefined;
const r = await decodeProbe({ model, backend: 'cuda', promptLen: Number(pl ?? 128), newTokens: Number(nt ?? 256), profile, kvCacheDtype, runAhead, runAheadSteps });
// A GGUF file: its tensor bytes are what a quantized decode must read a token (the quantized-bytes
// roofline), whatever the engine stored (a mixed fused group falls back to f32).
if (model.endsWith('.gguf')) {
  const f = await GgufFile.open(model);
  const tensorBytes = f.tensors.reduce((n, t) => n + t.byteLength, 0);
  await f.close();
  const rec = r as unknown as Record<string, unknown>;
  const bw = Number(rec.copy_bandwidth_gbs) * 1e9;
  rec.gguf_tensor_bytes = tensorBytes;
  rec.quantized_roofline_tok_s = Math.round((bw / tensorBytes) * 100) / 100;
  rec.fraction_of_quantized_roofline = Math.round((Number(rec.tokens_per_s) / (bw / tensorBytes)) * 1000) / 1000;
}
const line = JSON.stringify(r);
console.log(line);
appendFileSync(path.join(process.env.OUT ?? '.', 'bench.jsonl'), line + '\n');
