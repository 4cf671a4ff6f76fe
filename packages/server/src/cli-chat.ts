/**
 * The conversation loop of `nerva chat`: one line in, the model's reply streamed out, the turns
 * kept as history and rendered through the chat template for each reply. Ctrl-C while a reply
 * streams stops that reply (what came so far stays in the history); Ctrl-C at an empty prompt,
 * Ctrl-D or `/exit` quits.
 */
import { createInterface } from 'node:readline';
import type { Engine, GenerateOptions, RequestHandle } from '@nerva/engine';
import type { ChatMessage, NervaTokenizer } from '@nerva/models';

/** The prompt shown before each user turn. */
export const CHAT_PROMPT = '>>> ';

/** The commands typed at the prompt. */
export const CHAT_HELP = '/reset clears the conversation, /exit quits, /help shows this; Ctrl-C stops a reply, Ctrl-C at an empty prompt quits';

export interface ChatLoopOptions {
  engine: Engine;
  /** Renders the history (the model's tokenizer, with the fallback template where it has none). */
  tokenizer: NervaTokenizer;
  /** Sampling and length of each reply. */
  generate: GenerateOptions;
  /** A system message at the start of every conversation (kept by /reset). */
  system?: string;
  /** `enable_thinking` for the chat template (Qwen3); left to the template when undefined. */
  enableThinking?: boolean;
  input: NodeJS.ReadableStream;
  output: NodeJS.WritableStream;
  /** Whether input is a terminal (line editing, Ctrl-C as a key); default: the input's isTTY. */
  terminal?: boolean;
}

/** The conversation: its messages, and the prompt ids of the next reply. */
export class ChatHistory {
  readonly messages: ChatMessage[] = [];

  constructor(
    private readonly tokenizer: NervaTokenizer,
    private readonly system?: string,
    private readonly enableThinking?: boolean,
  ) {
    this.reset();
  }

  /** Back to the start: the system message alone, if any. */
  reset(): void {
    this.messages.length = 0;
    if (this.system !== undefined) this.messages.push({ role: 'system', content: this.system });
  }

  /** The ids of the whole conversation so far, ending with the assistant's turn opened. */
  promptIds(): number[] {
    const text = this.tokenizer.applyChatTemplate(this.messages, {
      addGenerationPrompt: true,
      ...(this.enableThinking !== undefined ? { enableThinking: this.enableThinking } : {}),
    });
    return this.tokenizer.encode(text, { addSpecialTokens: false });
  }
}

/** Run the loop until the user quits; resolves when the input closes. */
export async function chatLoop(o: ChatLoopOptions): Promise<void> {
  const history = new ChatHistory(o.tokenizer, o.system, o.enableThinking);
  const terminal = o.terminal ?? (o.input as NodeJS.ReadStream).isTTY === true;
  const rl = createInterface({ input: o.input, output: o.output, prompt: CHAT_PROMPT, terminal });
  const write = (s: string) => o.output.write(s);
  let current: RequestHandle | undefined;

  rl.on('SIGINT', () => {
    if (current) {
      current.abort();
      return;
    }
    if (rl.line.length > 0) {
      // Ctrl-C with a half-typed line drops the line, as shells do.
      write('^C\n');
      rl.write(null, { ctrl: true, name: 'u' });
      rl.prompt();
      return;
    }
    write('\n');
    rl.close();
  });

  rl.prompt();
  for await (const raw of rl) {
    const line = raw.trim();
    if (line === '') {
      rl.prompt();
      continue;
    }
    if (line.startsWith('/')) {
      const cmd = line.split(/\s+/)[0];
      if (cmd === '/exit' || cmd === '/quit' || cmd === '/bye') break;
      if (cmd === '/reset' || cmd === '/clear') {
        history.reset();
        write('(conversation cleared)\n');
      } else if (cmd === '/help') write(`${CHAT_HELP}\n`);
      else write(`unknown command ${cmd}; ${CHAT_HELP}\n`);
      rl.prompt();
      continue;
    }
    history.messages.push({ role: 'user', content: line });
    let reply = '';
    try {
      const h = o.engine.submit(history.promptIds(), o.generate);
      current = h;
      for await (const ev of h.events) {
        reply += ev.text;
        write(ev.text);
      }
      const out = await h.done;
      write(out.finishReason === 'abort' ? '\n(stopped)\n' : '\n');
      history.messages.push({ role: 'assistant', content: reply });
    } catch (e) {
      // A refused turn (say, past the context length) leaves the history as it was.
      history.messages.pop();
      write(`\nnerva: error: ${(e as Error).message}${/length|context|tokens/i.test((e as Error).message) ? ' (/reset starts a new conversation)' : ''}\n`);
    } finally {
      current = undefined;
    }
    rl.prompt();
  }
  rl.close();
}
