import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { NervaTokenizer } from '@nerva/models';
import type { Command } from 'commander';
import { fallbackNote, loadChatTokenizer, loadTokenizerOf, MODEL_FLAG_HELP, requireTokenizer, resolveModelArg } from '../cli-model.js';

export function registerTokenize(program: Command): void {
  program
    .command('tokenize')
    .description("encode text, or render an OpenAI-style messages array with the model's chat template (the server's plain transcript template when it has none) and encode it")
    .option('--model <dir>', MODEL_FLAG_HELP)
    .option('--text <text>', 'text to encode (no special tokens added)')
    .option('--chat <file>', 'JSON file holding an array of {role, content} messages')
    .option('--no-thinking', 'pass enable_thinking=false to the chat template')
    .option('--json', 'print {"ids": [...], "rendered": "..."} (the default output)')
    .action(async (f: { model?: string; text?: string; chat?: string; thinking: boolean }) => {
      if ((f.text === undefined) === (f.chat === undefined)) throw new Error('give exactly one of --text or --chat');
      // A tokenizer-only folder (no config.json) is enough here; names resolve as elsewhere.
      const local = f.model !== undefined ? resolve(f.model) : undefined;
      const dir = local !== undefined && existsSync(join(local, 'tokenizer.json')) ? local : await resolveModelArg(f.model);
      requireTokenizer(dir, 'nerva tokenize needs the model\'s tokenizer');
      let rendered: string;
      let tok: NervaTokenizer;
      if (f.chat !== undefined) {
        let messages: unknown;
        try {
          messages = JSON.parse(await readFile(f.chat, 'utf8'));
        } catch (e) {
          throw new Error(`${f.chat}: not a JSON file (${(e as Error).message})`);
        }
        if (!Array.isArray(messages)) throw new Error(`${f.chat}: expected a JSON array of messages`);
        const chat = await loadChatTokenizer(dir);
        if (chat.fallback) process.stderr.write(`nerva: ${fallbackNote(dir)}\n`);
        tok = chat.tokenizer;
        rendered = tok.applyChatTemplate(messages as never, { addGenerationPrompt: true, ...(f.thinking ? {} : { enableThinking: false }) });
      } else {
        tok = await loadTokenizerOf(dir);
        rendered = f.text as string;
      }
      process.stdout.write(JSON.stringify({ ids: tok.encode(rendered), rendered }) + '\n');
    });
}
