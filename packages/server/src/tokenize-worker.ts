/**
 * Worker-thread entry of {@link OffThreadTokenizer}: the model's tokenizer (and chat template)
 * loaded once, rendering and encoding large prompts so the HTTP event loop never waits on them.
 * Bundled as its own file (`dist/tokenize-worker.js`).
 */
import { parentPort, workerData } from 'node:worker_threads';
import { loadModelTokenizer } from '@nerva/models';
import type { TokenizeReply, TokenizeRequest, TokenizeWorkerData } from './tokenize-pool.js';

const port = parentPort;
if (!port) throw new Error('tokenize-worker must run inside a worker thread');
const { dir, chatTemplate } = workerData as TokenizeWorkerData;
// The same tokenizer the engine's main thread loads (WorkerEngine), template override included;
// `dir` is a model folder or a .gguf file.
const loaded = await loadModelTokenizer(dir, chatTemplate);
if (!loaded) throw new Error(`model ${dir} has no tokenizer`);
const tok = loaded;

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
