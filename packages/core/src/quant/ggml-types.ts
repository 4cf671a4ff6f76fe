/**
 * ggml tensor types as GGUF files number them, with their block geometry. A quantized tensor is
 * stored as consecutive blocks of `blockSize` elements, each `typeSize` bytes, along the
 * innermost dimension (which must therefore be a multiple of `blockSize`).
 */
export const GGML_TYPES = {
  F32: { id: 0, blockSize: 1, typeSize: 4 },
  F16: { id: 1, blockSize: 1, typeSize: 2 },
  Q4_0: { id: 2, blockSize: 32, typeSize: 18 },
  Q4_1: { id: 3, blockSize: 32, typeSize: 20 },
  Q5_0: { id: 6, blockSize: 32, typeSize: 22 },
  Q5_1: { id: 7, blockSize: 32, typeSize: 24 },
  Q8_0: { id: 8, blockSize: 32, typeSize: 34 },
  Q8_1: { id: 9, blockSize: 32, typeSize: 36 },
  Q2_K: { id: 10, blockSize: 256, typeSize: 84 },
  Q3_K: { id: 11, blockSize: 256, typeSize: 110 },
  Q4_K: { id: 12, blockSize: 256, typeSize: 144 },
  Q5_K: { id: 13, blockSize: 256, typeSize: 176 },
  Q6_K: { id: 14, blockSize: 256, typeSize: 210 },
  Q8_K: { id: 15, blockSize: 256, typeSize: 292 },
  IQ4_NL: { id: 20, blockSize: 32, typeSize: 18 },
  IQ4_XS: { id: 23, blockSize: 256, typeSize: 136 },
  BF16: { id: 30, blockSize: 1, typeSize: 2 },
} as const;

export type GgmlTypeName = keyof typeof GGML_TYPES;

const BY_ID: ReadonlyMap<number, GgmlTypeName> = new Map(
  (Object.keys(GGML_TYPES) as GgmlTypeName[]).map((n) => [GGML_TYPES[n].id, n]),
);

/** The type name of a GGUF type id, or undefined for ids this reader does not know. */
export function ggmlTypeName(id: number): GgmlTypeName | undefined {
  return BY_ID.get(id);
}

/** Bytes of `elements` values of `type`; throws when `elements` is not a whole number of blocks. */
export function ggmlByteLength(type: GgmlTypeName, elements: number): number {
  const { blockSize, typeSize } = GGML_TYPES[type];
  if (elements % blockSize !== 0) throw new RangeError(`${elements} elements is not a whole number of ${type} blocks of ${blockSize}`);
  return (elements / blockSize) * typeSize;
}

/** `general.file_type` values (llama.cpp's LLAMA_FTYPE_*) this project reads and writes. */
export const GGUF_FILE_TYPES = {
  ALL_F32: 0,
  MOSTLY_F16: 1,
  MOSTLY_Q4_0: 2,
  MOSTLY_Q4_1: 3,
  MOSTLY_Q8_0: 7,
  MOSTLY_Q5_0: 8,
  MOSTLY_Q5_1: 9,
  MOSTLY_Q2_K: 10,
  MOSTLY_Q3_K_S: 11,
  MOSTLY_Q3_K_M: 12,
  MOSTLY_Q3_K_L: 13,
  MOSTLY_Q4_K_S: 14,
  MOSTLY_Q4_K_M: 15,
  MOSTLY_Q5_K_S: 16,
  MOSTLY_Q5_K_M: 17,
  MOSTLY_Q6_K: 18,
  MOSTLY_IQ4_NL: 25,
  MOSTLY_IQ4_XS: 30,
  MOSTLY_BF16: 32,
} as const;
