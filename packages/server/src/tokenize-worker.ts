/**
 * Worker-thread entry of {@link OffThreadTokenizer}: the model's tokenizer (and chat template)
 * loaded once, rendering and encoding large prompts so the HTTP event loop never waits on them.
 * Bundled as its own file (`dist/tokenize-worker.js`).
 */
import { join } from 'node:path';
import { parentPort, workerData } from 'node:worker_threads';
import { NervaTokenizer, readTokenizerJson } from '@nerva/models';
import type { TokenizeReply, TokenizeRequest, TokenizeWorkerData } from './tokenize-pool.js';

const port = parentPort;
if (!port) throw new Error('tokenize-worker must run inside a worker thread');
const { dir, chatTemplate } = workerData as TokenizeWorkerData;
// The same tokenizer the engine's main thread loads (WorkerEngine), template override included.
const tok =
  chatTemplate === undefined
    ? await NervaTokenizer.fromDir(dir)
    : new NervaTokenizer(await readTokenizerJson(dir, 'tokenizer.json', true), (await readTokenizerJson(dir, 'tokenizer_config.json', false)) ?? {}, chatTemplate, join(dir, 'tokenizer.json'));

port.on('message', (m: TokenizeRequest) => {
  let reply: TokenizeReply;
  try {
    const ids = m.kind === 'chat' ? tok.encode(tok.applyChatTemplate(m.messages, m.opts), { addSpecialTokens: false }) : tok.encode(m.text);
    reply = { id: m.id, ids };
  } catch (e) {
    reply = { id: m.id, error: { code: (e as { code?: string }).code ?? 'TOKENIZER', message: (e as Error).message } };
  }
  port.postMessage(reply);
});
port.postMessage({ id: 0, ready: true } satisfies TokenizeReply);
