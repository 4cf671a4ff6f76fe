/** Running the suite: each case on both backends, outputs compared, leaks counted. */
import type { DeviceBackend, OpFieldSupport } from '../backend.js';
import { OP_NAMES, type OpName } from '../ops.js';
import { mix32 } from '../sampling.js';
import { attentionCases } from './attention.js';
import { decoderCases } from './decoder.js';
import { elementwiseCases } from './elementwise.js';
import {
  bf16Bits,
  bf16Ulp,
  ConformanceRng,
  type Bufs,
  type CaseDef,
  type CaseSpec,
  type CaseTable,
  type ConformanceCase,
  type ConformanceCaseResult,
  type ConformanceOptions,
  type ConformanceReport,
  type HostData,
} from './kit.js';
import { matmulCases } from './matmul.js';
import { samplingCases } from './sampling.js';

const CASES: CaseTable = { ...elementwiseCases, ...matmulCases, ...attentionCases, ...decoderCases, ...samplingCases };

interface Execution {
  outputs?: Record<string, HostData>;
  error?: string;
  leaked: number;
}

function message(e: unknown): string {
  return e instanceof Error ? `${e.name}: ${e.message}` : String(e);
}

/** Allocate, upload, run the steps, read the outputs, free everything (also on failure). */
function execute(be: DeviceBackend, spec: CaseSpec): Execution {
  const before = be.stats().liveBuffers;
  const bufs: Bufs = {};
  const result: Execution = { leaked: 0 };
  const halfOk = be.capabilities.dtypes.includes('bf16');
  try {
    for (const [name, def] of Object.entries(spec.buffers)) {
      const dtype = def.dtype === 'bf16' && !halfOk ? 'f32' : def.dtype;
      bufs[name] = be.alloc({ dtype, length: def.data.length, label: `conformance.${name}`, ...(def.tier ? { tier: def.tier } : {}) });
      be.write(bufs[name], def.blocks ?? (dtype === 'bf16' ? bf16Bits(def.data as Float32Array) : def.data));
    }
    for (const s of spec.steps) s.run(be, bufs);
    const outputs: Record<string, HostData> = {};
    for (const o of spec.outputs) outputs[o.name] = be.read(bufs[o.name]);
    result.outputs = outputs;
  } catch (e) {
    result.error = message(e);
  } finally {
    for (const b of Object.values(bufs)) {
      try {
        be.free(b);
      } catch (e) {
        result.error ??= `free failed: ${message(e)}`;
      }
    }
    result.leaked = be.stats().liveBuffers - before;
  }
  return result;
}

interface Comparison {
  maxAbsErr: number;
  maxRef: number;
  tol: number;
  mismatch?: string;
}

function compare(spec: CaseSpec, got: Record<string, HostData>, ref: Record<string, HostData>, relTol: number, absTol: number): Comparison {
  let maxRef = 0;
  let hasFloat = false;
  for (const o of spec.outputs) {
    if (o.kind !== 'float') continue;
    hasFloat = true;
    // Infinite references (an empty partial's log-sum-exp is -Infinity) must match exactly and
    // do not widen the tolerance.
    for (const v of ref[o.name]) if (Number.isFinite(v)) maxRef = Math.max(maxRef, Math.abs(v));
  }
  const tol = hasFloat ? relTol * maxRef + absTol : 0;
  let maxAbsErr = 0;
  let mismatch: string | undefined;
  for (const o of spec.outputs) {
    const g = got[o.name];
    const r = ref[o.name];
    if (g.length !== r.length) {
      mismatch ??= `${o.name}: length ${g.length}, reference ${r.length}`;
      maxAbsErr = Infinity;
      continue;
    }
    if (o.kind === 'float') {
      for (let i = 0; i < r.length; i++) {
        const err = g[i] === r[i] ? 0 : Number.isNaN(g[i]) !== Number.isNaN(r[i]) ? Infinity : Number.isNaN(r[i]) ? 0 : Math.abs(g[i] - r[i]);
        if (err > maxAbsErr) maxAbsErr = err;
        if (err > tol && !(o.bf16 && err <= bf16Ulp(Math.max(Math.abs(g[i]), Math.abs(r[i])))))
          mismatch ??= `${o.name}[${i}]: got ${g[i]}, reference ${r[i]} (tol ${tol.toExponential(2)})`;
      }
    } else {
      for (let i = 0; i < r.length; i++) {
        if (g[i] === r[i] || o.excuse?.(i, g[i], r[i], relTol, absTol)) continue;
        mismatch ??= `${o.name}[${i}]: got ${g[i]}, reference ${r[i]}`;
        if (!hasFloat) maxAbsErr = Math.max(maxAbsErr, Math.abs(g[i] - r[i]));
      }
    }
  }
  return { maxAbsErr, maxRef, tol, mismatch };
}

