/** Conformance cases, token selection and the decode step tail: argmax, sample, ring_push, advance_positions. */
import { step, f32, i32, intOut, type BufDef, type Step, type Excuse, type OutputDef, type CaseDef, type CaseTable } from './kit.js';
import type { DeviceBuffer } from '../backend.js';
import { sampleRow, uniformFromSeed, type SampleParams } from '../sampling.js';

function argmaxCase(name: string, rows: number, vocab: number, withTie: boolean, large = false): CaseDef {
  return {
    name,
    large,
    build: (rng) => {
      const logits = rng.normals(rows * vocab, 2);
      if (withTie && vocab >= 3) {
        // An exact tie: the contract says lowest index, so this one is not excused.
        let m = -Infinity;
        for (let i = 0; i < vocab; i++) m = Math.max(m, logits[i]);
        logits[vocab - 1] = m + 1;
        logits[1] = m + 1;
      }
      const excuse: Excuse = (r, got, ref, relTol, absTol) => {
        if (got < 0 || got >= vocab) return false;
        const a = logits[r * vocab + got];
        const b = logits[r * vocab + ref];
        let max = 0;
        for (let i = 0; i < vocab; i++) max = Math.max(max, Math.abs(logits[r * vocab + i]));
        return a !== b && Math.abs(a - b) <= relTol * max + absTol;
      };
      return {
        buffers: { logits: f32(logits), out: i32(new Int32Array(rows).fill(-3)) },
        steps: [step('argmax', (b) => ({ logits: b.logits, out: b.out, rows, vocab }))],
        outputs: [intOut('out', excuse)],
      };
    },
  };
}

/**
 * Sampling: several parameter sets per call and `draws` calls on the same rng buffer, so the
 * counter the op advances is exercised. A mismatch is excused only when nudging u, topP or minP
 * by a tolerance-sized amount makes the reference rule pick the backend's token.
 */
/**
 * `tail`: each draw also pushes its tokens into a ring and advances the rows' positions and
 * slots (op sample's push and advance, capabilities.opFields), as a decode step's tail.
 */
interface SampleTail {
  capacity: number;
  cursor: number;
  blockSize: number;
}

/**
 * `limit` (op sample's limit: only ids below it are candidates, the rows stay `vocab` apart): the
 * padded tail [limit, vocab) of every row then holds the row's largest logits, so a backend that
 * reads past the limit picks a tail id (as a checkpoint padded past its tokenizer would).
 */
/**
 * `masked` (op sample's mask, constrained decoding): every row but the last is masked, each with a
 * mask of its own that allows about a third of the ids and never the row's largest logits (a
 * backend that ignores the mask picks them); the last row is unmasked (index -1). The reference
 * is the rule over the allowed ids alone (the others at -Infinity).
 */
