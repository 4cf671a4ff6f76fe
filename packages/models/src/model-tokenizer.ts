import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { GgufFile } from './gguf/gguf-file.js';
import { ggufTokenizer, isGgufPath } from './gguf/gguf-model.js';
import { ggufTokenizerParts } from './gguf/gguf-tokenizer.js';
import { readOptionalModelText } from './model-file.js';
import { NervaTokenizer, readTokenizerJson } from './tokenizer.js';

async function isFile(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isFile();
  } catch {
    return false;
  }
}

/**
 * The tokenizer of a model folder (its `tokenizer.json`) or of a `.gguf` file (its metadata), with
 * `chatTemplate` replacing the model's own when given; undefined when the model has none.
 */
export async function loadModelTokenizer(model: string, chatTemplate?: string): Promise<NervaTokenizer | undefined> {
  if (isGgufPath(model)) {
    const f = await GgufFile.open(model);
    try {
      if (chatTemplate === undefined) return ggufTokenizer(f.metadata, model);
      const parts = ggufTokenizerParts(f.metadata, model);
      return parts && new NervaTokenizer(parts.tokenizerJson, parts.tokenizerConfig, chatTemplate, model);
    } finally {
      await f.close();
    }
  }
  if (!(await isFile(join(model, 'tokenizer.json')))) return undefined;
  if (chatTemplate === undefined) return NervaTokenizer.fromDir(model);
  // Confined to the model folder and size-capped, as NervaTokenizer.fromDir reads them.
  const tok = await readTokenizerJson(model, 'tokenizer.json', true);
  const cfg = (await readTokenizerJson(model, 'tokenizer_config.json', false)) ?? {};
  return new NervaTokenizer(tok, cfg, chatTemplate, join(model, 'tokenizer.json'));
}

/** Whether a model folder or `.gguf` file has a tokenizer, and whether that tokenizer has a chat template. */
export interface ModelTokenizerFacts {
  readonly hasTokenizer: boolean;
  readonly hasChatTemplate: boolean;
}

/** {@link ModelTokenizerFacts} of a model folder or `.gguf` file, without building the tokenizer. */
export async function modelTokenizerFacts(model: string): Promise<ModelTokenizerFacts> {
  if (isGgufPath(model)) {
    const f = await GgufFile.open(model);
    try {
      const parts = ggufTokenizerParts(f.metadata, model);
      return { hasTokenizer: parts !== undefined, hasChatTemplate: parts?.chatTemplate !== undefined };
    } finally {
      await f.close();
    }
  }
  const hasTokenizer = await isFile(join(model, 'tokenizer.json'));
  if (await isFile(join(model, 'chat_template.jinja'))) return { hasTokenizer, hasChatTemplate: true };
  try {
    const cfg = JSON.parse((await readOptionalModelText(model, 'tokenizer_config.json')) ?? '{}') as { chat_template?: unknown };
    return { hasTokenizer, hasChatTemplate: cfg.chat_template !== undefined && cfg.chat_template !== null };
  } catch {
    return { hasTokenizer, hasChatTemplate: false };
  }
}
