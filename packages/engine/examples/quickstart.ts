import { Engine } from '@nerva/engine';

/** Stream 32 sampled tokens from a model folder and return the text. */
export async function quickstart(model: string): Promise<string> {
  const engine = await Engine.create({ model, backend: 'auto' });
  let text = '';
  for await (const token of engine.generate('ROMEO:', { maxTokens: 32, temperature: 0.8, seed: 1 })) {
    text += token.text;
  }
  engine.dispose();
  return text;
}