function sampleCase(name: string, vocab: number, params: number[][], draws: number, scale: number, tail?: SampleTail, limit?: number, masked = false): CaseDef {
  const fields = [...(tail !== undefined ? ['push', 'advance'] : []), ...(masked ? ['mask'] : [])];
  return {
    name,
    ...(fields.length > 0 ? { fields } : {}),
    build: (rng) => {
      const rows = params.length;
      const logits = rng.normals(rows * vocab, scale);
      const ids = limit ?? vocab;
      if (limit !== undefined) {
        for (let r = 0; r < rows; r++) {
          let m = -Infinity;
          for (let i = 0; i < limit; i++) m = Math.max(m, logits[r * vocab + i]);
          for (let i = limit; i < vocab; i++) logits[r * vocab + i] = m + scale * (1 + rng.next());
        }
      }
      const words = Math.ceil(vocab / 32);
      const maskBits = new Int32Array(Math.max(1, rows - 1) * words);
      const maskIndex = new Int32Array(rows).fill(-1);
      // The rule's view of the rows: the masked rows' disallowed ids at -Infinity.
      const ruleLogits = Float32Array.from(logits);
      if (masked) {
        for (let r = 0; r < rows - 1; r++) {
          // Rows take their masks in reverse order, so a backend reading mask r for row r fails.
          const k = rows - 2 - r;
          maskIndex[r] = k;
          let top = 0;
          for (let i = 1; i < ids; i++) if (logits[r * vocab + i] > logits[r * vocab + top]) top = i;
          for (let i = 0; i < ids; i++) {
            if (i !== top && rng.next() < 1 / 3) maskBits[k * words + (i >>> 5)] |= 1 << (i & 31);
          }
          // At least one allowed id, the row's smallest.
          let low = 0;
          for (let i = 1; i < ids; i++) if (logits[r * vocab + i] < logits[r * vocab + low]) low = i;
          maskBits[k * words + (low >>> 5)] |= 1 << (low & 31);
          for (let i = 0; i < vocab; i++) if (!((maskBits[k * words + (i >>> 5)] >>> (i & 31)) & 1)) ruleLogits[r * vocab + i] = -Infinity;
        }
      }
      const state = new Int32Array(rows * 2);
      for (let r = 0; r < rows; r++) {
        state[2 * r] = (rng.int(0, 0x7fffffff) * (rng.next() < 0.5 ? -1 : 1)) | 0;
        state[2 * r + 1] = rng.int(0, 1 << 20);
      }
      const p32 = Float32Array.from(params.flat());
      const excuseFor =
        (draw: number): Excuse =>
        (r, got, ref, relTol, absTol) => {
          if (got < 0 || got >= ids) return false;
          const u = uniformFromSeed(state[2 * r], (state[2 * r + 1] + draw) | 0);
          const d = Math.max(16 * relTol, absTol);
          const base: SampleParams = { temperature: p32[4 * r], topK: p32[4 * r + 1], topP: p32[4 * r + 2], minP: p32[4 * r + 3] };
          const tries: Array<[SampleParams, number]> = [
            [base, Math.min(u + d, 1 - 1e-12)],
            [base, Math.max(u - d, 0)],
            [{ ...base, topP: base.topP + d }, u],
            [{ ...base, topP: base.topP - d }, u],
            [{ ...base, minP: base.minP * (1 + d) }, u],
            [{ ...base, minP: base.minP * (1 - d) }, u],
          ];
          return ref !== got && ruleLogits[r * vocab + got] !== -Infinity && tries.some(([sp, uu]) => sampleRow(ruleLogits, r * vocab, ids, sp, uu) === got);
        };
      const buffers: Record<string, BufDef> = { logits: f32(logits), params: f32(p32), rng: i32(state) };
      if (masked) {
        buffers.maskBits = i32(maskBits);
        buffers.maskIndex = i32(maskIndex);
      }
      const maskArg = (b: Record<string, DeviceBuffer>) => (masked ? { mask: { bits: b.maskBits, index: b.maskIndex, words } } : {});
      const steps: Step[] = [];
      const outputs: OutputDef[] = [];
      // The tail's state: a ring partly filled, each row at a position of its own whose next
      // positions cross block boundaries within the draws, tables in a shuffled order.
      const maxBlocks = tail ? Math.ceil((3 * tail.blockSize + draws) / tail.blockSize) + 1 : 0;
      if (tail) {
        buffers.ring = i32(Array.from({ length: tail.capacity }, () => -1 - rng.int(0, 100)));
        buffers.cursor = i32([tail.cursor]);
        buffers.blockTables = i32(rng.perm(rows * maxBlocks));
        buffers.rowSeq = i32(rng.perm(rows));
        buffers.positions = i32(Array.from({ length: rows }, (_, r) => tail.blockSize * (1 + (r % 3)) - 1 - (r % 2)));
        buffers.slots = i32(new Int32Array(rows).fill(-9));
      }
      const tailArgs = (b: Record<string, DeviceBuffer>) =>
        tail
          ? {
              push: { ring: b.ring, cursor: b.cursor, capacity: tail.capacity },
              advance: { positions: b.positions, slots: b.slots, blockTables: b.blockTables, rowSeq: b.rowSeq, blockSize: tail.blockSize, maxBlocksPerSeq: maxBlocks },
            }
          : {};
      for (let d = 0; d < draws; d++) {
        buffers[`out${d}`] = i32(new Int32Array(rows).fill(-5));
        steps.push(step('sample', (b) => ({ logits: b.logits, params: b.params, rng: b.rng, out: b[`out${d}`], rows, vocab, ...(limit !== undefined ? { limit } : {}), ...tailArgs(b), ...maskArg(b) })));
        outputs.push(intOut(`out${d}`, excuseFor(d)));
      }
      outputs.push(intOut('rng'));
      if (tail) {
        // The ring holds the draws' tokens: where a sampled token may differ within the excuse,
        // it would differ there too, so the ring is compared where every row is greedy.
        if (params.every((q) => q[0] === 0)) outputs.push(intOut('ring'));
        outputs.push(intOut('cursor'), intOut('positions'), intOut('slots'));
      }
      return { buffers, steps, outputs };
    },
  };
}

