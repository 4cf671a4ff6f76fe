/**
 * Command-line flags and config-file checks derived from option specs (@nerva/engine's
 * ENGINE_OPTIONS and the server's own SERVER_OPTIONS): the flag, its `--help` line, the parser of
 * its value, and the check of a TOML value all follow from the spec's kind, so `nerva run`,
 * `nerva serve`, the TOML config and `nerva-bench` accept and reject the same values.
 */
import { describeChoices, flagName, type OptionSpec } from '@nerva/engine';
import { InvalidArgumentError, Option, type Command } from 'commander';
import { parseFractionArg, parseIntArg, parseSizeArg } from './cli-util.js';
import { ConfigError } from './errors.js';
import { parseSize } from './size.js';

/** A command's own reading of an option: another help line or default, or a required flag. */
export interface FlagOverride {
  help?: string;
  default?: string | number | boolean | readonly number[];
  mandatory?: boolean;
}

/** An option a command takes: its spec, or its spec with the command's override. */
export type FlagPick = OptionSpec | readonly [OptionSpec, FlagOverride];

/** The flags of a set of options, and the reading of their parsed values back into option fields. */
export interface DerivedFlags {
  /** Commander options, in the order given. */
  readonly options: readonly Option[];
  /**
   * The option fields set by the parsed values (`command.opts()`): flags not given are left
   * out, or take their default where defaults apply.
   */
  read(values: Record<string, unknown>): Record<string, unknown>;
}

function intArg(flag: string, min: number, max: number, what: string) {
  const int = parseIntArg(flag);
  return (v: string): number => {
    const n = int(v);
    if (n < min || n > max) throw new InvalidArgumentError(`${flag} must be ${what}, got "${v}"`);
    return n;
  };
}

/** --host-compute and the like: 'auto', 'off', or a fraction strictly between 0 and 1. */
function splitArg(flag: string) {
  return (v: string): 'auto' | 'off' | number => {
    if (v === 'auto' || v === 'off') return v;
    const x = Number(v);
    if (v.trim() === '' || !Number.isFinite(x) || x <= 0 || x >= 1) throw new InvalidArgumentError(`${flag} must be auto, off or a fraction in (0, 1), got '${v}'`);
    return x;
  };
}

/** --client-priority-range and the like: `MIN,MAX`, two integers with MIN <= MAX. */
function intRangeArg(flag: string) {
  return (v: string): [number, number] => {
    const parts = v.split(',').map((x) => x.trim());
    const [lo, hi] = parts.map(Number);
    if (parts.length !== 2 || parts.some((x) => !/^[+-]?\d+$/.test(x)) || !Number.isSafeInteger(lo) || !Number.isSafeInteger(hi) || lo > hi) {
      throw new InvalidArgumentError(`${flag} must be MIN,MAX (two integers, MIN <= MAX), got "${v}"`);
    }
    return [lo, hi];
  };
}

function argParser(spec: OptionSpec): ((v: string) => unknown) | undefined {
  const flag = flagName(spec);
  switch (spec.kind) {
    case 'int':
      return intArg(flag, 0, Number.MAX_SAFE_INTEGER, 'a non-negative integer');
    case 'posint':
      return parseIntArg(flag, { positive: true });
    case 'port':
      return intArg(flag, 0, 65535, 'a port number (0-65535)');
    case 'size':
      return parseSizeArg(flag);
    case 'sizes': {
      const one = parseSizeArg(flag);
      return (v: string): number[] => v.split(',').map((x) => one(x.trim()));
    }
    case 'fraction':
      return parseFractionArg(flag);
    case 'split':
      return splitArg(flag);
    case 'strings':
      return (v: string): string[] => v.split(',').map((x) => x.trim()).filter(Boolean);
    case 'intrange':
      return intRangeArg(flag);
    default:
      return undefined;
  }
}

const isNegated = (spec: OptionSpec): boolean => spec.flag?.startsWith('--no-') === true;

/** The commander option of a spec: its flag, its help (with the default, where there is one), the parser of its value, its choices. */
export function optionFlag(spec: OptionSpec, o: FlagOverride = {}): Option {
  const def = o.default ?? spec.default;
  const help = (o.help ?? spec.help) + (def !== undefined && !isNegated(spec) ? ` (default: ${String(def)})` : '');
  const opt = new Option(spec.flag ?? `--${spec.name}`, help);
  const parse = argParser(spec);
  if (parse) opt.argParser(parse);
  if (spec.choices) opt.choices(spec.choices);
  if (o.mandatory) opt.makeOptionMandatory();
  return opt;
}

