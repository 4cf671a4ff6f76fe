import type { EngineOptions } from './engine-options.js';
import { ModelContext } from './context.js';
import { NervaModel } from './model.js';

export * from './engine-options.js';

/**
 * The one-call convenience: a {@link NervaModel} loaded with `options` and one
 * {@link ModelContext} on it, disposed together. Everything a context does, an engine does
 * (`submit`, `submitFork`, `generate`, `abort`, `memoryReport`, ...); `engine.model` is the
 * model, on which more contexts may be created.
 *
 * @example
 * ```ts
 * const engine = await Engine.create({ model: 'fixtures/tiny', backend: 'auto' });
 * for await (const t of engine.generate('ROMEO:', { maxTokens: 32 })) process.stdout.write(t.text);
 * engine.dispose();
 * ```
 */
export class Engine extends ModelContext {
  /** Load a model folder onto a backend and open one context on it. Errors name the file and the problem. */
  static async create(o: EngineOptions): Promise<Engine> {
    const model = await NervaModel.load(o);
    let engine: Engine;
    try {
      engine = new Engine(model, o);
    } catch (e) {
      model.dispose();
      throw e;
    }
    const cal = model.calibration;
    if (cal) {
      try {
        await engine.calibrate(cal.cache, cal.key);
      } catch (e) {
        engine.dispose();
        throw e;
      }
    }
    return engine;
  }

  /** Dispose the context, then the model it owns (its weights, and the backend when the engine created it). */
  override dispose(): void {
    super.dispose();
    this.model.dispose();
  }
}
