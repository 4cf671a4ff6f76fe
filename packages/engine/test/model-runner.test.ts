import { createCpuBackend } from '@nerva/cpu-backend';
import type { DeviceBackend, OpArgs, OpName } from '@nerva/core';
import { describe, expect, it } from 'vitest';
import { Engine } from '../src/index.js';
import { DEFAULT_MODEL } from './fixtures.js';

interface Recorded {
  op: OpName;
  rows: number | undefined;
  normed: boolean;
}

/** The CPU backend with every op call recorded (name, rows, whether a norm weight rode along). */
function recordingBackend(): { backend: DeviceBackend; calls: Recorded[] } {
  const inner = createCpuBackend();
  const calls: Recorded[] = [];
  const backend = new Proxy(inner, {
    get(target, prop, receiver) {
      if (prop === 'run') {
        return <K extends OpName>(op: K, args: OpArgs<K>, stream?: Parameters<DeviceBackend['run']>[2]) => {
          const a = args as { rows?: number; normWeight?: unknown };
          calls.push({ op, rows: a.rows, normed: a.normWeight !== undefined });
          return target.run(op, args, stream);
        };
      }
      const v = Reflect.get(target, prop, receiver) as unknown;
      return typeof v === 'function' ? (v as (...x: unknown[]) => unknown).bind(target) : v;
    },
  }) as DeviceBackend;
  return { backend, calls };
}

describe('ModelRunner fused decode pass', () => {
  it('folds every dense layer norm into its GEMV: one rmsnorm (the final one) per decode step', async () => {
    const { backend, calls } = recordingBackend();
    const engine = await Engine.create({ model: DEFAULT_MODEL, backend });
    try {
      const layers = engine.spec.numLayers;
      const prompt = engine.encode('ROMEO:\n');
      calls.length = 0;
      const out = await engine.submit(prompt, { temperature: 0, maxTokens: 3, ignoreEos: true }).done;
      expect(out.tokenIds).toHaveLength(3);
      // Decode passes are the single-row passes that start with an embedding.
      const passes: Recorded[][] = [];
      for (const c of calls) {
        if (c.op === 'embedding') passes.push([]);
        passes.at(-1)?.push(c);
      }
      const decode = passes.filter((p) => p[0].rows === 1);
      expect(decode.length).toBeGreaterThanOrEqual(1);
      for (const p of decode) {
        expect(p.filter((c) => c.op === 'rmsnorm')).toHaveLength(1);
        const fused = p.filter((c) => c.op === 'fused_matmul');
        expect(fused).toHaveLength(4 * layers);
        expect(fused.filter((c) => c.normed)).toHaveLength(2 * layers);
        expect(p.filter((c) => c.op === 'rope_append')).toHaveLength(layers);
      }
    } finally {
      engine.dispose();
    }
  });
});
