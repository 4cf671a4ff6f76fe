// GPU machine: the offload benchmark (same code as `nerva-bench offload`) on a synthetic checkpoint
// under a VRAM budget -> one JSON line, appended to $OUT/offload.jsonl (after the accelerate
// baseline's line when run.sh's offload step wrote one; NERVA_ACCELERATE_JSON names its file).
//   offload.mjs MODEL_DIR BUDGET [promptLen newTokens]      BUDGET: 4GiB, 4096MiB, 4G (= 4GiB), bytes
//   env NERVA_HOST_COMPUTE=auto|off|FRACTION (compute near data), NERVA_OFFLOAD_DIR (disk tier)
import { appendFileSync } from 'node:fs';
import path from 'node:path';
import { offloadProbe } from '@nerva/bench';
import { parseSize } from '@nerva/server';

function hostCompute(v: string | undefined): 'auto' | 'off' | number | undefined {
  if (v === undefined || v === '' || v === 'auto' || v === 'off') return v === '' ? undefined : (v as 'auto' | 'off' | undefined);
  const x = Number(v);
  if (!(x > 0 && x < 1)) throw new Error(`NERVA_HOST_COMPUTE must be auto, off or a fraction in (0, 1), got '${v}'`);
  return x;
}

const [model, budget, pl, nt] = process.argv.slice(2);
if (!model || !budget) throw new Error('usage: offload.mjs MODEL_DIR BUDGET [promptLen newTokens]');
const r = await offloadProbe({
  model,
  backend: 'cuda',
  vramBudget: parseSize(budget, 'BUDGET'),
  promptLen: Number(pl ?? 16),
  newTokens: Number(nt ?? 8),
  offloadDir: process.env.NERVA_OFFLOAD_DIR,
  // NERVA_HOST_COMPUTE: auto (default), off, or a forced fraction of MLP channels on the host.
  hostCompute: hostCompute(process.env.NERVA_HOST_COMPUTE),
  accelerateJson: process.env.NERVA_ACCELERATE_JSON,
});
const line = JSON.stringify(r);
console.log(line);
appendFileSync(path.join(process.env.OUT ?? '.', 'offload.jsonl'), line + '\n');
