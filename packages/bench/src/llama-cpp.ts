/**
 * llama.cpp as a peer engine on a GGUF file, through node-llama-cpp (a dev dependency of this
 * package: its CPU build is the prebuilt `@node-llama-cpp/linux-x64` from the npm registry).
 * Everything here is token-level (token ids in, token ids out), so tokenization is never part of
 * a comparison; {@link LlamaCppModel.tokenize} exists to check the tokenizers agree, separately.
 *
 * node-llama-cpp is imported lazily: the bench runs without it and {@link openLlamaCpp} then
 * says why it is unavailable.
 */
import type { Llama, LlamaContext, LlamaContextSequence, LlamaModel as NlcModel, Token } from 'node-llama-cpp';

/** A llama.cpp runtime that loaded, or why none did. */
export type LlamaCppOpenResult = { readonly available: true; readonly runtime: LlamaCppRuntime } | { readonly available: false; readonly reason: string };

export interface LlamaCppOpenOptions {
  /** CPU threads of llama.cpp's evaluations (default 1: deterministic and not oversubscribed on a shared machine). */
  readonly threads?: number;
}

/** What decoding greedily returned, with llama.cpp's time split. */
export interface LlamaCppGreedyResult {
  readonly tokens: number[];
  /** From the call to the first generated token (the prompt's evaluation and the first sample). */
  readonly firstTokenMs: number;
  /** From the first generated token to the last. */
  readonly decodeMs: number;
}

type NodeLlamaCpp = typeof import('node-llama-cpp');

/** The module's name, kept in a variable so bundlers leave the import to run time. */
const NODE_LLAMA_CPP = 'node-llama-cpp';

/**
 * Load node-llama-cpp's CPU build. Never builds or downloads anything (`build: "never"`,
 * `skipDownload`): where the prebuilt binary cannot load on this platform, or the package is not
 * installed, the result says so instead.
 */
export async function openLlamaCpp(o: LlamaCppOpenOptions = {}): Promise<LlamaCppOpenResult> {
  const threads = o.threads ?? 1;
  if (!Number.isInteger(threads) || threads < 1) throw new RangeError(`threads must be a positive integer, got ${threads}`);
  let nlc: NodeLlamaCpp;
  try {
    nlc = (await import(NODE_LLAMA_CPP)) as NodeLlamaCpp;
  } catch (e) {
    return { available: false, reason: `node-llama-cpp is not installed (${(e as Error).message.split('\n')[0]})` };
  }
  try {
    const llama = await nlc.getLlama({
      gpu: false,
      build: 'never',
      skipDownload: true,
      usePrebuiltBinaries: true,
      progressLogs: false,
      logLevel: nlc.LlamaLogLevel.error,
      maxThreads: threads,
    });
    guardVocabFreeModels(nlc);
    return { available: true, runtime: new LlamaCppRuntime(nlc, llama, threads, await nlc.getModuleVersion()) };
  } catch (e) {
    return { available: false, reason: `node-llama-cpp's prebuilt binary does not load on ${process.platform}-${process.arch} (${(e as Error).message.split('\n')[0]})` };
  }
}

let guarded = false;

/**
 * node-llama-cpp checks every model it loads by tokenizing a sample text (`getWarnings`). A GGUF
 * without a vocabulary (`tokenizer.ggml.model = "none"`, what `nerva convert` writes for a
 * folder without tokenizer.json) loads in llama.cpp, but llama.cpp's tokenize aborts the process
 * on it (a GGML_ASSERT on the uninitialised tokenizer; its detokenize checks for "none", its
 * tokenize does not). Skip that check for such models; nothing here tokenizes them.
 */
function guardVocabFreeModels(nlc: NodeLlamaCpp): void {
  if (guarded) return;
  guarded = true;
  const proto = nlc.LlamaModel.prototype;
  const check = proto.getWarnings;
  proto.getWarnings = function (this: NlcModel): string[] {
    return this.vocabularyType === nlc.LlamaVocabularyType.none ? [] : check.call(this);
  };
}