function ringPushCase(name: string, capacity: number, cursor: number, pushes: number[]): CaseDef {
  return {
    name,
    build: (rng) => {
      const buffers: Record<string, BufDef> = {
        ring: i32(Array.from({ length: capacity }, () => -1 - rng.int(0, 100))),
        cursor: i32([cursor]),
      };
      const steps: Step[] = [];
      pushes.forEach((rows, i) => {
        buffers[`src${i}`] = i32(Array.from({ length: rows }, () => rng.int(0, 150000)));
        steps.push(step('ring_push', (b) => ({ src: b[`src${i}`], ring: b.ring, cursor: b.cursor, rows, capacity })));
      });
      return { buffers, steps, outputs: [intOut('ring'), intOut('cursor')] };
    },
  };
}

function advanceCase(name: string, blockSize: number, seqLens: number[], steps: number): CaseDef {
  return {
    name,
    build: (rng) => {
      const maxBlocks = Math.ceil((Math.max(...seqLens) + steps) / blockSize) + 1;
      const numBlocks = seqLens.length * maxBlocks;
      const order = rng.perm(numBlocks);
      const tables = new Int32Array(seqLens.length * maxBlocks);
      for (let i = 0; i < tables.length; i++) tables[i] = order[i];
      // Rows in a different order than sequences, as a batch after preemption would be.
      const rowOrder = rng.perm(seqLens.length);
      const rows = rowOrder.length;
      const st: Step[] = [];
      for (let i = 0; i < steps; i++) {
        st.push(
          step('advance_positions', (b) => ({ positions: b.positions, slots: b.slots, blockTables: b.blockTables, rowSeq: b.rowSeq, rows, blockSize, maxBlocksPerSeq: maxBlocks })),
        );
      }
      return {
        buffers: {
          positions: i32(rowOrder.map((q) => seqLens[q] - 1)),
          slots: i32(new Int32Array(rows).fill(-9)),
          blockTables: i32(tables),
          rowSeq: i32(rowOrder),
        },
        steps: st,
        outputs: [intOut('positions'), intOut('slots')],
      };
    },
  };
}

