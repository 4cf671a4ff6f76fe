import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SafetensorsFile } from '@nerva/models';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine } from '../src/index.js';
import { fixtureModels, MODELS, nonEmpty, type ReferenceCase } from './fixtures.js';

// A float32 engine's logits differ from float64 by ~1e-6 relative; a greedy step whose top-2
// margin is below this bound may legitimately flip, so tokens are compared up to such a step.
const TOKEN_MARGIN_BOUND = 1e-4;
// The CPU backend accumulates in float64 and rounds each op's result to float32 once: measured
// max |logit - float64| / max |float64 logit| over every case of every fixture is 4.6e-7
// (tiny-random-llama case 2; 0.8e-7 to 4.6e-7 across them), so the stated 1e-6 holds with 2x room.
const LOGITS_REL_BOUND = 1e-6;

describe.each(fixtureModels())('CPU parity with transformers float64: %s', (name) => {
  const dir = join(MODELS, name);
  const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { cases: ReferenceCase[] };
  let engine: Engine;
  let logitsFile: SafetensorsFile;
  beforeAll(async () => {
    engine = await Engine.create({ model: dir, backend: 'cpu' });
    logitsFile = await SafetensorsFile.open(join(dir, 'reference.safetensors'));
  });
  afterAll(async () => {
    engine?.dispose();
    await logitsFile?.close();
  });

  it.each(nonEmpty(ref.cases, `cases in ${name}/reference.json`).map((c, i) => [i, c] as const))('case %i: greedy tokens and last-position logits', async (_i, c) => {
    const out = await engine.submit(c.prompt_ids, {
      temperature: 0,
      maxTokens: c.greedy_f64.length,
      ignoreEos: true,
      returnPromptLogits: true,
    }).done;
    let comparable = c.greedy_f64.length;
    const low = c.step_top2_margin.findIndex((m) => m < TOKEN_MARGIN_BOUND);
    if (low >= 0) comparable = low + 1; // the step itself may flip; everything before must agree
    expect(comparable).toBeGreaterThan(0);
    expect(out.tokenIds.slice(0, comparable)).toEqual(c.greedy_f64.slice(0, comparable));

    const want = await logitsFile.readF32(c.logits_tensor);
    const got = out.promptLogits!;
    expect(got.length).toBe(want.length);
    let maxAbs = 0;
    let maxErr = 0;
    for (let i = 0; i < want.length; i++) {
      maxAbs = Math.max(maxAbs, Math.abs(want[i]));
      maxErr = Math.max(maxErr, Math.abs(got[i] - want[i]));
    }
    expect(maxErr).toBeLessThanOrEqual(LOGITS_REL_BOUND * maxAbs);
  });
});
