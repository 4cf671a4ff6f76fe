import type { DeviceBackend } from '@nerva/core';
import { defaultImportanceDir, ImportanceCache, type ImportanceProfile, type WeightPager } from '@nerva/memos';
import type { ModelSpec, NervaTokenizer } from '@nerva/models';
import { loadModelDir } from '@nerva/models';
import { CUDA_BUDGET_WORKSPACES, selectBackend } from './backend-select.js';
import { checkEngineOptions, type ContextOptions, type ModelOptions } from './engine-options.js';
import { kvCacheBytesAfterUpload, kvCacheBytesFor, pinnedBytesFor, runnerShape } from './memory-plan.js';
import { freeWeights, gatheredOnlyBytes, type ModelWeights, uploadWeights, weightFormatNote } from './model-weights.js';
import { pipelineRequest, type PreparedStages, prepareStages, primaryStageBudget } from './stages/placement.js';
import { prepareShards, primaryShardBudget, tensorParallelRequest } from './stages/tensor-parallel.js';
import { hostChannels, measureRates, type MeasuredRates } from './rates.js';
import type { SamplingParams } from './sampling-params.js';
import { checkpointImportanceKey, placeWeights, type ResidencyOptions } from './weight-residency.js';
import { ModelContext } from './context.js';

/** Sampling defaults a model ships in generation_config.json. */
export type GenerationDefaults = Pick<SamplingParams, 'temperature' | 'topK' | 'topP' | 'minP' | 'repetitionPenalty'>;

/** What a context needs of its model beside the public fields (the weights, the memory plan). */
export interface ModelInternals {
  readonly weights: ModelWeights;
  readonly pager: WeightPager | undefined;
  readonly stages: PreparedStages | undefined;
  readonly budgets: ResidencyOptions;
}

/**
 * A model resident on a backend: its spec, tokenizer and weights, placed per the memory plan
 * (all resident, or under `vramBudget`/`hostBudget` hot layers plus a pager that streams the
 * rest; with `pipelineParallel` split into stages). Several {@link ModelContext}s may share one
 * model: each has its own KV cache, scheduler and step loop, and reads the same weight buffers.
 * A paged or pipelined model takes one context (its pager and stage links belong to one step
 * loop).
 *
 * @example
 * ```ts
 * const model = await NervaModel.load({ model: 'fixtures/tiny', backend: 'cpu' });
 * const a = model.createContext();
 * const b = model.createContext({ maxNumSeqs: 4 });
 * const [x, y] = await Promise.all([a.submit('ROMEO:', { maxTokens: 8 }).done, b.submit('JULIET:', { maxTokens: 8 }).done]);
 * model.dispose(); // disposes a and b too
 * ```
 */
export class NervaModel {
  readonly spec: ModelSpec;
  readonly tokenizer: NervaTokenizer | undefined;
  readonly backend: DeviceBackend;
  /** Decisions made while loading (backend fallback, placement, pipeline); every context's ledgers start with them. */
  readonly notes: readonly string[];
  readonly modelDir: string;
  readonly eosTokenIds: readonly number[];
  /** Weight bytes over every stage (an embedding a tied head needs on two backends counts twice). */
  readonly weightBytes: number;
  /**
   * Weight bytes a decode step reads: {@link weightBytes} less what only a gather touches (an
   * untied embedding table gives one row a token). The decode roofline's bytes.
   */
  readonly decodeWeightBytes: number;
  /** Sampling defaults from the model's generation_config.json (used by front ends when a request leaves them out). */
  readonly generationDefaults: GenerationDefaults;
  /** The rates compute near data was planned from, when measured (paged weights with hostCompute 'auto'). */
  readonly measuredRates?: MeasuredRates;
  /** @internal The weights and memory plan contexts run on. */
  readonly internals: ModelInternals;
  /** @internal KV bytes the memory plan set aside beside the weights (budgets, stages): the first context's. */
  plannedKvBytes: number | undefined;
  /** @internal The importance profile to calibrate with the first context (paged weights without a cached profile). */
  readonly calibration: { cache: ImportanceCache; key: string } | undefined;
  /** The options the model was loaded with: the first context's defaults. */
  readonly options: ModelOptions;
  private readonly ownsBackend: boolean;
  private readonly live = new Set<ModelContext>();
  private disposed = false;

