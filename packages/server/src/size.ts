/**
 * Byte sizes as people write them on a command line or in a TOML file: `4GiB`, `4096MiB`,
 * `512MB`, `4G`, `1.5 GiB`, `1073741824`.
 *
 * - IEC units are powers of 1024: `KiB`, `MiB`, `GiB`, `TiB` (also Kubernetes' `Ki`, `Mi`, `Gi`, `Ti`).
 * - SI units are powers of 1000: `KB` (or `kB`), `MB`, `GB`, `TB`.
 * - A bare letter `K`, `M`, `G`, `T` means the IEC unit: `4G` is 4 GiB (4294967296 bytes), as in
 *   `ulimit`, `dd` and most memory flags. Write `4GB` for 4 * 10^9.
 * - `B`, or no unit, is bytes; a byte count must be a whole number.
 *
 * Units are case-insensitive (there are no bits here: `mb` is megabytes). A fraction is allowed
 * with a unit and rounded down to whole bytes. Zero, negative numbers, exponents, empty strings
 * and anything else throw {@link SizeError}, whose message names the option.
 */

const UNITS: Record<string, number> = {
  b: 1,
  k: 2 ** 10,
  ki: 2 ** 10,
  kib: 2 ** 10,
  kb: 1e3,
  m: 2 ** 20,
  mi: 2 ** 20,
  mib: 2 ** 20,
  mb: 1e6,
  g: 2 ** 30,
  gi: 2 ** 30,
  gib: 2 ** 30,
  gb: 1e9,
  t: 2 ** 40,
  ti: 2 ** 40,
  tib: 2 ** 40,
  tb: 1e12,
};

/** A size that is not one: the message names the option and repeats what was given. */
export class SizeError extends Error {
  constructor(
    /** The option or key the size was given for (`--vram-budget`, `vram_budget`). */
    readonly option: string,
    message: string,
  ) {
    super(message);
    this.name = 'SizeError';
  }
}

const FORMAT = /^(\d+(?:\.\d+)?|\.\d+)\s?([a-z]*)$/i;

/**
 * Parse a byte size (see the module comment for the grammar). Numbers are taken as bytes;
 * `option` names the flag or key in error messages.
 */
export function parseSize(value: string | number | bigint, option: string): number {
  const shown = typeof value === 'string' ? JSON.stringify(value) : String(value);
  const fail = (why: string): never => {
    throw new SizeError(option, `${option} must be ${why}, got ${shown}`);
  };
  const expected = 'a size such as 4GiB, 4096MiB, 512MB, 4G (= 4GiB) or a byte count';
  let bytes: number;
  if (typeof value === 'bigint') {
    if (value <= 0n) fail('greater than zero');
    if (value > BigInt(Number.MAX_SAFE_INTEGER)) fail('at most 2^53 - 1 bytes');
    return Number(value);
  }
  if (typeof value === 'number') {
    if (!Number.isFinite(value) || !Number.isInteger(value)) fail(`a whole number of bytes or ${expected}`);
    bytes = value;
  } else {
    const text = value.trim();
    if (text.startsWith('-')) fail('greater than zero');
    const m = FORMAT.exec(text);
    if (!m) fail(expected);
    const [, num, unitRaw] = m!;
    const unit = unitRaw.toLowerCase();
    const scale = unit === '' ? 1 : UNITS[unit];
    if (scale === undefined) fail(`${expected} (unknown unit "${unitRaw}"; units: KiB MiB GiB TiB, KB MB GB TB, K M G T = KiB..TiB, B)`);
    if (scale === 1 && num.includes('.')) fail('a whole number of bytes');
    bytes = Math.floor(Number(num) * scale);
  }
  if (bytes <= 0) fail('greater than zero');
  if (!Number.isSafeInteger(bytes)) fail('at most 2^53 - 1 bytes');
  return bytes;
}

/** Bytes as a short IEC string (`4 GiB`, `1.5 MiB`, `512 B`), for messages and notes. */
export function formatSize(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = bytes;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  const s = i === 0 ? String(v) : String(Math.round(v * 100) / 100);
  return `${s} ${units[i]}`;
}