export const samplingCases: Pick<CaseTable, 'argmax' | 'sample' | 'ring_push' | 'advance_positions'> = {
  argmax: [
    argmaxCase('4 rows x 1000, exact tie in row 0', 4, 1000, true),
    argmaxCase('1 row x 7', 1, 7, false),
    argmaxCase('3 rows x 4099', 3, 4099, false),
    argmaxCase('2 rows x 151936', 2, 151936, true, true),
  ],
  sample: [
    sampleCase(
      '5 param sets x 3 draws, vocab 257',
      257,
      [
        [0.7, 0, 1, 0],
        [1, 40, 0.9, 0],
        [1.3, 0, 0.8, 0.05],
        [0, 0, 1, 0],
        [1, 1, 1, 0],
      ],
      3,
      2,
    ),
    sampleCase(
      '2 param sets x 2 draws, vocab 5000',
      5000,
      [
        [0.8, 50, 0.95, 0.02],
        [1, 0, 1, 0],
      ],
      2,
      3,
    ),
    // A decode step's tail in one op (capabilities.opFields sample: push, advance): CUDA runs one row's as one
    // kernel, more rows' as the separate ops' kernels.
    sampleCase('1 greedy row x 3 draws, vocab 151936, ring wraps, blockSize 16', 151936, [[0, 0, 1, 0]], 3, 3, { capacity: 4, cursor: 2, blockSize: 16 }),
    sampleCase('1 sampled row x 2 draws, vocab 5000, blockSize 4', 5000, [[0.9, 40, 0.95, 0]], 2, 2, { capacity: 16, cursor: 1000001, blockSize: 4 }),
    sampleCase(
      '3 greedy rows x 2 draws, vocab 4099, blockSize 8',
      4099,
      [
        [0, 0, 1, 0],
        [0, 0, 1, 0],
        [0, 0, 1, 0],
      ],
      2,
      2,
      { capacity: 8, cursor: 6, blockSize: 8 },
    ),
    sampleCase(
      '4 rows (greedy, sampled, top-k/top-p, min-p) x 2 draws, vocab 151936, limit 151669, the padded tail largest',
      151936,
      [
        [0, 0, 1, 0],
        [1, 0, 1, 0],
        [0.8, 40, 0.9, 0],
        [1.2, 0, 1, 0.1],
      ],
      2,
      3,
      undefined,
      151669,
    ),
    sampleCase(
      '3 rows (greedy, sampled x2) x 3 draws, vocab 260, limit 257, the padded tail largest',
      260,
      [
        [0, 0, 1, 0],
        [0.7, 0, 1, 0],
        [1, 20, 0.95, 0.02],
      ],
      3,
      2,
      undefined,
      257,
    ),
    sampleCase('1 greedy row x 3 draws, vocab 151936, limit 151669, blockSize 16', 151936, [[0, 0, 1, 0]], 3, 3, { capacity: 4, cursor: 2, blockSize: 16 }, 151669),
    // Token masks (capabilities.opFields sample: mask): rows masked in reverse order, the last row free.
    sampleCase(
      'masked: 4 rows (greedy, sampled, top-k/top-p, free) x 2 draws, vocab 151936, limit 151669',
      151936,
      [
        [0, 0, 1, 0],
        [1, 0, 1, 0],
        [0.8, 40, 0.9, 0.01],
        [0.7, 0, 1, 0],
      ],
      2,
      3,
      undefined,
      151669,
      true,
    ),
    sampleCase(
      'masked: 3 rows (greedy, min-p, free greedy) x 3 draws, vocab 257',
      257,
      [
        [0, 0, 1, 0],
        [1.1, 0, 1, 0.05],
        [0, 0, 1, 0],
      ],
      3,
      2,
      undefined,
      undefined,
      true,
    ),
    // A vocabulary of whole float4s with a limit past a whole mask word: where a backend splits a
    // row over blocks of whole words (the CUDA cluster sampler), the last blocks get no ids at all.
    sampleCase(
      'masked: 4 rows (greedy, sampled, top-k/top-p/min-p, free) x 2 draws, vocab 260, limit 257',
      260,
      [
        [0, 0, 1, 0],
        [0.9, 0, 1, 0],
        [1.2, 30, 0.95, 0.02],
        [0.8, 0, 1, 0],
      ],
      2,
      2,
      undefined,
      257,
      true,
    ),
  ],
  ring_push: [ringPushCase('capacity 8, wraps', 8, 6, [4, 3]), ringPushCase('capacity 5, full pushes', 5, 1000003, [5, 2, 5])],
  advance_positions: [advanceCase('4 sequences, block boundaries, 3 steps', 4, [4, 1, 7, 12], 3), advanceCase('1 sequence, blockSize 16', 16, [31], 2)],
};
