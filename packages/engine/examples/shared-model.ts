import { NervaModel } from '@nerva/engine';

/**
 * Load a model once and serve two contexts from its weights: each context has its own KV cache,
 * scheduler and step loop (say, one per tenant, or one with a long context beside one with many
 * short sequences), and reads the same weight buffers. Returns each context's greedy text.
 */
export async function sharedModel(model: string): Promise<{ chat: string; batch: string[] }> {
  const m = await NervaModel.load({ model, backend: 'auto' });
  const chat = m.createContext({ maxNumSeqs: 1, maxModelLen: 512 });
  const batch = m.createContext({ maxNumSeqs: 8 });
  const greedy = { maxTokens: 16, temperature: 0 };
  const [a, ...b] = await Promise.all([
    chat.submit('ROMEO:', greedy).done,
    ...['JULIET:', 'KING HENRY:', 'First Citizen:'].map((p) => batch.submit(p, greedy).done),
  ]);
  m.dispose(); // disposes both contexts, then frees the weights
  return { chat: a.text, batch: b.map((o) => o.text) };
}