  private constructor(init: {
    o: ModelOptions;
    dir: string;
    spec: ModelSpec;
    tokenizer?: NervaTokenizer;
    backend: DeviceBackend;
    ownsBackend: boolean;
    notes: string[];
    weights: ModelWeights;
    pager?: WeightPager;
    stages?: PreparedStages;
    eos: number[];
    generationConfig?: Record<string, unknown>;
    plannedKvBytes?: number;
    measuredRates?: MeasuredRates;
    calibration?: { cache: ImportanceCache; key: string };
  }) {
    const o = init.o;
    this.options = o;
    this.modelDir = init.dir;
    this.spec = init.spec;
    this.tokenizer = init.tokenizer;
    this.backend = init.backend;
    this.ownsBackend = init.ownsBackend;
    this.notes = init.notes;
    this.eosTokenIds = init.eos;
    this.weightBytes = init.stages?.weightBytes ?? init.weights.bytes;
    const held = init.stages ? [...new Set(init.stages.stages.map((s) => s.weights))] : [init.weights];
    this.decodeWeightBytes = this.weightBytes - held.reduce((t, w) => t + gatheredOnlyBytes(w, init.spec.vocabSize), 0);
    this.generationDefaults = generationDefaults(init.generationConfig);
    this.measuredRates = init.measuredRates;
    this.plannedKvBytes = init.plannedKvBytes;
    this.calibration = init.calibration;
    this.internals = { weights: init.weights, pager: init.pager, stages: init.stages, budgets: { vramBudget: o.vramBudget, hostBudget: o.hostBudget, offloadDir: o.offloadDir } };
  }

