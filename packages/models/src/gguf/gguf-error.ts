import { NervaError } from '@nerva/core';

/** Why a GGUF file was refused, or could not be written. */
export type GgufErrorCode =
  | 'NOT_FOUND'
  | 'IO'
  | 'TRUNCATED'
  | 'BAD_MAGIC'
  | 'BAD_VERSION'
  | 'HEADER_TOO_LARGE'
  | 'TOO_MANY_KEYS'
  | 'TOO_MANY_TENSORS'
  | 'STRING_TOO_LONG'
  | 'BAD_STRING'
  | 'ARRAY_TOO_LONG'
  | 'UNKNOWN_VALUE_TYPE'
  | 'NESTED_ARRAY'
  | 'DUPLICATE_KEY'
  | 'BAD_ALIGNMENT'
  | 'BAD_TENSOR_NAME'
  | 'DUPLICATE_TENSOR'
  | 'BAD_DIMS'
  | 'DIMS_OVERFLOW'
  | 'UNKNOWN_TYPE'
  | 'NOT_BLOCK_MULTIPLE'
  | 'MISALIGNED'
  | 'OUT_OF_RANGE'
  | 'OVERLAP'
  | 'MISSING_TENSOR'
  | 'UNSUPPORTED_TYPE'
  | 'BAD_METADATA'
  | 'UNSUPPORTED_ARCH'
  | 'UNSUPPORTED_TOKENIZER'
  | 'UNSUPPORTED_MODEL'
  | 'SHAPE_MISMATCH'
  | 'BAD_INPUT'
  | 'EXISTS'
  | 'WRITE'
  | 'CLOSED';

/** What within the file is at fault: a metadata key or a tensor. */
export interface GgufErrorWhere {
  readonly key?: string;
  readonly tensor?: string;
}

/**
 * A GGUF file is malformed, hostile or describes something NERVA does not run, or one could not be
 * written. `path` names the file; `key` or `tensor` the part at fault. The message repeats them so
 * that a log line alone is enough.
 */
export class GgufError extends NervaError {
  declare readonly code: GgufErrorCode;
  readonly key?: string;
  readonly tensor?: string;
  constructor(
    code: GgufErrorCode,
    readonly path: string,
    readonly detail: string,
    where: GgufErrorWhere = {},
    options?: { cause?: unknown },
  ) {
    const at = where.key !== undefined ? `key "${where.key}": ` : where.tensor !== undefined ? `tensor "${where.tensor}": ` : '';
    super(code, `${path}: ${at}${detail} [${code}]`, options);
    if (where.key !== undefined) this.key = where.key;
    if (where.tensor !== undefined) this.tensor = where.tensor;
  }
}
