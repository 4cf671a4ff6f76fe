export { checkGrammar, GrammarService, type CompiledGrammar } from './grammar-service.js';
export { DEFAULT_GRAMMAR_THREADS_CAP, defaultGrammarThreads, GrammarPool, grammarWorkerUrl, PooledGrammarState } from './grammar-pool.js';
export { InThreadGrammarState, type GrammarState } from './grammar-state.js';
export { grammarKey, grammarOf, normalizeGrammar, GRAMMAR_LIMITS, type GrammarOptions, type GrammarSpec } from './spec.js';
export { encodeVocab, type EncodedVocab, type VocabType } from './vocab.js';
export { GrammarEngineError, XGRAMMAR_VERSION } from './xgrammar-runtime.js';
