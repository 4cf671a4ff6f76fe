/**
 * `nerva chat` in a real terminal: tmux runs it, the test types into it (send-keys) and reads the
 * screen (capture-pane). The tmux tests SKIP when tmux is not installed (Debian:
 * `apt-get install -y tmux`); the history test below runs everywhere.
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { NervaTokenizer, readTokenizerJson } from '@nerva/models';
import { afterAll, describe, expect, it } from 'vitest';
import { ChatHistory } from '../src/cli-chat.js';
import { FALLBACK_CHAT_TEMPLATE } from '../src/server.js';
import { CLI, ROOT } from './cli-helpers.js';

const hasTmux = (() => {
  try {
    execFileSync('tmux', ['-V'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

describe('ChatHistory', () => {
  it('renders every turn through the template, keeps the system message on reset', async () => {
    const dir = join(ROOT, 'models/tiny-shakespeare-qwen3');
    const base = await NervaTokenizer.fromDir(dir);
    expect(base.chatTemplate).toBeUndefined();
    const tok = new NervaTokenizer(await readTokenizerJson(dir, 'tokenizer.json', true), {}, FALLBACK_CHAT_TEMPLATE);
    const h = new ChatHistory(tok, 'Speak in verse.');
    h.messages.push({ role: 'user', content: 'Good morrow' }, { role: 'assistant', content: 'And to thee.' }, { role: 'user', content: 'Farewell' });
    const text = 'SYSTEM:\nSpeak in verse.\n\nUSER:\nGood morrow\n\nASSISTANT:\nAnd to thee.\n\nUSER:\nFarewell\n\nASSISTANT:\n';
    expect(h.promptIds()).toEqual(tok.encode(text, { addSpecialTokens: false }));
    h.reset();
    expect(h.messages).toEqual([{ role: 'system', content: 'Speak in verse.' }]);
    expect(h.promptIds()).toEqual(tok.encode('SYSTEM:\nSpeak in verse.\n\nASSISTANT:\n', { addSpecialTokens: false }));
  });
});

describe.skipIf(!hasTmux)('nerva chat in tmux (skipped without tmux)', () => {
  // A socket of our own: the test's tmux server is not the user's, and goes away with the test.
  const socket = `nerva-chat-test-${process.pid}`;
  const tmux = (...args: string[]) => execFileSync('tmux', ['-L', socket, ...args], { encoding: 'utf8' });
  afterAll(() => {
    try {
      tmux('kill-server');
    } catch {
      // Already gone.
    }
  });
  const screen = () => tmux('capture-pane', '-p', '-J', '-S', '-200', '-t', 'chat');
  /** Wait for the screen to satisfy `ok` (a bounded wait for output, not a timing assertion). */
  const until = async (ok: (s: string) => boolean, what: string): Promise<string> => {
    for (let i = 0; i < 1200; i++) {
      const s = screen();
      if (ok(s)) return s;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`no ${what} within 120 s; screen:\n${screen()}`);
  };
  const count = (s: string, sub: string) => s.split(sub).length - 1;
  // capture-pane drops trailing blanks: an empty prompt line reads ">>>".
  const promptAfterStop = (s: string, stops: number) => count(s, '(stopped)') === stops && /^>>> ?$/m.test(s.split('(stopped)')[stops]);
  /** The text between the n-th (0-based) prompt line `>>> <said>` and the next status line. */
  const replyAfter = (s: string, said: string, n = 0): string => {
    const parts = s.split(`>>> ${said}\n`);
    // Not there yet (the typed line may show before its Enter is echoed): no reply so far.
    if (parts.length <= n + 1) return '';
    // The pane's blank rows below the cursor come back as empty lines: trimmed away.
    return parts[n + 1].split('\n(stopped)')[0].split('\n>>>')[0].trimEnd();
  };

  it('types a message, reads the streamed reply, stops it with Ctrl-C, /reset, and quits with Ctrl-C at the prompt', async () => {
    // Greedy, with room for a reply far longer than the test waits: Ctrl-C always lands mid-reply.
    const cmd = `'${process.execPath}' '${CLI}' chat --backend cpu --temperature 0 --max-tokens 900; echo "[chat exited $?]"; sleep 600`;
    tmux('new-session', '-d', '-s', 'chat', '-x', '200', '-y', '50', '-c', ROOT, cmd);
    await until((s) => /^>>> ?$/m.test(s), 'prompt');
    expect(screen()).toContain('chatting with tiny-shakespeare-qwen3 on cpu');

    tmux('send-keys', '-t', 'chat', 'Good morrow', 'Enter');
    await until((s) => replyAfter(s, 'Good morrow').length > 20, 'reply text');
    tmux('send-keys', '-t', 'chat', 'C-c');
    let s = await until((x) => promptAfterStop(x, 1), 'stopped reply and a new prompt');
    const first = replyAfter(s, 'Good morrow');
    expect(first.length).toBeGreaterThan(20);

    // The history holds that turn; /reset clears it, so the same message gets the same greedy reply.
    tmux('send-keys', '-t', 'chat', '/reset', 'Enter');
    await until((x) => x.includes('(conversation cleared)'), 'reset');
    tmux('send-keys', '-t', 'chat', 'Good morrow', 'Enter');
    await until((x) => replyAfter(x, 'Good morrow', 1).length > first.length, 'second reply');
    tmux('send-keys', '-t', 'chat', 'C-c');
    s = await until((x) => promptAfterStop(x, 2), 'second stop and a new prompt');
    expect(replyAfter(s, 'Good morrow', 1).slice(0, first.length), s).toBe(first);

    // Ctrl-C at an empty prompt quits, with status 0.
    tmux('send-keys', '-t', 'chat', 'C-c');
    s = await until((x) => x.includes('[chat exited'), 'exit');
    expect(s).toContain('[chat exited 0]');
  });
});