/** node-llama-cpp's CPU runtime. */
export class LlamaCppRuntime {
  /** @internal */
  constructor(
    private readonly nlc: NodeLlamaCpp,
    private readonly llama: Llama,
    /** CPU threads of each evaluation. */
    readonly threads: number,
    /** node-llama-cpp's version. */
    readonly version: string,
  ) {}

  /** The llama.cpp release the binary was built from. */
  get llamaCppRelease(): string {
    return this.llama.llamaCppRelease.release;
  }

  /** Load the GGUF file at `path` on the CPU with a context of `contextSize` tokens (one sequence). */
  async load(path: string, contextSize: number): Promise<LlamaCppModel> {
    const model = await this.llama.loadModel({ modelPath: path, gpuLayers: 0 });
    try {
      // The KV cache in f32, as NERVA's CPU backend holds it (llama.cpp's default is f16, which
      // rounds K and V to 11 bits), and attention without flash attention (whose CPU path rounds Q to f16).
      const context = await model.createContext({
        contextSize,
        batchSize: contextSize,
        sequences: 1,
        threads: this.threads,
        flashAttention: false,
        experimentalKvCacheKeyType: 'F32',
        experimentalKvCacheValueType: 'F32',
      });
      return new LlamaCppModel(model, context, model.vocabularyType === this.nlc.LlamaVocabularyType.none);
    } catch (e) {
      await model.dispose();
      throw e;
    }
  }

  async dispose(): Promise<void> {
    await this.llama.dispose();
  }
}

/** A GGUF model loaded in llama.cpp, with one sequence. */
export class LlamaCppModel {
  private readonly sequence: LlamaContextSequence;

  /** @internal */
  constructor(
    private readonly model: NlcModel,
    private readonly context: LlamaContext,
    /** The file has no vocabulary (`tokenizer.ggml.model = "none"`). */
    readonly vocabFree: boolean,
  ) {
    this.sequence = context.getSequence();
  }

  /**
   * llama.cpp's tokenization of `text` (no special tokens added), or undefined for a file without
   * a vocabulary. `special`: special tokens written in the text are those tokens (as Hugging Face
   * tokenizers read them), not their characters.
   */
  tokenize(text: string, special = false): number[] | undefined {
    if (this.vocabFree) return undefined;
    return this.model.tokenize(text, special);
  }

  /** llama.cpp's text of `ids` (special tokens as their text), or undefined for a file without a vocabulary. */
  detokenize(ids: readonly number[]): string | undefined {
    if (this.vocabFree) return undefined;
    return this.model.detokenize(asTokens(ids), true);
  }

  /**
   * Greedy decoding of `newTokens` tokens after `prompt` (ids), from an empty sequence; llama.cpp's
   * greedy sampler (temperature 0: the arg max), no penalties.
   */
  async greedy(prompt: readonly number[], newTokens: number): Promise<LlamaCppGreedyResult> {
    await this.sequence.clearHistory();
    const tokens: number[] = [];
    const t0 = performance.now();
    let tFirst = t0;
    if (newTokens > 0) {
      for await (const t of this.sequence.evaluate(asTokens(prompt), { temperature: 0 })) {
        tokens.push(t);
        if (tokens.length === 1) tFirst = performance.now();
        if (tokens.length >= newTokens) break;
      }
    }
    return { tokens, firstTokenMs: tFirst - t0, decodeMs: performance.now() - tFirst };
  }

  /**
   * Teacher forcing: `ids` evaluated in one pass from an empty sequence; entry i of the result is
   * llama.cpp's arg max after ids[0..i] (its prediction of ids[i + 1]).
   */
  async teacherForcedTop1(ids: readonly number[]): Promise<number[]> {
    await this.sequence.clearHistory();
    const out = await this.sequence.controlledEvaluate(asTokens(ids).map((t) => [t, { generateNext: { token: true, options: { temperature: 0 } } }]));
    return ids.map((_, i) => {
      const next = out[i]?.next.token;
      if (next == null) throw new Error(`llama.cpp returned no next token at position ${i}`);
      return next;
    });
  }

  async dispose(): Promise<void> {
    await this.context.dispose();
    await this.model.dispose();
  }
}

/** node-llama-cpp brands token ids (a number type with a tag); ours are plain vocabulary rows. */
const asTokens = (ids: readonly number[]): Token[] => ids as unknown as Token[];
