import type { EngineOptions, GenerateOptions } from '@nerva/engine';
import type { Command } from 'commander';
import { CHAT_HELP, chatLoop } from '../cli-chat.js';
import { CLI_ENGINE_FLAGS, openCliEngine } from '../cli-engine.js';
import { fallbackNote, loadChatTokenizer, modelNameOf } from '../cli-model.js';
import { parseFloatArg, parseIntArg } from '../cli-util.js';
import { addFlags, deriveFlags } from '../options.js';

const FLAGS = deriveFlags(CLI_ENGINE_FLAGS, { applyDefaults: true });

/** The flags of `nerva chat` that are not engine options. */
interface ChatFlags {
  system?: string;
  maxTokens: number;
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  seed?: number;
  thinking: boolean;
}

export function registerChat(program: Command): void {
  const cmd = program
    .command('chat')
    .description(`chat with a model in the terminal (the embedded default model when --model is absent); ${CHAT_HELP}`)
    .option('--system <text>', 'a system message at the start of the conversation')
    .option('--max-tokens <n>', 'the most tokens of one reply', parseIntArg('--max-tokens', { positive: true }), 512)
    .option('--temperature <t>', 'sampling temperature (0 = greedy); default from generation_config.json', parseFloatArg('--temperature'))
    .option('--top-k <k>', 'top-k (0 = off)', parseIntArg('--top-k'))
    .option('--top-p <p>', 'top-p', parseFloatArg('--top-p'))
    .option('--min-p <p>', 'min-p', parseFloatArg('--min-p'))
    .option('--seed <s>', 'seed for reproducible sampling', parseIntArg('--seed'))
    .option('--no-thinking', 'pass enable_thinking=false to the chat template');
  addFlags(cmd, FLAGS).action(async (f: ChatFlags & Record<string, unknown>) => {
    const e = FLAGS.read(f) as Partial<EngineOptions>;
    const { engine, model } = await openCliEngine(e, { needsTokenizer: 'nerva chat reads and writes text' });
    try {
      const { tokenizer, fallback } = await loadChatTokenizer(model);
      const gen = engine.generationDefaults;
      const generate: GenerateOptions = {
        maxTokens: f.maxTokens,
        temperature: f.temperature ?? gen.temperature ?? 1,
        topK: f.topK ?? gen.topK,
        topP: f.topP ?? gen.topP,
        minP: f.minP ?? gen.minP,
        seed: f.seed,
        // The transcript template has no end-of-turn token: a model that writes the next
        // speaker's label has finished its turn.
        ...(fallback ? { stop: ['\nUSER:', '\nSYSTEM:'] } : {}),
      };
      if (fallback) process.stderr.write(`nerva: ${fallbackNote(model)}\n`);
      process.stderr.write(`nerva: chatting with ${modelNameOf(model)} on ${engine.backend.name}; ${CHAT_HELP}\n`);
      await chatLoop({
        engine,
        tokenizer,
        generate,
        system: f.system,
        ...(f.thinking ? {} : { enableThinking: false }),
        input: process.stdin,
        output: process.stdout,
      });
    } finally {
      engine.dispose();
    }
  });
}
