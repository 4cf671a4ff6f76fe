// GPU machine: one model, two contexts on the CUDA backend. The weights are allocated once (the
// backend's live bytes after the model, then after each context), both contexts' memory reports
// count the one set, and each context's greedy tokens equal a lone engine's. -> $OUT/contexts.json
//   contexts.mjs MODEL_DIR...
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { createCudaBackend } from '@nerva/cuda-backend';
import { Engine, NervaModel } from '@nerva/engine';

const PROMPT = [1, 2, 3, 4, 5, 6, 7, 8];
const greedy = { maxTokens: 24, temperature: 0, ignoreEos: true };
const out: Record<string, unknown>[] = [];
let failed = false;
for (const dir of process.argv.slice(2)) {
  const lone = await Engine.create({ model: dir, backend: 'cuda', maxNumSeqs: 4 });
  const loneTokens = (await lone.submit(PROMPT, greedy).done).tokenIds;
  lone.dispose();

  const backend = createCudaBackend();
  const empty = backend.stats().liveBytes;
  const model = await NervaModel.load({ model: dir, backend });
  const loaded = backend.stats().liveBytes;
  const a = model.createContext({ maxNumSeqs: 4 });
  const afterA = backend.stats().liveBytes;
  const b = model.createContext({ maxNumSeqs: 4 });
  const afterB = backend.stats().liveBytes;
  const [ta, tb] = await Promise.all([a.submit(PROMPT, greedy).done, b.submit(PROMPT, greedy).done]);
  const reports = [a.memoryReport().weights.totalBytes, b.memoryReport().weights.totalBytes];
  const r = {
    probe: 'contexts',
    model: path.basename(dir),
    device: backend.capabilities.deviceName,
    weight_bytes: model.weightBytes,
    live_bytes_model: loaded - empty,
    live_bytes_context_a: afterA - loaded,
    live_bytes_context_b: afterB - afterA,
    report_weight_bytes: reports,
    weights_once: loaded - empty === model.weightBytes && afterA - loaded === afterB - afterA && reports[0] === reports[1],
    tokens_equal_lone: JSON.stringify(ta.tokenIds) === JSON.stringify(loneTokens) && JSON.stringify(tb.tokenIds) === JSON.stringify(loneTokens),
  };
  failed ||= !r.weights_once || !r.tokens_equal_lone;
  out.push(r);
  console.log(JSON.stringify(r));
  model.dispose();
  backend.dispose();
}
writeFileSync(path.join(process.env.OUT ?? '.', 'contexts.json'), JSON.stringify(out, null, 1));
process.exit(failed ? 1 : 0);
