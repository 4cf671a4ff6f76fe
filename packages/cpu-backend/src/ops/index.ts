/** The kernel table: one function per op of the catalogue, checked complete by the type. */
import type { OpArgs, OpName } from '@nerva/core';
import type { OpContext } from '../op-context.js';
import { add } from './add.js';
import { advancePositions } from './advance-positions.js';
import { argmax } from './argmax.js';
import { attention } from './attention.js';
import { attentionMerge } from './attention-merge.js';
import { decoderLayers } from './decoder-layers.js';
import { embedding } from './embedding.js';
import { fusedMatmul } from './fused-matmul.js';
import { gatherRows } from './gather-rows.js';
import { kvAppend } from './kv-append.js';
import { matmul } from './matmul.js';
import { mlpSlice } from './mlp-slice.js';
import { moeMlp } from './moe-mlp.js';
import { moeRoute } from './moe-route.js';
import { rmsnorm } from './rmsnorm.js';
import { ringPush } from './ring-push.js';
import { rope } from './rope.js';
import { ropeAppend } from './rope-append.js';
import { sample } from './sample.js';
import { siluMul } from './silu-mul.js';

export type Kernel<K extends OpName> = (ctx: OpContext, args: OpArgs<K>) => void;

export const KERNELS: { readonly [K in OpName]: Kernel<K> } = {
  embedding,
  rmsnorm,
  matmul,
  rope,
  kv_append: kvAppend,
  attention,
  silu_mul: siluMul,
  add,
  gather_rows: gatherRows,
  moe_route: moeRoute,
  moe_mlp: moeMlp,
  argmax,
  sample,
  ring_push: ringPush,
  advance_positions: advancePositions,
  fused_matmul: fusedMatmul,
  rope_append: ropeAppend,
  decoder_layers: decoderLayers,
  mlp_slice: mlpSlice,
  attention_merge: attentionMerge,
};

export { DEFAULT_QK_NORM_EPS } from './rope.js';
