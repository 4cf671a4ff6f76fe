import { WorkerEngine, type WorkerEngineCreateOptions } from '@nerva/engine';
import type { ServerState } from './state.js';

/** Restarts allowed within {@link WINDOW_MS}; one more failure is fatal. */
const MAX_RESTARTS = 3;
const WINDOW_MS = 10 * 60_000;

/**
 * What the server does when its engine dies (the worker crashed, exited or hung past the
 * watchdog): in-flight requests have already failed (503), /health answers 503 while the engine
 * is down, and a new engine is loaded with the same options. A failed reload, or more than
 * {@link MAX_RESTARTS} deaths in ten minutes, is fatal: `onFatal` (the CLI exits non-zero).
 */
export class EngineRestarts {
  private readonly deaths: number[] = [];
  private stopped = false;

  constructor(
    private readonly state: ServerState,
    private readonly options: WorkerEngineCreateOptions,
    private readonly o: { log: (line: string) => void; onFatal?: (e: Error) => void; attach: (e: WorkerEngine) => void },
  ) {}

  /** Watch `engine`: its death starts a restart. */
  watch(engine: WorkerEngine): void {
    engine.onFailure((e) => void this.onDeath(engine, e));
  }

  /** No restarts from now on (shutdown). */
  stop(): void {
    this.stopped = true;
  }

  private async onDeath(engine: WorkerEngine, e: Error): Promise<void> {
    const { state, o } = this;
    if (this.stopped || state.engine !== engine) return;
    state.engineDown = e;
    o.log(`nerva: error: the engine failed (${e.message}); in-flight requests got 503`);
    const now = Date.now();
    this.deaths.push(now);
    while (this.deaths.length > 0 && now - this.deaths[0] > WINDOW_MS) this.deaths.shift();
    if (this.deaths.length > MAX_RESTARTS) return this.fatal(new Error(`the engine failed ${this.deaths.length} times in ten minutes: ${e.message}`));
    await engine.dispose().catch(() => {});
    try {
      o.log('nerva: restarting the engine');
      const fresh = await WorkerEngine.create(this.options);
      if (this.stopped) {
        await fresh.dispose();
        return;
      }
      o.attach(fresh);
      state.engine = fresh;
      state.engineDown = undefined;
      this.watch(fresh);
      o.log('nerva: the engine is back');
    } catch (err) {
      this.fatal(err as Error);
    }
  }

  private fatal(e: Error): void {
    this.state.engineDown = e;
    this.o.log(`nerva: error: the engine cannot be restarted: ${e.message}`);
    this.o.onFatal?.(e);
  }
}
