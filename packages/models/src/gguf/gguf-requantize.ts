/**
 * GGUF file → GGUF file at another type, as llama.cpp's `llama-quantize` does it: the metadata
 * copied with `general.file_type` set, every tensor in the source's order and layout, each
 * typed by {@link planGgufTypes} from the file's own model facts. A tensor already in its planned
 * type is copied byte for byte; others are decoded to f32 and encoded again, one band of rows at
 * a time. A tensor that is already block-quantized is re-encoded only when asked
 * (`allowRequantize`): that rounds twice, as `llama-quantize --allow-requantize` warns.
 */
import { resolve } from 'node:path';
import { dequantize, quantize, type GgmlTypeName } from '@nerva/core';
import { GgufCheckpoint } from './gguf-checkpoint.js';
import { assertQuantizable, type ConvertToGgufOptions, type ConvertToGgufResult } from './gguf-convert-options.js';
import { GgufError } from './gguf-error.js';
import type { GgufTensorInfo } from './gguf-header.js';
import type { GgufFile } from './gguf-file.js';
import { GGUF_CONVERT_FILE_TYPES, planGgufTypes } from './gguf-type-plan.js';
import { ggufValue, type GgufValue } from './gguf-value.js';
import { writeGgufSplits } from './gguf-split.js';
import type { GgufWriteTensor } from './gguf-writer.js';

/** Source bytes read per band: bounded memory whatever the tensor's size. */
const BAND_BYTES = 16 * 1024 * 1024;

/** ggml's GGML_QNT_VERSION, which llama-quantize writes as `general.quantization_version`. */
const QUANTIZATION_VERSION = 2;

const FLOAT_TYPES: readonly GgmlTypeName[] = ['F32', 'F16', 'BF16'];

/**
 * Write `opts.source` (a `.gguf` file) again at `opts.type`. Throws {@link GgufError}:
 * NOT_FOUND / IO and the header codes of an unreadable source; BAD_INPUT when block-quantized
 * tensors would be re-encoded without `allowRequantize`; UNSUPPORTED_TYPE, EXISTS, WRITE as
 * {@link convertToGguf}. Nothing is left at `opts.out` on failure.
 */
export async function requantizeGguf(opts: ConvertToGgufOptions): Promise<ConvertToGgufResult> {
  const source = resolve(opts.source);
  const out = resolve(opts.out);
  if (source === out) throw new GgufError('BAD_INPUT', out, 'the output is the source file');
  const ck = await GgufCheckpoint.open(source);
  try {
    const { file, spec } = ck;
    const types = planGgufTypes(file.tensors, spec, opts.type);
    const twice = file.tensors.filter((t) => !FLOAT_TYPES.includes(t.type) && types.get(t.name) !== t.type);
    if (twice.length > 0 && !opts.allowRequantize) {
      const t = twice[0];
      throw new GgufError(
        'BAD_INPUT',
        source,
        `${twice.length} tensors are already quantized (e.g. ${t.name}: ${t.type} → ${types.get(t.name)}); re-encoding rounds them twice: pass --allow-requantize (allowRequantize) to do it anyway`,
      );
    }
    assertQuantizable(types, opts.type, out);
    const fileType = GGUF_CONVERT_FILE_TYPES[opts.type];
    const metadata = copiedMetadata(file, {
      'general.file_type': ggufValue.u32(fileType),
      'general.quantization_version': ggufValue.u32(QUANTIZATION_VERSION),
      ...(opts.name !== undefined && { 'general.name': ggufValue.str(opts.name) }),
    });
    const tensors: GgufWriteTensor[] = file.tensors.map((t) => ({ name: t.name, type: types.get(t.name)!, dims: t.dims, data: () => bands(file, t, types.get(t.name)!) }));
    const written = await writeGgufSplits(out, {
      metadata,
      tensors,
      alignment: file.header.alignment,
      overwrite: opts.overwrite ?? false,
      ...(opts.splitMaxBytes !== undefined && { splitMaxBytes: opts.splitMaxBytes }),
      ...(opts.onProgress && { onProgress: opts.onProgress }),
    });
    const tok = file.get('tokenizer.ggml.model');
    return {
      out: written.paths[0],
      files: written.paths,
      bytes: written.bytes,
      fileType,
      tensors: tensors.map((t) => ({ name: t.name, type: t.type, dims: t.dims })),
      tokenizer: tok !== undefined && !(tok.type === 'STRING' && tok.value === 'none'),
    };
  } finally {
    await ck.close();
  }
}

/** The source's metadata in its order, `set`'s keys replaced in place or appended. */
function copiedMetadata(file: GgufFile, set: Record<string, GgufValue>): [string, GgufValue][] {
  const out: [string, GgufValue][] = [];
  const left = new Map(Object.entries(set));
  for (const [k, v] of file.metadata) {
    // The alignment goes through the writer's option; a split source's keys are its files', not the output's.
    if (k === 'general.alignment' || k.startsWith('split.')) continue;
    const replaced = left.get(k);
    out.push([k, replaced ?? v]);
    left.delete(k);
  }
  return [...out, ...left];
}

/** Tensor `t`'s bytes as `type`, one band of whole rows at a time. */
async function* bands(file: GgufFile, t: GgufTensorInfo, type: GgmlTypeName): AsyncGenerator<Uint8Array> {
  const rowElems = t.dims[0];
  const rows = t.elements / rowElems;
  const rowBytes = t.byteLength / rows;
  const perBand = Math.max(1, Math.floor(BAND_BYTES / (rowElems * 4)));
  for (let r = 0; r < rows; r += perBand) {
    const n = Math.min(perBand, rows - r);
    const raw = new Uint8Array(n * rowBytes);
    await file.readTensorRange(t.name, r * rowBytes, raw);
    yield type === t.type ? raw : quantize(type, dequantize(t.type, raw, n * rowElems) as Float32Array);
  }
}
