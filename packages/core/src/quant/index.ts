/**
 * Block formats of ggml's quantized types: dequantization (every type GGUF readers meet) and
 * quantization with llama.cpp's reference rounding (the types `nerva convert` writes). Both work
 * on the raw block bytes a GGUF file stores, which is also the layout the backends consume.
 */
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16 } from '../dtype.js';
import { isQuantDType, type DType, type QuantDType } from '../dtype.js';
import { ggmlByteLength, type GgmlTypeName } from './ggml-types.js';

/** The ggml type a quantized buffer dtype holds. */
export function ggmlTypeOf(d: QuantDType): GgmlTypeName {
  return d.toUpperCase() as GgmlTypeName;
}

/** The buffer dtype of a ggml type: f32/f16/bf16, or the quantized dtype; undefined for others (e.g. Q8_K). */
export function dtypeOfGgml(t: GgmlTypeName): DType | undefined {
  if (t === 'F32') return 'f32';
  if (t === 'F16') return 'f16';
  if (t === 'BF16') return 'bf16';
  const q = t.toLowerCase();
  return isQuantDType(q) ? q : undefined;
}

/** Decode `elements` values of `type` from `src` (whole blocks) into f32. */
export function dequantize(type: GgmlTypeName, src: Uint8Array, elements: number, dst: Float32Array<ArrayBufferLike> = new Float32Array(elements)): Float32Array<ArrayBufferLike> {
  const bytes = ggmlByteLength(type, elements);
  if (src.byteLength < bytes) throw new RangeError(`${type}: ${elements} elements need ${bytes} bytes, got ${src.byteLength}`);
  const view = new DataView(src.buffer, src.byteOffset, bytes);
  switch (type) {
    case 'F32':
      for (let i = 0; i < elements; i++) dst[i] = view.getFloat32(i * 4, true);
      return dst;
    case 'F16':
      for (let i = 0; i < elements; i++) dst[i] = f16ToF32(view.getUint16(i * 2, true));
      return dst;
    case 'BF16':
      for (let i = 0; i < elements; i++) dst[i] = bf16ToF32(view.getUint16(i * 2, true));
      return dst;
    default:
      throw new RangeError(`dequantization of ${type} is not supported`);
  }
}

/** Encode f32 values as `type` (length a whole number of blocks). */
export function quantize(type: GgmlTypeName, src: Float32Array): Uint8Array {
  const out = new Uint8Array(ggmlByteLength(type, src.length));
  const view = new DataView(out.buffer);
  switch (type) {
    case 'F32':
      for (let i = 0; i < src.length; i++) view.setFloat32(i * 4, src[i], true);
      return out;
    case 'F16':
      for (let i = 0; i < src.length; i++) view.setUint16(i * 2, f32ToF16(src[i]), true);
      return out;
    case 'BF16':
      for (let i = 0; i < src.length; i++) view.setUint16(i * 2, f32ToBf16(src[i]), true);
      return out;
    default:
      throw new RangeError(`quantization to ${type} is not supported`);
  }
}
