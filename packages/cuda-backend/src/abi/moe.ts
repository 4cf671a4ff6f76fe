// Mixture of experts: routing and the expert MLPs.
import { FLOAT, INT, WEIGHT, type OpEncoders } from './encoder.js';

export const MOE_ENCODERS: OpEncoders<'moe_route' | 'moe_mlp'> = {
  moe_route(e, x, c, B) {
    const rows = c('rows'), E = c('numExperts', 1), K = c('topK', 1);
    if (K > E || K > 32) e.fail(`topK ${K} must be <= numExperts (${E}) and <= 32`);
    e.buf('logits', B('logits'), rows * E, FLOAT);
    e.buf('topIds', B('topIds'), rows * K, INT);
    e.buf('topWeights', B('topWeights'), rows * K, FLOAT);
    e.num(rows); e.num(E); e.num(K); e.num(x.normalize ? 1 : 0);
  },
  moe_mlp(e, x, c, B) {
    const rows = c('rows'), hidden = c('hidden', 1), inter = c('inter', 1), K = c('topK', 1);
    e.buf('x', B('x'), rows * hidden, FLOAT);
    e.buf('topIds', B('topIds'), rows * K, INT);
    e.buf('topWeights', B('topWeights'), rows * K, FLOAT);
    e.buf('gateUp', B('gateUp'), 2 * inter * hidden, WEIGHT);
    e.buf('down', B('down'), hidden * inter, WEIGHT);
    e.buf('out', B('out'), rows * hidden, FLOAT);
    e.num(rows); e.num(hidden); e.num(inter); e.num(K);
  },
};
