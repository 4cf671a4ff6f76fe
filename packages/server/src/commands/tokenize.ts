import { readFile } from 'node:fs/promises';
import { isGgufPath, loadModelTokenizer, NervaTokenizer } from '@nerva/models';
import type { Command } from 'commander';
import { defaultModelDir } from '../default-model.js';

export function registerTokenize(program: Command): void {
  program
    .command('tokenize')
    .description("encode text, or render an OpenAI-style messages array with the model's chat template and encode it")
    .option('--model <dir>', 'model folder with tokenizer.json, or a .gguf file (default: the embedded model)')
    .option('--text <text>', 'text to encode (no special tokens added)')
    .option('--chat <file>', 'JSON file holding an array of {role, content} messages')
    .option('--no-thinking', 'pass enable_thinking=false to the chat template')
    .option('--json', 'print {"ids": [...], "rendered": "..."} (the default output)')
    .action(async (f: { model?: string; text?: string; chat?: string; thinking: boolean }) => {
      if ((f.text === undefined) === (f.chat === undefined)) throw new Error('give exactly one of --text or --chat');
      const model = f.model ?? defaultModelDir();
      const tok = isGgufPath(model) ? await loadModelTokenizer(model) : await NervaTokenizer.fromDir(model);
      if (!tok) throw new Error(`${model} has no tokenizer (tokenizer.ggml.model is absent or "none")`);
      let rendered: string;
      if (f.chat !== undefined) {
        let messages: unknown;
        try {
          messages = JSON.parse(await readFile(f.chat, 'utf8'));
        } catch (e) {
          throw new Error(`${f.chat}: not a JSON file (${(e as Error).message})`);
        }
        if (!Array.isArray(messages)) throw new Error(`${f.chat}: expected a JSON array of messages`);
        rendered = tok.applyChatTemplate(messages as never, { addGenerationPrompt: true, ...(f.thinking ? {} : { enableThinking: false }) });
      } else rendered = f.text as string;
      process.stdout.write(JSON.stringify({ ids: tok.encode(rendered), rendered }) + '\n');
    });
}
