import { Worker } from 'node:worker_threads';
const w = new Worker(new URL('../engine/dist/worker-entry.js', import.meta.url), { workerData: { model: '/work/main/models/tiny-shakespeare-qwen3', backend: 'cpu' } });
w.on('message', (m) => { console.log('msg', m.type, m.type==='event'? m.event.token : ''); if (m.type === 'ready') w.postMessage({ type: 'submit', rid: 1, promptIds: [5, 6, 7], opts: { maxTokens: 3, temperature: 0 } }); if (m.type==='done') w.postMessage({type:'dispose'}); });
w.on('error', (e) => console.log('err', e));
w.on('exit', (c) => console.log('exit', c));
