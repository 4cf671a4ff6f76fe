import { NervaError } from '@nerva/core';

/** OpenAI's error `type` values (and the HTTP statuses they go with here). */
export type ApiErrorType =
  | 'invalid_request_error'
  | 'authentication_error'
  | 'not_found_error'
  | 'timeout_error'
  | 'rate_limit_error'
  | 'server_error'
  | 'service_unavailable';

/** The JSON body of every error response: `{"error": {message, type, param, code}}`. */
export interface OpenAiErrorBody {
  error: { message: string; type: ApiErrorType; param: string | null; code: string | null };
}

/** An error that becomes one HTTP response in OpenAI's error shape. */
export class ApiError extends NervaError {
  constructor(
    readonly status: number,
    readonly type: ApiErrorType,
    message: string,
    readonly param: string | null = null,
    code: string | null = null,
    /** Extra response headers (e.g. Retry-After). */
    readonly headers: Record<string, string> = {},
  ) {
    super(code ?? type, message);
  }

  toBody(): OpenAiErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code === this.type ? null : this.code } };
  }
}

/** 400 naming the offending field. */
export function badRequest(message: string, param: string | null = null, code: string | null = null): ApiError {
  return new ApiError(400, 'invalid_request_error', message, param, code);
}

/** Configuration problems (file, flags): the message names the key. */
export class ConfigError extends NervaError {
  constructor(
    readonly key: string,
    message: string,
  ) {
    super('CONFIG', message);
  }
}
