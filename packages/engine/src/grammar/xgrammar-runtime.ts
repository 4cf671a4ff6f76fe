import { readFileSync } from 'node:fs';
import * as nodeModule from 'node:module';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { NervaError } from '@nerva/core';

/**
 * One instance of XGrammar (`@mlc-ai/web-xgrammar`, XGrammar's C++ compiled to WebAssembly): its
 * own WebAssembly memory, its objects usable only with each other.
 *
 * Why instances, and why loaded this way:
 * - The package ships a UMD bundle under `"type": "module"`, which Node's ESM loader cannot
 *   evaluate (it reads `require` and `__filename`), so its source is evaluated here as the
 *   CommonJS body it is (a Function body), once per instance (~30 ms).
 * - XGrammar reports a bad grammar by aborting the WebAssembly instance (`[FATAL] ...` on its
 *   console, then `RuntimeError: Aborted()`); calls after an abort corrupt its memory (measured:
 *   a few hundred aborts end in out-of-bounds accesses). So an instance that aborted is dead: the
 *   caller drops it and builds a new one. The console passed in collects the FATAL line, which
 *   becomes the error's message.
 * - The package's mask accessor (`getNextTokenBitmask`) is async only to await its first load;
 *   the step loop reads masks synchronously, through the module's vector view (`__binding`,
 *   exported by one line added to the evaluated source: the package is pinned to 0.1.27 and the
 *   anchor line is checked).
 */
export class XGrammarRuntime {
  /** Set when an XGrammar call aborted: the instance must not be used again. */
  dead: Error | undefined;
  private readonly lib: XGrammarLib;
  private readonly lines: string[] = [];

  private constructor(lib: XGrammarLib, lines: string[]) {
    this.lib = lib;
    this.lines = lines;
  }

  /** A fresh instance, its WebAssembly module instantiated. */
  static async create(): Promise<XGrammarRuntime> {
    const lines: string[] = [];
    const lib = evaluateLibrary(lines);
    // Any async factory instantiates the module; the binding is then reachable synchronously.
    const info = await lib.TokenizerInfo.createTokenizerInfo(['a'], 'raw', false, 1, [0]);
    info.dispose();
    if (typeof lib.__binding !== 'function' || typeof lib.__binding()?.vecIntToView !== 'function') {
      throw new GrammarEngineError('XGRAMMAR_UNSUPPORTED', `@mlc-ai/web-xgrammar: the module binding has no vecIntToView (expected version ${XGRAMMAR_VERSION})`);
    }
    return new XGrammarRuntime(lib, lines);
  }

  /** The library's classes (TokenizerInfo, GrammarCompiler, GrammarMatcher, ...). */
  get api(): XGrammarLib {
    return this.lib;
  }

  /** The module's embind binding (constructors and vector helpers). */
  get binding(): XGrammarBinding {
    return this.lib.__binding();
  }

  /**
   * Run `f` against this instance. An abort inside marks it dead and throws a GrammarEngineError
   * ABORTED carrying XGrammar's own message (the FATAL line it printed).
   */
  call<T>(what: string, f: () => T): T {
    if (this.dead) throw this.dead;
    this.lines.length = 0;
    try {
      return f();
    } catch (e) {
      throw this.failure(what, e);
    }
  }

  /** As `call`, for the library's async entry points. */
  async callAsync<T>(what: string, f: () => Promise<T>): Promise<T> {
    if (this.dead) throw this.dead;
    this.lines.length = 0;
    try {
      return await f();
    } catch (e) {
      throw this.failure(what, e);
    }
  }

