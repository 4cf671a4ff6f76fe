export { checkGrammar, GrammarService, type CompiledGrammar } from './grammar-service.js';
export { GrammarState } from './grammar-state.js';
export { grammarKey, grammarOf, normalizeGrammar, GRAMMAR_LIMITS, type GrammarOptions, type GrammarSpec } from './spec.js';
export { encodeVocab, type EncodedVocab, type VocabType } from './vocab.js';
export { GrammarEngineError, XGRAMMAR_VERSION } from './xgrammar-runtime.js';
