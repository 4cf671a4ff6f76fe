/**
 * The op encoders: an op's arguments packed into one Float64Array for the addon's launch (the
 * native ABI). One file per op family, as the native ops are split. Validates what can be checked
 * on the host: dtypes, element counts against buffer lengths, attribute ranges, so a bad call is
 * a typed error rather than an illegal memory access on the GPU.
 */
import type { DeviceBuffer, OpArgs, OpName } from '@nerva/core';
import { ATTENTION_ENCODERS } from './attention.js';
import { ELEMENTWISE_ENCODERS } from './elementwise.js';
import { ArgWriter, type OpEncode, type Resolve } from './encoder.js';
import { GEMM_ENCODERS } from './gemm.js';
import { GEMV_ENCODERS } from './gemv.js';
import { MOE_ENCODERS } from './moe.js';
import { SAMPLE_ENCODERS } from './sample.js';

export { DTYPE_CODES, OP_CODES, type ResolvedBuffer } from './encoder.js';

// Every op the kernels run (op mlp_slice runs on the host: src/host-mlp.ts).
const ENCODERS: Readonly<Partial<Record<OpName, OpEncode>>> = {
  ...ELEMENTWISE_ENCODERS,
  ...GEMM_ENCODERS,
  ...GEMV_ENCODERS,
  ...ATTENTION_ENCODERS,
  ...MOE_ENCODERS,
  ...SAMPLE_ENCODERS,
};

/** Encodes ops into one reused argument array (`args`, the first `n` entries). */
export class OpEncoder extends ArgWriter {
  constructor(resolve: Resolve) {
    super(resolve);
  }

  encode<K extends OpName>(op: K, a: OpArgs<K>): void {
    this.n = 0;
    this.op = op;
    const x = a as unknown as Record<string, unknown>;
    const c = (name: string, min = 0) => this.count(name, x[name] as number, min);
    const B = (name: string) => x[name] as DeviceBuffer | undefined;
    const enc = Object.hasOwn(ENCODERS, op) ? ENCODERS[op] : undefined;
    if (!enc) this.fail('unknown op');
    enc(this, x, c, B);
  }
}
