// GPU machine: the decode benchmark (same code as `nerva-bench decode`) -> one JSON line per run,
// appended to $OUT/bench.jsonl.
//   bench.mjs MODEL_DIR [promptLen newTokens] [--profile]
import { appendFileSync } from 'node:fs';
import path from 'node:path';
import { decodeProbe } from '@nerva/bench';

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
const line = JSON.stringify(r);
console.log(line);
appendFileSync(path.join(process.env.OUT ?? '.', 'bench.jsonl'), line + '\n');
