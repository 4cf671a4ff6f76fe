// GPU machine: `nerva-bench long-context` (same code) on a synthetic checkpoint: decode at a long
// context all hot, then with the hot KV budget at 1/2 and 1/4 of the sequence's pages (the rest
// warm in pinned memory, attended by the host CPU and merged) -> one JSON line appended to
// $OUT/long-context.jsonl.
//   long_context.mjs MODEL_DIR CONTEXT NEW_TOKENS [ratios, default 2,4]
import { appendFileSync } from 'node:fs';
import path from 'node:path';
import { longContextProbe } from '@nerva/bench';

const [model, context, newTokens, ratios] = process.argv.slice(2);
if (!model || !context) throw new Error('usage: long_context.mjs MODEL_DIR CONTEXT NEW_TOKENS [ratios]');
const r = await longContextProbe({
  model,
  backend: 'cuda',
  context: Number(context),
  newTokens: Number(newTokens ?? 32),
  ratios: (ratios ?? '2,4').split(',').map(Number),
  hostReadGbps: process.env.NERVA_HOST_READ_GBPS ? Number(process.env.NERVA_HOST_READ_GBPS) : undefined,
  // NERVA_KV_DTYPE: auto (default), f32 or bf16 for every mix.
  kvCacheDtype: (process.env.NERVA_KV_DTYPE as 'auto' | 'f32' | 'bf16' | undefined) || undefined,
  // NERVA_LONGCTX_LINK_SHARES: kvWarmLinkShare values to run each ratio with, e.g. "0,0.3,0.5".
  linkShares: process.env.NERVA_LONGCTX_LINK_SHARES ? process.env.NERVA_LONGCTX_LINK_SHARES.split(',').map(Number) : undefined,
});
const line = JSON.stringify(r);
console.log(line);
appendFileSync(path.join(process.env.OUT ?? '.', 'long-context.jsonl'), line + '\n');