function makeCase(op: OpName, def: CaseDef, seed: number, absTol: number): ConformanceCase {
  return {
    op,
    name: def.name,
    run(backend, reference) {
      const base = { op, name: def.name };
      let spec: CaseSpec;
      try {
        spec = def.build(new ConformanceRng(mix32((seed ^ hashString(`${op}/${def.name}`)) >>> 0)));
      } catch (e) {
        return { ...base, ok: false, maxAbsErr: Infinity, maxRef: 0, tol: 0, leakedBuffers: 0, error: `case setup: ${message(e)}` };
      }
      if (!backend.capabilities.ops.includes(op)) {
        return { ...base, ok: false, maxAbsErr: Infinity, maxRef: 0, tol: 0, leakedBuffers: 0, error: `op ${op} is not in the backend's capabilities.ops` };
      }
      const relTol = backend.capabilities.precision.relTol;
      const got = execute(backend, spec);
      const ref = reference === backend ? execute(backend, spec) : execute(reference, spec);
      const fail = (error: string, c?: Comparison): ConformanceCaseResult => ({
        ...base,
        ok: false,
        maxAbsErr: c?.maxAbsErr ?? Infinity,
        maxRef: c?.maxRef ?? 0,
        tol: c?.tol ?? 0,
        leakedBuffers: got.leaked,
        error,
      });
      if (got.error !== undefined) return fail(got.error);
      if (ref.error !== undefined) return fail(`reference failed: ${ref.error}`);
      const c = compare(spec, got.outputs!, ref.outputs!, relTol, absTol);
      if (c.mismatch !== undefined) return fail(`mismatch: ${c.mismatch}`, c);
      if (got.leaked !== 0) return fail(`backend leaked ${got.leaked} buffer(s)`, c);
      if (ref.leaked !== 0) return fail(`reference leaked ${ref.leaked} buffer(s)`, c);
      return { ...base, ok: true, maxAbsErr: c.maxAbsErr, maxRef: c.maxRef, tol: c.tol, leakedBuffers: 0 };
    },
  };
}

function hashString(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** The cases of the suite, in OP_NAMES order, for the selected ops and sizes. */
export function conformanceCases(opts: ConformanceOptions = {}): ConformanceCase[] {
  const seed = (opts.seed ?? 0x5eed) >>> 0;
  const absTol = opts.absTol ?? 1e-6;
  const ops = opts.ops ?? OP_NAMES;
  const out: ConformanceCase[] = [];
  for (const op of OP_NAMES) {
    if (!ops.includes(op)) continue;
    for (const def of CASES[op]) {
      if (def.large && opts.sizes !== 'large') continue;
      if (def.exactOnly && opts.numerics === 'bf16') continue;
      if (def.activationDtype && !opts.activationDtypes?.includes(def.activationDtype)) continue;
      if (def.dtype && !opts.dtypes?.includes(def.dtype)) continue;
      if (def.dtype2 && !opts.dtypes?.includes(def.dtype2)) continue;
      if (def.fields && !def.fields.every((f) => (opts.opFields?.[op] as readonly string[] | undefined)?.includes(f))) continue;
      out.push(makeCase(op, def, seed, absTol));
    }
  }
  return out;
}

/**
 * Run every case of the suite on `backend` against `reference`. A case that throws becomes a
 * failed result carrying the message; the run itself never throws for a backend's failure.
 */
export async function runConformance(backend: DeviceBackend, reference: DeviceBackend, opts: ConformanceOptions = {}): Promise<ConformanceReport> {
  // A bf16-numerics backend rounds where an exact one does not: compare like with like.
  const bn = backend.capabilities.numerics ?? 'exact';
  const rn = reference.capabilities.numerics ?? 'exact';
  if (bn !== rn) throw new RangeError(`conformance: the backend has numerics '${bn}' but the reference has '${rn}'; create the reference with the same numerics`);
  const results: ConformanceCaseResult[] = [];
  // Cases of optional dtypes and fields run where both backends take them.
  const activationDtypes = (backend.capabilities.activationDtypes ?? []).filter((d) => reference.capabilities.activationDtypes?.includes(d));
  const opFields = Object.fromEntries(
    OP_NAMES.map((op) => [op, ((backend.capabilities.opFields?.[op] ?? []) as readonly string[]).filter((f) => (reference.capabilities.opFields?.[op] as readonly string[] | undefined)?.includes(f))]),
  ) as OpFieldSupport;
  const dtypes = backend.capabilities.dtypes.filter((d) => reference.capabilities.dtypes.includes(d));
  for (const c of conformanceCases({ ...opts, numerics: bn, activationDtypes, opFields, dtypes })) {
    let r: ConformanceCaseResult;
    try {
      r = c.run(backend, reference);
    } catch (e) {
      r = { op: c.op, name: c.name, ok: false, maxAbsErr: Infinity, maxRef: 0, tol: 0, leakedBuffers: 0, error: message(e) };
    }
    results.push(r);
    // Yield to the event loop between cases (a macrotask: a resolved promise would let only
    // microtasks run), so timers and I/O are served during a long run: a test runner's worker
    // answering its parent, a server's requests.
    await new Promise<void>((resolve) => setTimeout(resolve, 0));
  }
  const passed = results.filter((r) => r.ok).length;
  return { backend: backend.name, passed, failed: results.length - passed, results };
}
