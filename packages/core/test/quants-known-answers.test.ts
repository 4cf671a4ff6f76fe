/**
 * Known answers from llama.cpp itself: the bytes its reference quantizers (`quantize_row_*_ref`)
 * wrote (for IQ4_NL, `ggml_quantize_chunk` with no importance matrix, what `llama-quantize` calls:
 * that build's `quantize_row_iq4_nl_ref` writes other bytes) and the values its
 * `dequantize_row_*` produced, taken from the ggml-base library of the
 * x86-64 CPU build that node-llama-cpp 3.21.1 ships, called on the inputs below. Inputs come from
 * an integer LCG and exact f64 arithmetic rounded once to f32, so they are the same here as
 * where the answers were made. Hashes are SHA-256 of the raw little-endian bytes.
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { GGML_TYPES } from '../src/quant/ggml-types.js';
import { dequantize, quantize } from '../src/quant/index.js';

type BlockType = 'Q4_0' | 'Q4_1' | 'Q5_0' | 'Q5_1' | 'Q8_0' | 'Q2_K' | 'Q3_K' | 'Q4_K' | 'Q5_K' | 'Q6_K' | 'IQ4_NL' | 'IQ4_XS';

interface KnownAnswer {
  /** Hex of the quantized `inputs(64 or 256, 1)` (two 32-blocks, or one super-block). */
  small: string;
  /** SHA-256 of the quantized `inputs(16384, 2)`. */
  big: string;
  /** SHA-256 of llama.cpp's f32 dequantization of those bytes. */
  bigDequant: string;
  /** SHA-256 of llama.cpp's f32 dequantization of `randomBlocks(type, 16384 values, 3)`. */
  randomDequant: string;
}

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s;
  };
}

/**
 * Four kinds of 256-value runs in turn: small uniform, bell-shaped, sparse outliers over small
 * values, and mostly positive; each value an exact f64 expression rounded once to f32.
 */
function inputs(n: number, seed: number): Float32Array {
  const next = lcg(seed);
  const u = () => ((next() >>> 8) - 8388608) / 8388608;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    switch ((i >> 8) & 3) {
      case 0:
        out[i] = u() * 0.03125;
        break;
      case 1:
        out[i] = (u() + u() + u() + u()) * 0.25;
        break;
      case 2: {
        const a = u();
        out[i] = Math.abs(a) >= 0.9 ? a * 8 : a * 0.0625;
        break;
      }
      default:
        out[i] = u() * 0.5 + 0.25;
    }
  }
  return out;
}

/** Offsets of each type's f16 fields, whose exponents are kept below 31 (no NaN or infinity). */
const HALF_FIELDS: Record<BlockType, number[]> = {
  Q4_0: [0],
  Q4_1: [0, 2],
  Q5_0: [0],
  Q5_1: [0, 2],
  Q8_0: [0],
  Q2_K: [80, 82],
  Q3_K: [108],
  Q4_K: [0, 2],
  Q5_K: [0, 2],
  Q6_K: [208],
  IQ4_NL: [0],
  IQ4_XS: [0],
};

/** Arbitrary blocks: every byte from the LCG's top byte, f16 fields made finite. */
function randomBlocks(type: BlockType, values: number, seed: number): Uint8Array {
  const { blockSize, typeSize } = GGML_TYPES[type];
  const next = lcg(seed);
  const blocks = values / blockSize;
  const out = new Uint8Array(blocks * typeSize);
  for (let i = 0; i < out.length; i++) out[i] = next() >>> 24;
  for (let b = 0; b < blocks; b++) for (const h of HALF_FIELDS[type]) out[b * typeSize + h + 1] &= 0xfb;
  return out;
}

const sha256 = (a: Uint8Array | Float32Array) => createHash('sha256').update(new Uint8Array(a.buffer, a.byteOffset, a.byteLength)).digest('hex');

