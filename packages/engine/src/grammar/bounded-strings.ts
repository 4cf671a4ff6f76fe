/**
 * Length-bounded JSON strings (minLength/maxLength) as EBNF whose token masks are fast.
 *
 * XGrammar 0.1.27 spells `{"type": "string", "maxLength": n}` as `"\"" [^"\\\r\n]{0,n} "\""`:
 * a raw tab or other control character passes (JSON forbids them in a string), no escape can be
 * written, and the repetition unzips into a choice of sequences of every length (plus a counted
 * rule past 15). Each of those sub-rules can end before the token does, so at every position
 * inside the string nearly every token of the 151,936-id Qwen3 vocabulary is "uncertain" in
 * XGrammar's mask cache and re-parsed at each step (measured: 0.6 ms median, 12 ms worst a mask,
 * against 0.03 ms in a free string), and compiling a schema with a few such strings took 13 s.
 *
 * Here the string is a chain of rules, one per count of characters written, each ending only
 * with the closing quote (as XGrammar's own free-string rule does):
 *
 *     s_k ::= "\"" | char s_{k+1}      (min <= k < max; below min no quote; s_max ::= "\"")
 *
 * so a rule's end is the string's end, and a lookahead assertion (what follows a string in compact
 * JSON: `,`, `:`, `}` or `]`) decides the tokens that run past it at compile time.
 *
 * A character is what JSON Schema counts (a code point of the decoded string): one unescaped
 * character (any but `"`, `\` and U+0000-U+001F), one short escape (`\n`, `\"`, ...), one `\u`
 * escape of a code point outside the surrogates, or one `\uD8xx\uDCxx` surrogate pair. A lone
 * surrogate escape is refused (it is no character).
 *
 * The JSON Schema is first rewritten so each bounded string carries a sentinel pattern
 * (`boundedStringPattern`); XGrammar's converter turns it into a literal the EBNF rewrite below
 * finds and replaces.
 */

/** Private-use character around the sentinel (no schema's own pattern writes it this way). */
const MARK = '\uE000';

/**
 * The longest bound spelled as a chain. Compiling costs ~30-45 ms a rule over Qwen3's vocabulary
 * (each count's mask is precomputed): above this, XGrammar's own repetition compiles faster
 * (measured: ~10 s whatever the bound, against 13 s for a chain of 400 and 45 s for 1,000), so a
 * longer bound keeps the repetition of unescaped characters (slow masks, no escapes).
 */
export const CHAIN_LIMIT = 256;

/**
 * The sentinel pattern standing for a string of [min, max] characters (max undefined: no upper
 * bound); `contained`: the string is a value inside an object or array (JSON punctuation follows).
 */
export function boundedStringPattern(min: number, max: number | undefined, contained: boolean): string {
  return `^${MARK}nerva-length ${min} ${max ?? 'inf'}${contained ? ' in' : ''}${MARK}$`;
}

/** XGrammar's EBNF for the sentinel literal: one quoted string per character, the mark escaped. */
const SENTINEL = /"\\"" "\\ue000" "n" "e" "r" "v" "a" "-" "l" "e" "n" "g" "t" "h" " " ((?:"[0-9]" )+)" " ((?:"[0-9]" )+|"i" "n" "f" )(" " "i" "n" )?"\\ue000" "\\""/g;

const CHAR = '[^"\\\\\\0-\\x1f]';
const HEX = '[0-9A-Fa-f]';

/** One escape after the backslash: short escapes, \u outside the surrogates, a surrogate pair. */
const ESCAPE_RULE = [
  `nerva_str_escape ::= ["\\\\/bfnrt]`,
  `"u" [0-9A-Ca-c] ${HEX} ${HEX} ${HEX}`,
  `"u" [Dd] [0-7] ${HEX} ${HEX}`,
  `"u" [EeFf] ${HEX} ${HEX} ${HEX}`,
  `"u" [Dd] [89ABab] ${HEX} ${HEX} "\\\\u" [Dd] [C-Fc-f] ${HEX} ${HEX}`,
].join(' | ');

/**
 * What may follow a string in compact JSON (`:` after a key), the mask cache's lookahead at a
 * string's end: a token running past the closing quote into anything else is refused there, not
 * re-parsed at every step (without it, measured: 0.045 ms median but 6-9 ms p99 a mask inside
 * a bounded string, and compiling takes 60 % longer).
 */
const AFTER_STRING = ' (= [,:}\\]])';

/**
 * `ebnf` (XGrammar's conversion of a schema rewritten by schemaForXGrammar) with each sentinel
 * string replaced by its chain of rules. Throws when a sentinel is left (the converter spelled it
 * otherwise than expected): compiling it would constrain to the sentinel's text.
 *
 * @param wholeOutput whether the JSON is the whole output (a string at its root is followed by
 *   nothing). Where text of an enclosing grammar follows the JSON (a structural tag's end), only
 *   strings inside an object or array assume JSON punctuation follows them; at the root, a token
 *   running past the quote is re-parsed instead (slower masks, the same tokens allowed).
 */
export function expandBoundedStrings(ebnf: string, wholeOutput = true): string {
  const chains = new Map<string, string[]>();
  let needEscape = false;
  const out = ebnf.replace(SENTINEL, (_all, lo: string, hi: string, contained: string | undefined) => {
    const min = Number(digits(lo));
    const max = hi.startsWith('"i"') ? undefined : Number(digits(hi));
    const lookahead = wholeOutput || contained !== undefined;
    const name = `nerva_str_${min}_${max ?? 'inf'}${lookahead ? '' : '_open'}`;
    if (!chains.has(name)) chains.set(name, chainRules(name, min, max, lookahead ? AFTER_STRING : ''));
    needEscape = true;
    return `"\\"" ${name}_0`;
  });
  if (out.includes('\\ue000" "n" "e" "r" "v" "a"')) throw new Error('a length-bounded string was not expanded (unexpected converter output)');
  const rules = [...chains.values()].flat();
  if (needEscape) rules.push(ESCAPE_RULE);
  return rules.length === 0 ? out : `${out.trimEnd()}\n${rules.join('\n')}\n`;
}

function digits(quoted: string): string {
  return quoted.replace(/[" ]/g, '');
}

/** The rules `${name}_k` for k in [0, max] (or [0, min] and a free tail when max is undefined). */
function chainRules(name: string, min: number, max: number | undefined, after: string): string[] {
  const rules: string[] = [];
  const next = (k: number) => `${CHAR} ${name}_${k} | "\\\\" nerva_str_escape ${name}_${k}`;
  const last = max ?? min;
  for (let k = 0; k < last; k++) rules.push(`${name}_${k} ::= (${k >= min ? '"\\"" | ' : ''}${next(k + 1)})${after}`);
  // At max: only the closing quote; with no max, any further characters (a self-recursive rule).
  rules.push(max === undefined ? `${name}_${last} ::= ("\\"" | ${next(last)})${after}` : `${name}_${last} ::= "\\""${after}`);
  return rules;
}
