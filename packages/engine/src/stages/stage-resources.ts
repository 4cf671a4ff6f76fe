import type { DeviceBackend } from '@nerva/core';
import { backendFactory, type StageCommunicator } from '../backend-registry.js';
import { freeWeights, type ModelWeights } from '../model-weights.js';

/**
 * What preparing pipeline stages or tensor-parallel shards makes beside the engine's backend:
 * the backends it opened, the weights it uploaded to them, the communicator between them. Freed
 * once by `dispose` (on a failure while preparing, or when the model is freed); the engine's own
 * backend and the weights it holds (`primaryWeights`, until handed over) are freed by `abandon`.
 */
export class StageResources {
  private readonly owned: DeviceBackend[] = [];
  private readonly made: { backend: DeviceBackend; weights: ModelWeights }[] = [];
  /** The communicator between separate GPUs, where one was made. */
  nccl: StageCommunicator | undefined;
  private disposed = false;

  /** @param primary the engine's backend (never disposed here) */
  constructor(private readonly primary: DeviceBackend) {}

  /** A backend opened for a stage or shard: disposed with the rest. */
  own(b: DeviceBackend): DeviceBackend {
    this.owned.push(b);
    return b;
  }

  /** Weights uploaded to `backend`; those on the engine's backend are the engine's once handed over. */
  uploaded(backend: DeviceBackend, weights: ModelWeights): void {
    if (backend === this.primary) this.primaryWeights = weights;
    else this.made.push({ backend, weights });
  }

  /** The engine's backend's weights, until the engine takes them (see `abandon`). */
  primaryWeights: ModelWeights | undefined;

  /**
   * One communicator over `backends` (rank i on backends[i]) from the backend kind's factory;
   * `fail` wraps what went wrong in the caller's configuration error.
   */
  async communicate(kind: string, backends: readonly DeviceBackend[], fail: (e: Error) => Error): Promise<StageCommunicator> {
    const communicator = backendFactory(kind)?.communicator;
    try {
      if (!communicator) throw new Error(`the ${kind} backend registers no stage communicator`);
      this.nccl = await communicator([...backends]);
      return this.nccl;
    } catch (e) {
      throw fail(e as Error);
    }
  }

  /** Free what was made here: weights on other backends, the communicator, those backends. */
  readonly dispose = (): void => {
    if (this.disposed) return;
    this.disposed = true;
    for (const m of this.made) freeWeights(m.backend, m.weights);
    this.nccl?.destroy();
    for (const b of this.owned) b.dispose();
  };

  /** Preparing failed: free everything, the engine's backend's weights too. */
  abandon(): void {
    this.dispose();
    if (this.primaryWeights) freeWeights(this.primary, this.primaryWeights);
  }
}
