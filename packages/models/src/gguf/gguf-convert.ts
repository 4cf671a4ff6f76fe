/**
 * Hugging Face safetensors folder → GGUF file, as llama.cpp's converter and quantizer lay it out:
 * its tensor names and dims, q/k rows reordered for the `llama` architecture, experts stacked,
 * its per-tensor type rules ({@link planGgufTypes}), its metadata keys and tokenizer form. Tensor
 * data is streamed: source rows are read in bands, converted and written, so memory stays at a
 * band whatever the model's size.
 */
import { open as openFile, stat, type FileHandle } from 'node:fs/promises';
import { basename, resolve } from 'node:path';
import type { Checkpoint } from '../checkpoint.js';
import { loadModelDir } from '../model-dir.js';
import { readOptionalModelText } from '../model-file.js';
import { isWeightDType, rawToF32 } from '../safetensors.js';
import { readTokenizerJson } from '../tokenizer.js';
import { canonicalWeightNames, listWeightSlots } from '../weights.js';
import type { ModelSpec } from '../config.js';
import { quantize, type GgmlTypeName } from '@nerva/core';
import { assertQuantizable, type ConvertToGgufOptions, type ConvertToGgufResult } from './gguf-convert-options.js';
import { GgufError } from './gguf-error.js';
import { isGgufPath } from './gguf-model.js';
import { ggufLocationOf, permuteRopeRows, ropePermutedHeads } from './gguf-names.js';
import { requantizeGguf } from './gguf-requantize.js';
import { ggufModelMetadata, ROPE_FREQS_TENSOR } from './gguf-spec.js';
import { ggufTokenizerMetadata } from './gguf-tokenizer.js';
import { ggufValue } from './gguf-value.js';
import { GGUF_CONVERT_FILE_TYPES, GGUF_CONVERT_TYPES, planGgufTypes } from './gguf-type-plan.js';
import { writeGgufSplits } from './gguf-split.js';
import type { GgufWriteTensor } from './gguf-writer.js';

/** Source rows converted per band: bounded memory whatever the tensor's size. */
const BAND_BYTES = 16 * 1024 * 1024;

/**
 * Convert the HF model folder `opts.source` to a GGUF file at `opts.out`; a `.gguf` source is
 * written again at `opts.type` ({@link requantizeGguf}). Throws
 * {@link GgufError}: BAD_INPUT (unknown type, a source that is not a folder), NOT_FOUND,
 * UNSUPPORTED_MODEL / UNSUPPORTED_TOKENIZER (what has no faithful GGUF form), UNSUPPORTED_TYPE
 * (a block type whose quantization is not available), EXISTS, WRITE; and the `ConfigError` /
 * `CheckpointError` of an invalid folder. Nothing is left at `out` on failure.
 */
