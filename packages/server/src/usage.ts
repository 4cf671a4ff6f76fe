import type { WorkerOutcome } from '@nerva/engine';
import type { ChoiceJob } from './generation.js';

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

/** Token counts of a response: each prompt counted once (n samples share it), every choice's output. */
export function usageOf(jobs: readonly ChoiceJob[], outcomes: readonly (WorkerOutcome | undefined)[]): Usage {
  const prompts = new Map<number, number>();
  let completion = 0;
  let cached = 0;
  jobs.forEach((j, k) => {
    prompts.set(j.promptIndex, j.promptIds.length);
    const o = outcomes[k];
    if (o) completion += o.tokenIds.length;
    if (o && j.index === 0) cached = o.numCachedTokens;
  });
  let prompt = 0;
  for (const n of prompts.values()) prompt += n;
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion, prompt_tokens_details: { cached_tokens: cached } };
}