const LLAMA_CPP: Record<BlockType, KnownAnswer> = {
  Q4_0: {
    small:
      'bc1be456b89b31161d5920ba94674acef43fe99b7b20baf719c032f5a1f0aeea359de86d',
    big: '2c749efc4ab183a60652799b7afa570d2f1d8c552ffc598463e2b0903b63a00e',
    bigDequant: '57ee46d731c2de29f102df25c4ac511a94bd3f29bf890529ebd94e8c620def34',
    randomDequant: 'c14bb6484375aba7615b7318745f8b74ed5c73988ee9c3b0103135679eadd906',
  },
  Q4_1: {
    small:
      '1d1cbca7d355a88b31151c5820ba946649bde33f291cb1a795df5608e73fcd0b6e0f5225ca622792',
    big: '51662c7361d0ed31701732cb7ac1368ac19e7fe7d6d8f233d6ff1f6f4cee2c0c',
    bigDequant: '0ca2b04580fed7e3e6e74be65abcc1bc218f8d3d1b818f5d6b905d7f345b3960',
    randomDequant: '784d68cc2ffe41f56df81b70d93fb7f112d395a912bceeed47ddc301f7f3d397',
  },
  Q5_0: {
    small:
      'bc17ccb20d66c7ac6017713c29a2407538cd838be75fe99715ecac6fd54054fe119054f941f15bc46a3bb0cb',
    big: '0a12561521aa400a5d9360bfb92b7d23742a48d057d46620e09e8ad3cb45a904',
    bigDequant: 'aae1c435d801dc430c21f181ffd13a3cfc904694a8fd77d865249cdc35446471',
    randomDequant: '23319c053f5d9993842c77153529cf4b7af19d1a77c9f398f001eb869f02cb94',
  },
  Q5_1: {
    small:
      'f717bca7ccb20d66b7ab5016613b28a1406428cd828ad75f0718b1a7ea1353902abfac01ee7fab06ce1ea44b95c54f35',
    big: '197f620e052652bb21c1c7dbb12e22239da756c75fdf6e3dddc8b669351b84d8',
    bigDequant: 'c3c58ad34309d8ca0e8bcb6c91a026e2113ecdb15cf2cbb991bb66d165232555',
    randomDequant: 'b1f0124dc6d49bef5b424a04ea2b55360ab49ffab9aa1a10c9b8c6f683ee0d29',
  },
  Q8_0: {
    small:
      'cc0bbbde01368ade480f8125beec1859ba7e5fd33008b5988fd09f3616e0c24271abf90bd57ce30cf77f6036767aa7df' +
      '30aafeac1860d48474bb5586e28cd8a150e8a51d',
    big: '7ae6cd0a9af3e752252bea3e775dcb1c7dcc256956bbff4f3bc46e1815875afb',
    bigDequant: 'e6623fbc574d5fd86ea3ad96ca9762ee593d752df8273d7ebe8d9b588b6c7811',
    randomDequant: 'af16704ea1e57e5d13ccaad439fff2c7ff5c72ca79ccb753c28397a33999ec5b',
  },
  Q2_K: {
    small:
      'ffccbcdcdeeeebffffeceeccdccdcb5ae5fd868af46d1e5aec3e61555ac3b5a3abed6642dca4bc51a412f6f11d569308' +
      '7a5979156442ebd22eca89867bd56aa61618788e1fac545fa1b9d1a2c32945388f152f18',
    big: '3a5ac3131f77173e3e8446b082129921c328896737e41c6d98038e32abaeaa7a',
    bigDequant: 'c9b18728820a1883277e0150b245f50e3bdf19d7ee7a8821dcc79c5c991fb0f2',
    randomDequant: 'e7c4f3e1d2be91f522ba175f5cd57666c03b03fad20f9b79782695d33eb7cbcc',
  },
  Q3_K: {
    small:
      'fab8ffbfca907515f83122b7f50ffadbfecf0c51db0d6f592d006c2d7784e88366933431c1a306d87151ae8499be126f' +
      '15dd0ed0fe4b7f326fa2ffb54e8e345778b4b0f09d411ba6cc96c7117b7b560da54dc8f963a9c4c7ae9f0e7f3a7b368d' +
      '117778a88b8367700cc3c3f0278d',
    big: 'f42a8423469ada8b2fea8b74f62e50f3dcfd882074ef30972a3bdb26fcac495f',
    bigDequant: '0eebbd7fc0794d83daecd856953be3e429b57f67cd1f178eb6c250b6b72fd057',
    randomDequant: 'a4ce20ce30a6f419163c6ddb3c677bf859e390759d94d9988efd95cce4c5064e',
  },
  Q4_K: {
    small:
      '8a041110fefbfafffcfcfdfebccafc2453f5678a70f5dbb8e0f92356a82c732e9cd45a07e331c104620a5825c36b2d92' +
      '9cbe6070cf4c07569a1f4b3736b27e9b8ae97841e6a99e659c24dece06368500a8a78676600abe1bd7ac9579be34ab58' +
      '6892b0c8fcc140de13a404163bb443a14d363c062951e9b517b290824ec6597825579ea154bc9797cbcdf7caf349823f',
    big: 'fc1b4faad32ecce5d2192a521f0d4594040bc1b4eada7fec24d1dbad83ae5964',
    bigDequant: 'd3e804b2ab03a5fc00653cccb86ef1e2487c2004d21d6f08e6c89cf47e2171d3',
    randomDequant: 'd2e8d707bd6f42fea3fd43358d9680ea9f2bc39166b3218f5d8bbb541581198b',
  },
  Q5_K: {
    small:
      '11021710fefefffffdfcfdffccdfff287c2e610b4c16f3933eb7a49073897c5d1f6ee5b13aecceb0cce18dcc92618962' +
      'a7fbc016e1fbb861e0f448bd525af75f2bbaa501e673a20ac416a24c98c84d35598de001bf990ebc553e977f8d840c37' +
      '24f2f191fd714dea3848ecad0d6d2b10525f0efec0066f28b04a3bf46f7959b3c2347092fb9291af374a192e687a9753' +
      '9b7d5a0d54a2d37a2f7430049d8ca3f05aa02e43a969303f888cfe95e693045f',
    big: '51ec87dc2584b6a9c0764a8816ac8b7624bea6401c91ddea60fe5bd9e5a187b9',
    bigDequant: '987e883fd7b7dcec20ca1a1420ab367ab593e5f14d832b2edc409d1dbc5a6246',
    randomDequant: '0b3d4dba0e46db42db6df493751422d66d0c3d1a812980341f0c5fdb5a512f7a',
  },
  Q6_K: {
    small:
      'df48f0ed03d832745129101b56766f0f965d333eb54ddf5d2b11bad9c1ce6117abf1c70d52201872a26136e804160175' +
      '56f8f531fdef85d16883c65814da491764be5dac814c6d4ff0840679ae936205d50931b4f6d5121e0e84435c40958f06' +
      'adfb22ef49901dd598da67dfbdbf8cf60888af5c702c8d89ebe61fcd35a0dd0588817ab6c841236690025d2966ff889f' +
      'a8ee6541dfa3bf52b711f5f21f14900bba99f9d5e4822b12de0b4946bb11ab66eaa44072a34068631c052d1d3f9578c4' +
      '846e7b857c86808384868677847a6c7c8480',
    big: '77c53aebc036307cd6bad11c70c3b5df81fd72fbdb8b70ca9547c902226cb5f4',
    bigDequant: '7a956f5c182deeddd7caa0530f8f439dab7b369a012d7792cde366b9626085a5',
    randomDequant: '0f20c8aab1597a38620a5f7169dd8058a658bb06d3e724645accfa2c9e9f9c13',
  },
  IQ4_NL: {
    small: '1b0ce345c89c31151d4920cba3563adef32fe28b6b10baf709d021f4a0f0beeb24aee85e',
    big: '4201776d9e9cf7e25ad2ec5f6db2d75bef94381cb5f7cd0f596a8bee09c2f614',
    bigDequant: '8261f19b5df42b4f80ca050dc4d5952684840f316690fa4b93ed473dba7a3edc',
    randomDequant: '8b2e0fe3e2466e3c36e4da2341545a7d10c65bd2f24d485c482327d4a722c7c1',
  },
  IQ4_XS: {
    small:
      '8800c33f2ff0fe4fe345b89c31151d4920cba3563adef32f6b10baf709d021f4a0f0beeb24aee85e53617fff907319ba' +
      '35c114189a9eb1f3abfd7748fec4b075ab11f4e3032d980aa9270797e01c0ffc384e456bdf443d1a5cabd8d8f6d04ce1' +
      '1ebb1a172cc34bb54e86fe164ad18a74d7e170b12ea62af8dbbc6d4fad3b50532e2305270bb27ad8',
    big: '15a979147315e4d93331f01cb6a6034da0c8da54ea889f83e73c4ecbfda74bb5',
    bigDequant: 'd485f79d18e154f3e5eb76046e2024029e9f4b5f11e3c335238fdfbc7fc00214',
    randomDequant: '1249ede83ab300d5ebc44069341971796788f352ff61d8021510bbefbfe3ae3e',
  },
};

const TYPES = Object.keys(LLAMA_CPP) as BlockType[];

describe("known answers from llama.cpp's reference code", () => {
  it.each(TYPES)('%s: quantize writes the same bytes for a small input', (type) => {
    const n = GGML_TYPES[type].blockSize === 32 ? 64 : 256;
    expect(Buffer.from(quantize(type, inputs(256, 1).subarray(0, n))).toString('hex')).toBe(LLAMA_CPP[type].small);
  });

  it.each(TYPES)('%s: quantize writes the same bytes over 16384 values of four kinds', (type) => {
    expect(sha256(quantize(type, inputs(16384, 2)))).toBe(LLAMA_CPP[type].big);
  });

  it.each(TYPES)('%s: dequantize gives the same f32 bits for those blocks', (type) => {
    const q = quantize(type, inputs(16384, 2));
    expect(sha256(dequantize(type, q, 16384))).toBe(LLAMA_CPP[type].bigDequant);
  });

  it.each(TYPES)('%s: dequantize gives the same f32 bits for arbitrary block bytes', (type) => {
    expect(sha256(dequantize(type, randomBlocks(type, 16384, 3), 16384))).toBe(LLAMA_CPP[type].randomDequant);
  });
});
