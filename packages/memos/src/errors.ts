import { NervaError } from '@nerva/core';

/** The budget cannot hold the smallest working set the plan needs (hot blocks + staging slots). */
export class WorkingSetTooLargeError extends NervaError {
  constructor(
    readonly budgetBytes: number,
    readonly minimumBytes: number,
    detail: string,
  ) {
    super('WORKING_SET_TOO_LARGE', `budget of ${fmt(budgetBytes)} cannot hold the minimum working set of ${fmt(minimumBytes)}: ${detail}`);
  }
}

/** The offload directory cannot be used (missing, unwritable, not a directory, full). */
export class OffloadDirError extends NervaError {
  constructor(
    readonly dir: string,
    detail: string,
    options?: { cause?: unknown },
  ) {
    super('OFFLOAD_DIR', `offload dir ${dir}: ${detail}`, options);
  }
}

/** A plan input is malformed (negative sizes, duplicate ids, a bad budget). */
export class PlanInputError extends NervaError {
  constructor(detail: string) {
    super('PLAN_INPUT', detail);
  }
}

/** The pager was driven out of its protocol (acquire of a block that is not streamed, release twice...). */
export class PagerStateError extends NervaError {
  constructor(detail: string) {
    super('PAGER_STATE', detail);
  }
}

/** Bytes as the user typed them: GiB/MiB with two decimals. */
export function fmt(bytes: number): string {
  if (bytes >= 2 ** 30) return `${(bytes / 2 ** 30).toFixed(2)} GiB`;
  if (bytes >= 2 ** 20) return `${(bytes / 2 ** 20).toFixed(2)} MiB`;
  if (bytes >= 2 ** 10) return `${(bytes / 2 ** 10).toFixed(2)} KiB`;
  return `${bytes} B`;
}