export async function convertToGguf(opts: ConvertToGgufOptions): Promise<ConvertToGgufResult> {
  const out = resolve(opts.out);
  if (!(GGUF_CONVERT_TYPES as readonly string[]).includes(opts.type)) {
    throw new GgufError('BAD_INPUT', out, `unknown type "${String(opts.type)}"; one of ${GGUF_CONVERT_TYPES.join(', ')}`);
  }
  const source = resolve(opts.source);
  if (isGgufPath(source)) return requantizeGguf(opts);
  try {
    if (!(await stat(source)).isDirectory()) throw new GgufError('BAD_INPUT', source, 'the source is not a folder');
  } catch (e) {
    if (e instanceof GgufError) throw e;
    throw new GgufError('NOT_FOUND', source, `no such model folder: ${(e as Error).message}`, {}, { cause: e });
  }
  if (!opts.overwrite && (await stat(out).then(() => true, () => false))) {
    throw new GgufError('EXISTS', out, 'already exists (pass --force to replace it)');
  }

  const loaded = await loadModelDir(source, { tokenizer: false });
  const ckpt = loaded.checkpoint as Checkpoint;
  const handles = new Map<string, Promise<FileHandle>>();
  try {
    const { spec } = loaded;
    const fileType = GGUF_CONVERT_FILE_TYPES[opts.type];
    const model = ggufModelMetadata(spec, { name: opts.name ?? basename(source), fileType, ...(loaded.generationConfig && { generationConfig: loaded.generationConfig }) }, out);
    const tokenizerJson = await readTokenizerJson(source, 'tokenizer.json', false);
    const metadata = [...model.metadata];
    if (tokenizerJson === undefined) {
      // No vocabulary: llama.cpp's "none" tokenizer (token ids in, token ids out), with the config's ids.
      metadata.push(['tokenizer.ggml.model', ggufValue.str('none')]);
      if (spec.bosTokenId !== undefined) metadata.push(['tokenizer.ggml.bos_token_id', ggufValue.u32(spec.bosTokenId)]);
      if (spec.eosTokenIds.length > 0) metadata.push(['tokenizer.ggml.eos_token_id', ggufValue.u32(spec.eosTokenIds[0])]);
    } else {
      const tokenizerConfig = (await readTokenizerJson(source, 'tokenizer_config.json', false)) ?? {};
      const chatTemplate = (await readOptionalModelText(source, 'chat_template.jinja')) ?? configTemplate(tokenizerConfig);
      metadata.push(
        ...ggufTokenizerMetadata(
          {
            tokenizerJson,
            tokenizerConfig,
            vocabRows: spec.vocabSize,
            ...(chatTemplate !== undefined && { chatTemplate }),
            ...(spec.bosTokenId !== undefined && { bosTokenId: spec.bosTokenId }),
            ...(spec.eosTokenIds.length > 0 && { eosTokenId: spec.eosTokenIds[0] }),
          },
          out,
        ),
      );
    }

    const planned = ggufTensorLayout(spec);
    const shapes = [...planned.map((p) => ({ name: p.name, dims: p.dims })), ...(model.ropeFreqs ? [{ name: ROPE_FREQS_TENSOR, dims: [model.ropeFreqs.length] }] : [])];
    const types = planGgufTypes(shapes, spec, opts.type);
    assertQuantizable(types, opts.type, out);

    const handle = (file: string): Promise<FileHandle> => {
      let h = handles.get(file);
      if (!h) handles.set(file, (h = openFile(file, 'r')));
      return h;
    };
    const tensors: GgufWriteTensor[] = planned.map((p) => ({
      name: p.name,
      type: types.get(p.name)!,
      dims: p.dims,
      data: () => bands(ckpt, p, types.get(p.name)!, handle),
    }));
    // llama.cpp's Llama 3 RoPE factors, right after the embedding as its converter places them.
    if (model.ropeFreqs) {
      const f = model.ropeFreqs;
      tensors.splice(1, 0, { name: ROPE_FREQS_TENSOR, type: 'F32', dims: [f.length], data: async () => new Uint8Array(f.buffer, f.byteOffset, f.byteLength) });
    }
    const written = await writeGgufSplits(out, {
      metadata,
      tensors,
      overwrite: opts.overwrite ?? false,
      ...(opts.splitMaxBytes !== undefined && { splitMaxBytes: opts.splitMaxBytes }),
      ...(opts.onProgress && { onProgress: opts.onProgress }),
    });
    return { out: written.paths[0], files: written.paths, bytes: written.bytes, fileType, tensors: tensors.map((t) => ({ name: t.name, type: t.type, dims: t.dims })), tokenizer: tokenizerJson !== undefined };
  } finally {
    for (const h of handles.values()) await h.then((fh) => fh.close()).catch(() => undefined);
    await ckpt.close();
  }
}

/** A config's chat template: one string, or the one named "default" of a list. */
function configTemplate(cfg: unknown): string | undefined {
  const t = (cfg as { chat_template?: unknown } | null)?.chat_template;
  if (typeof t === 'string') return t;
  if (Array.isArray(t)) {
    const named = t.find((x: { name?: unknown }) => x?.name === 'default') ?? t[0];
    return typeof named?.template === 'string' ? named.template : undefined;
  }
  return undefined;
}