  /**
   * Load a model folder onto a backend (created per `o.backend`, or the one given). Options are
   * checked before the checkpoint opens; errors name the file and the problem. Context-shape
   * options given here (maxNumSeqs, kvCacheBytes, ...) size the memory plan under a budget and are
   * the defaults of {@link createContext}.
   */
  static async load(o: ModelOptions): Promise<NervaModel> {
    // Pipeline options are checked before anything loads.
    const pipe = pipelineRequest(o);
    const tp = tensorParallelRequest(o);
    checkEngineOptions(o);
    // Options are checked before the checkpoint opens: a refused one leaves no file open.
    const loaded = await loadModelDir(o.model);
    let backend: DeviceBackend;
    let notes: string[] = [];
    let reservedBytes = 0;
    // Stages or shards under VRAM budgets hold the model resident, each placed within its own: the
    // single-backend paths (paged weights, the backend's own budget) see no budget then.
    const single: ModelOptions = pipe?.budgets || tp?.budgets ? { ...o, vramBudget: undefined, stageVramBudgets: undefined } : o;
    const budgeted = single.vramBudget !== undefined || single.hostBudget !== undefined;
    const deviceBudget = (tp ? primaryShardBudget(tp) : primaryStageBudget(pipe, o.backend)) ?? single.vramBudget;
    if (typeof o.backend === 'object') {
      backend = o.backend;
      const has = backend.capabilities.numerics ?? 'exact';
      const mp = backend.capabilities.matmulPrecision ?? 'exact';
      const mismatch =
        o.numerics !== undefined && o.numerics !== has
          ? `numerics '${o.numerics}' was asked for, but the given backend has '${has}'`
          : o.matmulPrecision !== undefined && o.matmulPrecision !== mp
            ? `matmulPrecision '${o.matmulPrecision}' was asked for, but the given backend has '${mp}'`
            : o.batchInvariant === true && backend.capabilities.batchInvariant !== true
              ? 'batchInvariant was asked for, but the given backend is not batch-invariant'
              : undefined;
      if (mismatch !== undefined) {
        await loaded.checkpoint.close();
        throw new RangeError(mismatch);
      }
    } else {
      try {
        let reserved: number | undefined;
        ({ backend, notes, reservedBytes: reserved } = await selectBackend(o.backend ?? 'auto', {
          deviceArenaBytes: o.deviceArenaBytes,
          ...(o.stageDevices !== undefined ? { device: o.stageDevices[0] } : {}),
          numerics: o.numerics,
          matmulPrecision: o.matmulPrecision,
          ...(o.batchInvariant !== undefined ? { batchInvariant: o.batchInvariant } : {}),
          ...(deviceBudget !== undefined ? { deviceBudgetBytes: deviceBudget } : {}),
          ...(single.hostBudget !== undefined ? { hostBudgetBytes: single.hostBudget } : {}),
          // Pinned host memory for the master copies of streamed blocks: at most the checkpoint.
          // Plus room for the runner's host buffers and the start-up rate measurement.
          ...(budgeted || o.kvVramBudget !== undefined ? { pinnedArenaBytes: pinnedBytesFor(single, loaded.spec, loaded.checkpoint.totalBytes, budgeted) } : {}),
        }));
        reservedBytes = reserved ?? 0;
      } catch (e) {
        await loaded.checkpoint.close();
        throw e;
      }
    }
    let weights: ModelWeights | undefined;
    let pager: WeightPager | undefined;
    let importance: { cache: ImportanceCache; key: string; profile?: ImportanceProfile } | undefined;
    let staged: PreparedStages | undefined;
    try {
      const shape = runnerShape(backend, loaded.spec, o);
      const maxModelLen = Math.min(loaded.spec.maxPositionEmbeddings, o.maxModelLen ?? 4096);
      const kvPlanned = kvCacheBytesFor(backend, shape, maxModelLen, single);
      const sp = loaded.spec;
      const be = backend;
      const splitFor = (attnBytes: number, mlpBytes: number): number => {
        const hc = o.hostCompute ?? 'auto';
        const I = sp.intermediateSize;
        if (hc === 'off' || sp.moe !== undefined) return 0;
        if (typeof hc === 'number') return Math.min(I - 64, Math.max(0, Math.round((hc * I) / 64) * 64));
        const caps = be.capabilities;
        if (caps.computeTier !== 'vram' || !caps.ops.includes('mlp_slice') || caps.numerics === 'bf16' || caps.weightDtype !== 'bf16') return 0;
        // The host kernels read bf16 weights: an f32 checkpoint (kept f32, exact) streams whole.
        const mlp0 = loaded.weights.layers[0].mlp;
        if (mlp0.kind !== 'dense' || mlp0.gate.dtype !== 'BF16') return 0;
        const rates = measureRates(be, sp.hiddenSize, true);
        measuredRates = rates;
        const c = hostChannels(rates, attnBytes, mlpBytes, I);
        measured = `measured at start-up, together: host->device ${rates.h2dGBs.toFixed(1)} GB/s, host MLP ${rates.hostMlpGBs?.toFixed(1)} GB/s -> host computes ${c} of ${I} channels`;
        return c;
      };
      let measured: string | undefined;
      let measuredRates: MeasuredRates | undefined;
      // The importance profile of this checkpoint, when one was calibrated before.
      const cache = budgeted && o.importanceCache !== false ? new ImportanceCache(o.importanceCache ?? defaultImportanceDir()) : undefined;
      if (cache) {
        importance = { cache, key: await checkpointImportanceKey(sp, loaded.checkpoint) };
        const got = cache.load(importance.key, sp.numLayers);
        importance.profile = got.profile;
        notes.push(got.profile ? `importance profile: loaded from ${cache.dir} (${got.profile.tokens} calibration tokens)` : `importance profile: ${got.miss}; layers are kept hot in execution order`);
      }
      // Under a budget the engine's own KV default may shrink to 64 tokens before weights are refused.
      const kvFloor = o.kvCacheBytes === undefined && kvPlanned !== undefined ? shape.kvBytesPerToken * 64 : undefined;
      const placed = placeWeights(backend, sp, loaded.checkpoint, kvPlanned ?? 0, shape, single, reservedBytes, splitFor, importance?.profile?.layers, kvFloor);
      if (measured) notes.push(`compute near data: ${measured}`);
      pager = placed?.pager;
      if (pipe || tp) {
        const be0 = backend;
        const args = {
          primary: be0,
          spec: loaded.spec,
          ckpt: loaded.checkpoint,
          backendOptions: { deviceArenaBytes: o.deviceArenaBytes, numerics: be0.capabilities.numerics ?? 'exact', matmulPrecision: be0.capabilities.matmulPrecision ?? 'exact', batchInvariant: be0.capabilities.batchInvariant === true },
          kvPlanned,
          kvAfterUpload: (b: DeviceBackend, activationBytes: number) => kvCacheBytesAfterUpload(b, { ...shape, activationBytes }),
          activationBytes: shape.activationBytes,
          kvBytesPerToken: shape.kvBytesPerToken,
          maxRows: shape.maxRows,
          maxNumSeqs: shape.maxNumSeqs,
          // What a CUDA backend under a budget sets aside for its workspaces; the CPU sets aside nothing.
          reservedBytes: be0.capabilities.deviceKind === 'cpu' ? 0 : CUDA_BUDGET_WORKSPACES.workspaceBytes + CUDA_BUDGET_WORKSPACES.cublasWorkspaceBytes,
          kvExplicit: o.kvCacheBytes !== undefined,
          onProgress: o.onProgress,
        };
        // With tensorParallel, the group makes the stages too (each stage split across its own shards).
        staged = tp ? await prepareShards({ ...args, request: tp }) : await prepareStages({ ...args, request: pipe! });
        notes.push(...staged.notes);
      }
      weights = staged ? staged.stages[0].weights : await uploadWeights(backend, loaded.spec, loaded.checkpoint, o.onProgress, pager, undefined, placed?.split);
      // Quantized weights: every request's ledger says what the run is exact with respect to.
      const formatNote = weightFormatNote(weights.format);
      if (formatNote) notes.push(formatNote);
      // The unbudgeted default is sized by the first context, from what the weights left free.
      const plannedKvBytes = staged?.kvBytes ?? placed?.kvBytes ?? kvPlanned;
      // The loads that start the first pass; the ring keeps itself primed from then on.
      pager?.prime();
      return new NervaModel({
        o,
        dir: loaded.dir,
        spec: loaded.spec,
        tokenizer: loaded.tokenizer,
        backend,
        ownsBackend: typeof o.backend !== 'object',
        notes,
        weights,
        pager,
        stages: staged,
        eos: loaded.stopTokenIds,
        generationConfig: loaded.generationConfig as Record<string, unknown> | undefined,
        plannedKvBytes,
        measuredRates,
        calibration: importance && pager && !importance.profile ? { cache: importance.cache, key: importance.key } : undefined,
      });
    } catch (e) {
      staged?.dispose();
      if (weights) freeWeights(backend, weights);
      else pager?.dispose();
      if (typeof o.backend !== 'object') backend.dispose();
      throw e;
    } finally {
      await loaded.checkpoint.close();
    }
  }

