// Op matmul: the GEMV kernels up to 8 rows, the GEMMs (cuBLAS or batch-invariant) past them.
import { FLOAT_OR_BF16, FLOAT, WEIGHT, type OpEncoders } from './encoder.js';

export const GEMM_ENCODERS: OpEncoders<'matmul'> = {
  matmul(e, x, c, B) {
    const rows = c('rows'), inDim = c('inDim', 1), outDim = c('outDim', 1);
    const wOff = x.weightOffset === undefined ? 0 : e.count('weightOffset', x.weightOffset as number);
    // A bf16 x (capabilities.bf16Activations) goes straight to the GEMM: more than 8 rows.
    if (B('x')?.dtype === 'bf16' && rows <= 8) e.fail(`a bf16 x needs more than 8 rows (the GEMM), got ${rows}`);
    e.buf('x', B('x'), rows * inDim, FLOAT_OR_BF16);
    const tail = e.weight(x, B('weight'), B('weightTail'), outDim, inDim, wOff);
    e.buf('out', B('out'), rows * outDim, FLOAT);
    e.optBuf('bias', B('bias'), outDim, WEIGHT);
    e.num(rows); e.num(inDim); e.num(outDim); e.num(wOff);
    tail();
    e.num(x.accumulate === true ? 1 : 0);
  },
};
