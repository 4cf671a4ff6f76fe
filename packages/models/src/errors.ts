import { NervaError } from '@nerva/core';

/** Why a checkpoint (safetensors file, shard manifest or weight set) was rejected. */
export type CheckpointErrorCode =
  | 'NOT_FOUND'
  | 'IO'
  | 'TRUNCATED'
  | 'HEADER_LENGTH'
  | 'HEADER_TOO_LARGE'
  | 'HEADER_NOT_JSON'
  | 'BAD_ENTRY'
  | 'UNKNOWN_DTYPE'
  | 'UNSUPPORTED_DTYPE'
  | 'SHAPE_MISMATCH'
  | 'OFFSET_OUT_OF_RANGE'
  | 'OVERLAP'
  | 'MISSING_TENSOR'
  | 'MISSING_SHARD'
  | 'BAD_INDEX'
  | 'CLOSED';

/**
 * A checkpoint file or manifest is unusable. `file` names the file at fault and, where one tensor
 * is at fault, `tensor` names it; the message repeats both so a log line alone is enough.
 */
export class CheckpointError extends NervaError {
  declare readonly code: CheckpointErrorCode;
  constructor(
    code: CheckpointErrorCode,
    readonly file: string,
    detail: string,
    readonly tensor?: string,
    options?: { cause?: unknown },
  ) {
    super(code, `${file}: ${tensor !== undefined ? `tensor "${tensor}": ` : ''}${detail} [${code}]`, options);
  }
}

/** Why a `config.json` could not become a {@link ModelSpec}. */
export type ConfigErrorCode =
  | 'NOT_FOUND'
  | 'NOT_JSON'
  | 'UNSUPPORTED_MODEL_TYPE'
  | 'MISSING_FIELD'
  | 'INVALID_FIELD'
  | 'UNSUPPORTED_ROPE'
  | 'UNSUPPORTED_FEATURE';

/** A model configuration is missing, malformed or describes something NERVA does not run. */
export class ConfigError extends NervaError {
  declare readonly code: ConfigErrorCode;
  constructor(
    code: ConfigErrorCode,
    readonly source: string,
    detail: string,
    readonly field?: string,
  ) {
    super(code, `${source}: ${detail} [${code}]`);
  }
}

/** Why a tokenizer could not be loaded or used. */
export type TokenizerErrorCode =
  | 'NOT_FOUND'
  | 'MALFORMED'
  | 'INVALID_ID'
  | 'NO_CHAT_TEMPLATE'
  | 'TEMPLATE_ERROR';

/** A tokenizer file is missing or malformed, or a call on it was invalid. */
export class TokenizerError extends NervaError {
  declare readonly code: TokenizerErrorCode;
  constructor(code: TokenizerErrorCode, message: string, options?: { cause?: unknown }) {
    super(code, message, options);
  }
}

/** A model name or path could not be resolved to a local directory. */
export class ResolveError extends NervaError {
  constructor(
    readonly query: string,
    readonly searched: readonly string[],
    detail: string,
  ) {
    super(
      'MODEL_NOT_FOUND',
      `${detail}\nlooked in:\n${searched.map((s) => `  - ${s}`).join('\n')}\n(NERVA never downloads; fetch the model into one of these places first)`,
    );
  }
}