  /**
   * A new context on this model's weights: its own KV cache, scheduler, step loop and graphs.
   * Options left out take the values the model was loaded with. Dispose it when done (or
   * dispose the model, which disposes its contexts).
   */
  createContext(o: ContextOptions = {}): ModelContext {
    return new ModelContext(this, { ...this.options, ...o });
  }

  /** The contexts open on this model. */
  get contexts(): readonly ModelContext[] {
    return [...this.live];
  }

  /**
   * @internal A context starts on the model: refused after dispose, and beside another one on a
   * paged or pipelined model. Returns the KV bytes the memory plan set aside for it, if any.
   */
  attach(ctx: ModelContext, shapeBytes: Parameters<typeof kvCacheBytesAfterUpload>[1], o: Partial<ModelOptions>): number {
    if (this.disposed) throw new RangeError('the model is disposed');
    const { pager, stages } = this.internals;
    if (this.live.size > 0 && (pager !== undefined || stages !== undefined))
      throw new RangeError(`a ${pager ? 'paged' : 'pipelined'} model takes one context (its ${pager ? 'weight pager' : 'stage links'} belong to one step loop)`);
    const planned = this.plannedKvBytes;
    this.plannedKvBytes = undefined;
    const maxModelLen = Math.min(this.spec.maxPositionEmbeddings, o.maxModelLen ?? 4096);
    const kv = planned ?? kvCacheBytesFor(this.backend, shapeBytes, maxModelLen, o) ?? kvCacheBytesAfterUpload(this.backend, shapeBytes);
    this.live.add(ctx);
    return kv;
  }

  /** @internal A context was disposed. */
  detach(ctx: ModelContext): void {
    this.live.delete(ctx);
  }

  /** Dispose every context on the model, then free the weights (and the backend, when the model created it). */
  dispose(): void {
    if (this.disposed) return;
    for (const c of [...this.live]) c.dispose();
    this.disposed = true;
    this.internals.stages?.dispose();
    freeWeights(this.backend, this.internals.weights);
    if (this.ownsBackend) this.backend.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** Sampling defaults a model ships in generation_config.json; fields that are not numbers are ignored. */
function generationDefaults(g: Record<string, unknown> | undefined): GenerationDefaults {
  const out: GenerationDefaults = {};
  if (!g || g.do_sample === false) return g ? { temperature: 0 } : out;
  const n = (k: string) => (typeof g[k] === 'number' && Number.isFinite(g[k]) ? (g[k] as number) : undefined);
  if (n('temperature') !== undefined) out.temperature = n('temperature');
  if (n('top_k') !== undefined) out.topK = n('top_k');
  if (n('top_p') !== undefined) out.topP = n('top_p');
  if (n('min_p') !== undefined) out.minP = n('min_p');
  if (n('repetition_penalty') !== undefined) out.repetitionPenalty = n('repetition_penalty');
  return out;
}
