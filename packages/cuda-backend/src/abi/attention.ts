// Paged attention and the merge of partial results (tiered KV).
import { FLOAT, INT, WEIGHT, type OpEncoders } from './encoder.js';

export const ATTENTION_ENCODERS: OpEncoders<'attention' | 'attention_merge'> = {
  attention(e, x, c, B) {
    const rows = c('rows'), H = c('numHeads', 1), KVH = c('numKvHeads', 1), hd = c('headDim', 1), bs = c('blockSize', 1);
    const mbps = c('maxBlocksPerSeq', 1), qStride = c('qRowStride', 1), qOff = c('qOffset');
    if (H % KVH !== 0) e.fail(`numHeads ${H} is not a multiple of numKvHeads ${KVH}`);
    if (hd > 256) e.fail(`headDim ${hd} > 256 is not supported`);
    if (qOff + H * hd > qStride) e.fail(`q heads exceed qRowStride ${qStride}`);
    const window = x.window === undefined ? 0 : c('window');
    e.buf('q', B('q'), rows > 0 ? (rows - 1) * qStride + qOff + H * hd : 0, FLOAT);
    e.buf('kCache', B('kCache'), KVH * hd, WEIGHT);
    e.buf('vCache', B('vCache'), KVH * hd, WEIGHT);
    e.buf('out', B('out'), rows * H * hd, FLOAT);
    e.buf('blockTables', B('blockTables'), mbps, INT);
    e.buf('rowSeq', B('rowSeq'), rows, INT);
    e.buf('positions', B('positions'), rows, INT);
    e.num(rows); e.num(H); e.num(KVH); e.num(hd); e.num(bs); e.num(mbps); e.num(qStride); e.num(qOff);
    e.num(x.scale as number);
    e.num(window);
    // Partial attention (tiered KV): skips negative block-table entries, writes the log-sum-exp.
    e.optBuf('lse', B('lse'), rows * H, FLOAT);
    // Every row of one sequence (the caller's promise): prefill tiles need no seam pass.
    e.num(x.oneSequence === true ? 1 : 0);
  },
  attention_merge(e, x, c, B) {
    const rows = c('rows'), H = c('numHeads', 1), hd = c('headDim', 1);
    e.buf('out', B('out'), rows * H * hd, FLOAT);
    e.buf('lse', B('lse'), rows * H, FLOAT);
    e.buf('other', B('other'), rows * H * hd, FLOAT);
    e.buf('otherLse', B('otherLse'), rows * H, FLOAT);
    e.num(rows); e.num(H); e.num(hd);
  },
};