/**
 * Derive the flags of `picks`. With `applyDefaults`, a flag not given reads as its default (where
 * the spec or the override has one); without, it is left out, so a config file's value stays.
 */
export function deriveFlags(picks: readonly FlagPick[], { applyDefaults = false } = {}): DerivedFlags {
  const entries = picks.map((p) => {
    const [spec, o] = Array.isArray(p) ? (p as readonly [OptionSpec, FlagOverride]) : [p as OptionSpec, {}];
    if (spec.flag === undefined) throw new RangeError(`option "${spec.name}" has no flag`);
    return { spec, o, option: optionFlag(spec, o) };
  });
  return {
    options: entries.map((e) => e.option),
    read(values) {
      const out: Record<string, unknown> = {};
      for (const { spec, o, option } of entries) {
        let v = values[option.attributeName()];
        // Commander sets a --no-x flag's value true unless it is given; only the flag counts.
        if (isNegated(spec)) v = v === false ? false : undefined;
        else if (spec.kind === 'bool') v = v === true ? true : undefined;
        if (v === undefined && applyDefaults) v = o.default ?? spec.default;
        if (v !== undefined) out[spec.name] = v;
      }
      return out;
    },
  };
}

/** Add derived flags to a command. */
export function addFlags(cmd: Command, flags: DerivedFlags): Command {
  for (const o of flags.options) cmd.addOption(o);
  return cmd;
}

/**
 * Check a config value (from TOML, or a flag already parsed) against its spec's kind: the value,
 * or a {@link ConfigError} naming the key (`where: "key" must be ..., got ...`).
 */
export function checkOptionValue(spec: OptionSpec, key: string, v: unknown, where: string): unknown {
  const fail = (what: string): never => {
    throw new ConfigError(key, `${where}: "${key}" must be ${what}, got ${JSON.stringify(v)}`);
  };
  switch (spec.kind) {
    case 'string':
    case 'path':
      if (typeof v !== 'string' || v.length === 0) fail('a non-empty string');
      return v;
    case 'strings':
      if (!Array.isArray(v) || v.length === 0 || v.some((x) => typeof x !== 'string' || x.length === 0)) fail('a list of non-empty strings');
      return v;
    case 'bool':
      if (typeof v !== 'boolean') fail('true or false');
      return v;
    case 'int':
    case 'posint':
    case 'port': {
      // TOML integers may come back as bigint.
      const n = typeof v === 'bigint' ? Number(v) : v;
      if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < (spec.kind === 'posint' ? 1 : 0)) fail(spec.kind === 'posint' ? 'a positive integer' : 'a non-negative integer');
      if (spec.kind === 'port' && (n as number) > 65535) fail('a port number (0-65535)');
      return n;
    }
    case 'choice':
      if (!spec.choices!.includes(v as string)) fail(describeChoices(spec.choices!));
      return v;
    case 'fraction':
      if (typeof v !== 'number' || !(v >= 0 && v <= 1)) fail('a number from 0 to 1');
      return v;
    case 'split':
      if (v !== 'auto' && v !== 'off' && !(typeof v === 'number' && v > 0 && v < 1)) fail('"auto", "off" or a fraction in (0, 1)');
      return v;
    case 'intrange': {
      const r: unknown[] = Array.isArray(v) ? v : [];
      if (r.length !== 2 || !r.every((x) => Number.isSafeInteger(x)) || (r[0] as number) > (r[1] as number)) fail('two integers [min, max] with min <= max');
      return [r[0], r[1]];
    }
    case 'sizes': {
      if (!Array.isArray(v) || v.length === 0) fail('a list of sizes such as ["10GiB", "20GiB"]');
      return (v as unknown[]).map((x, i) => checkOptionValue({ ...spec, kind: 'size' }, `${key}[${i}]`, x, where));
    }
    case 'size':
      // A string with a unit ("4GiB", "512MB", "4G" = 4 GiB) or an integer byte count.
      if (typeof v !== 'string' && typeof v !== 'number' && typeof v !== 'bigint') fail('a size such as "4GiB" or a positive integer byte count');
      try {
        return parseSize(v as string | number | bigint, `${where}: "${key}"`);
      } catch (e) {
        throw new ConfigError(key, (e as Error).message);
      }
  }
}