  private failure(what: string, e: unknown): Error {
    const msg = e instanceof Error ? e.message : String(e);
    const fatal = this.lines.find((l) => l.startsWith('[FATAL]'));
    if (fatal !== undefined || /Aborted\(|memory access out of bounds|unreachable/.test(msg)) {
      // "[FATAL] /path/file.cc:552: EBNF parser error ...": the text after the source location.
      const detail = fatal?.replace(/^\[FATAL\]\s*\S+:\d+:\s*/, '') ?? msg;
      const err = new GrammarEngineError('ABORTED', `${what}: ${detail}`);
      this.dead = err;
      return err;
    }
    return e instanceof Error ? e : new Error(msg);
  }
}

/** The pinned package version whose bundle layout the loader relies on. */
export const XGRAMMAR_VERSION = '0.1.27';

const EXPORT_ANCHOR = 'exports.CompiledGrammar = CompiledGrammar;';
const IMPORT_ANCHOR = "await import('module')";

let source: { code: string; path: string } | undefined;

function librarySource(): { code: string; path: string } {
  if (source) return source;
  const require = createRequire(import.meta.url);
  const path = require.resolve('@mlc-ai/web-xgrammar');
  const pkg = JSON.parse(readFileSync(`${dirname(path)}/../package.json`, 'utf8')) as { version?: string };
  if (pkg.version !== XGRAMMAR_VERSION) {
    throw new GrammarEngineError('XGRAMMAR_UNSUPPORTED', `@mlc-ai/web-xgrammar ${String(pkg.version)} is installed; this engine is built against ${XGRAMMAR_VERSION}`);
  }
  const code = readFileSync(path, 'utf8');
  if (!code.includes(EXPORT_ANCHOR)) throw new GrammarEngineError('XGRAMMAR_UNSUPPORTED', `@mlc-ai/web-xgrammar at ${path}: not the bundle layout of ${XGRAMMAR_VERSION}`);
  if (!code.includes(IMPORT_ANCHOR)) throw new GrammarEngineError('XGRAMMAR_UNSUPPORTED', `@mlc-ai/web-xgrammar at ${path}: not the bundle layout of ${XGRAMMAR_VERSION}`);
  // The bundle's Node branch imports 'module' dynamically; evaluated as a Function body it takes
  // it as a parameter instead (a dynamic import there depends on the host's loader hooks).
  source = { code: code.replace(EXPORT_ANCHOR, `exports.__binding = () => binding; ${EXPORT_ANCHOR}`).replace(IMPORT_ANCHOR, '__nodeModule'), path };
  return source;
}

/** Evaluate the bundle as a CommonJS module body whose console appends to `lines`. */
function evaluateLibrary(lines: string[]): XGrammarLib {
  const { code, path } = librarySource();
  const push = (...a: unknown[]) => {
    if (lines.length < 64) lines.push(a.map(String).join(' '));
  };
  const quiet = { log: push, error: push, warn: push, info: push, debug: push };
  const fn = new Function('exports', 'module', 'require', '__filename', '__dirname', 'console', '__nodeModule', code) as (...a: unknown[]) => void;
  const mod = { exports: {} as XGrammarLib };
  fn(mod.exports, mod, createRequire(path), path, dirname(path), quiet, nodeModule);
  return mod.exports;
}

/** An error of the grammar engine itself (not of a request's grammar). */
export class GrammarEngineError extends NervaError {}

/** The parts of the library's surface used here (its own .d.ts types the handles as any). */
export interface XGrammarLib {
  TokenizerInfo: {
    createTokenizerInfo(vocab: string[], vocabType?: string, prependSpace?: boolean, vocabSize?: number, stopTokenIds?: number[]): Promise<XgTokenizerInfo>;
  };
  GrammarCompiler: { createGrammarCompiler(info: XgTokenizerInfo, cacheEnabled?: boolean): Promise<XgCompiler> };
  __binding(): XGrammarBinding;
}

export interface XgHandle {
  delete(): void;
}

export interface XgTokenizerInfo {
  handle: XgHandle & { GetVocabSize(): number };
  dispose(): void;
}

export interface XgCompiler {
  handle: XgHandle & {
    CompileJSONSchema(schema: string, anyWhitespace: boolean, indent: number | undefined, separators: { first: string; second: string } | undefined, strict: boolean, maxWhitespace: number | undefined): XgHandle;
    CompileBuiltinJSONGrammar(): XgHandle;
    CompileGrammar(grammar: XgHandle): XgHandle;
    CompileStructuralTag(json: string): XgHandle;
  };
  dispose(): void;
}

export interface XgVector extends XgHandle {
  size(): number;
  get(i: number): number;
}

/** A native GrammarMatcher (the binding's class, used without the library's async wrapper). */
export interface XgMatcher extends XgHandle {
  AcceptToken(id: number, verbose: boolean): boolean;
  GetNextTokenBitmask(vocabSize: number): XgVector;
  IsTerminated(): boolean;
}

export interface XGrammarBinding {
  GrammarMatcher: new (compiled: XgHandle, stopTokens: unknown, terminateWithoutStop: boolean, maxRollback: number) => XgMatcher;
  Grammar: { FromEBNF(ebnf: string, root: string): XgHandle };
  _JSONSchemaToEBNF(schema: string, anyWhitespace: boolean, indent: number | undefined, separators: { first: string; second: string } | undefined, strict: boolean, maxWhitespace: number | undefined, format: unknown): string;
  JSONFormat: { kJSON: unknown };
  vecIntFromJSArray(a: number[]): XgHandle;
  vecIntToView(v: XgVector): Int32Array;
}
