/**
 * The backend conformance suite: every op of the catalogue run on a backend under test and on a
 * reference backend (the CPU backend) with identical random inputs, outputs compared within the
 * tolerance the tested backend declares. Core depends on nothing, so both backends come in as
 * arguments. A new backend is a package that passes this suite.
 *
 * Inputs come from a seeded PRNG keyed by the case name, so a case sees the same data whatever
 * subset of ops is run. Each case also checks for leaks: every buffer it allocates it frees, so
 * `stats().liveBuffers` must be back where it was afterwards on both backends.
 */
export { conformanceCases, runConformance } from './runner.js';
export { ConformanceRng, randomBlocks, roundToBf16 } from './kit.js';
export type { ConformanceCase, ConformanceCaseResult, ConformanceOptions, ConformanceReport } from './kit.js';