/** One tensor of a model's GGUF layout. */
export interface GgufTensorPlan {
  /** GGUF name. */
  readonly name: string;
  /** ggml dims. */
  readonly dims: readonly number[];
  /** The HF tensors it is made of: one, or one per expert (in order) for a stacked expert tensor. */
  readonly sources: readonly string[];
  /** Rotary heads whose q/k rows llama.cpp's converter reorders (0: none). */
  readonly ropeHeads: number;
}

/**
 * The GGUF tensors of `spec` in llama.cpp's layout, in load order (embedding, layers, final norm,
 * output; `rope_freqs` is not included), routed experts grouped into one stacked tensor per
 * projection. Throws UNSUPPORTED_MODEL for a tensor llama.cpp has no name for.
 */
export function ggufTensorLayout(spec: ModelSpec): GgufTensorPlan[] {
  const out: { name: string; dims: number[]; sources: string[]; ropeHeads: number }[] = [];
  const stacked = new Map<string, (typeof out)[number]>();
  for (const slot of listWeightSlots(canonicalWeightNames(spec))) {
    const loc = ggufLocationOf(slot.name);
    if (!loc) throw new GgufError('UNSUPPORTED_MODEL', '<gguf>', `tensor "${slot.name}" has no llama.cpp name`);
    const dims = [...slot.shape].reverse();
    if (loc.expert === undefined) {
      out.push({ name: loc.name, dims, sources: [slot.name], ropeHeads: ropePermutedHeads(spec.arch, loc.name, spec.numHeads, spec.numKvHeads) });
      continue;
    }
    let p = stacked.get(loc.name);
    if (!p) {
      p = { name: loc.name, dims: [...dims, spec.moe!.numExperts], sources: [], ropeHeads: 0 };
      stacked.set(loc.name, p);
      out.push(p);
    }
    p.sources[loc.expert] = slot.name;
  }
  return out;
}

/** The bytes of planned tensor `p` as `type`, read and converted one band of source rows at a time. */
async function* bands(ckpt: Checkpoint, p: GgufTensorPlan, type: GgmlTypeName, handle: (file: string) => Promise<FileHandle>): AsyncGenerator<Uint8Array> {
  for (const src of p.sources) {
    const info = ckpt.info(src);
    if (!isWeightDType(info.dtype)) throw new GgufError('UNSUPPORTED_TYPE', info.file, `dtype ${info.dtype} is not F32, F16 or BF16`, { tensor: src });
    const rows = info.shape[0];
    const rowBytes = info.byteLength / rows;
    const rowElems = info.shape.length > 1 ? info.shape[1] : 1;
    // A band holds whole rotary heads when q/k rows are reordered (the reordering stays within a head).
    const unit = p.ropeHeads > 0 ? rows / p.ropeHeads : 1;
    const perBand = Math.max(unit, Math.floor(BAND_BYTES / (rowElems * 4) / unit) * unit);
    const fh = await handle(info.file);
    for (let r = 0; r < rows; r += perBand) {
      const n = Math.min(perBand, rows - r);
      let raw: Uint8Array = new Uint8Array(n * rowBytes);
      let done = 0;
      while (done < raw.byteLength) {
        const { bytesRead } = await fh.read(raw, done, raw.byteLength - done, info.byteOffset + r * rowBytes + done);
        if (bytesRead === 0) throw new GgufError('IO', info.file, `unexpected end of file reading rows ${r}..${r + n}`, { tensor: src });
        done += bytesRead;
      }
      if (p.ropeHeads > 0) raw = permuteRopeRows(raw, n, n / unit, true);
      yield info.dtype === type ? raw : quantize(type, rawToF32(info.dtype, raw));
    }
  }
}
