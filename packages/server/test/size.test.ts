import { InvalidArgumentError } from 'commander';
import { describe, expect, it } from 'vitest';
import { parseFractionArg, parseSizeArg } from '../src/cli-util.js';
import { formatSize, parseSize, SizeError } from '../src/size.js';

const GiB = 2 ** 30;
const MiB = 2 ** 20;

describe('parseSize', () => {
  it('reads IEC units as powers of 1024 and SI units as powers of 1000', () => {
    expect(parseSize('4GiB', '--x')).toBe(4 * GiB);
    expect(parseSize('4096MiB', '--x')).toBe(4 * GiB);
    expect(parseSize('64KiB', '--x')).toBe(65536);
    expect(parseSize('1TiB', '--x')).toBe(2 ** 40);
    expect(parseSize('512MB', '--x')).toBe(512_000_000);
    expect(parseSize('4GB', '--x')).toBe(4_000_000_000);
    expect(parseSize('2kB', '--x')).toBe(2000);
    expect(parseSize('3TB', '--x')).toBe(3e12);
  });

  it('a bare K/M/G/T (and Kubernetes-style Ki/Mi/Gi/Ti) is the binary unit: 4G is 4 GiB', () => {
    expect(parseSize('4G', '--x')).toBe(4 * GiB);
    expect(parseSize('4g', '--x')).toBe(4 * GiB);
    expect(parseSize('8M', '--x')).toBe(8 * MiB);
    expect(parseSize('1K', '--x')).toBe(1024);
    expect(parseSize('2T', '--x')).toBe(2 * 2 ** 40);
    expect(parseSize('4Gi', '--x')).toBe(4 * GiB);
    expect(parseSize('16Mi', '--x')).toBe(16 * MiB);
  });

  it('plain numbers and B are bytes; units are case-insensitive; one space and outer blanks are allowed', () => {
    expect(parseSize('1073741824', '--x')).toBe(GiB);
    expect(parseSize('100B', '--x')).toBe(100);
    expect(parseSize('4 GiB', '--x')).toBe(4 * GiB);
    expect(parseSize(' 4gib ', '--x')).toBe(4 * GiB);
    expect(parseSize('512mb', '--x')).toBe(512_000_000);
    expect(parseSize(4096, '--x')).toBe(4096);
    expect(parseSize(12n, '--x')).toBe(12);
  });

  it('fractions need a unit and round down to whole bytes', () => {
    expect(parseSize('1.5GiB', '--x')).toBe(1.5 * GiB);
    expect(parseSize('0.5G', '--x')).toBe(GiB / 2);
    expect(parseSize('.25MiB', '--x')).toBe(MiB / 4);
    expect(parseSize('0.3KiB', '--x')).toBe(307);
    expect(() => parseSize('1.5', '--x')).toThrow(/whole number of bytes/);
    expect(() => parseSize('1.5B', '--x')).toThrow(/whole number of bytes/);
    expect(() => parseSize(1.5, '--x')).toThrow(/whole number of bytes/);
  });

  it('rejects garbage, negatives, zero and overflow with a message naming the option and the value', () => {
    const bad: [string | number | bigint, RegExp][] = [
      ['', /--vram-budget must be a size such as 4GiB.*got ""/],
      ['lots', /--vram-budget must be a size such as 4GiB.*got "lots"/],
      ['GiB', /must be a size/],
      ['4 GiB extra', /must be a size/],
      ['4  GiB', /must be a size/],
      ['4.GiB', /must be a size/],
      ['1e9', /must be a size/],
      ['0x100', /must be a size/],
      ['+4G', /must be a size/],
      ['4Gb/s', /must be a size/],
      ['4XB', /unknown unit "XB"/],
      ['4GiBs', /unknown unit "GiBs"/],
      ['4 bits', /unknown unit "bits"/],
      ['-4GiB', /--vram-budget must be greater than zero, got "-4GiB"/],
      ['-1', /greater than zero/],
      ['0', /--vram-budget must be greater than zero, got "0"/],
      ['0GiB', /greater than zero/],
      ['0.0000001K', /greater than zero/],
      [0, /greater than zero, got 0/],
      [-5, /greater than zero/],
      [0n, /greater than zero/],
      [Number.NaN, /whole number of bytes/],
      [Number.POSITIVE_INFINITY, /whole number of bytes/],
      ['99999999TiB', /at most 2\^53 - 1 bytes/],
      [2n ** 60n, /at most 2\^53 - 1 bytes/],
    ];
    for (const [v, re] of bad) {
      let err: unknown;
      try {
        parseSize(v, '--vram-budget');
      } catch (e) {
        err = e;
      }
      expect(err, String(v)).toBeInstanceOf(SizeError);
      expect((err as SizeError).option).toBe('--vram-budget');
      expect((err as Error).message, String(v)).toMatch(re);
    }
  });

  it('the commander wrapper turns errors into InvalidArgumentError naming the flag', () => {
    expect(parseSizeArg('--host-budget')('32GiB')).toBe(32 * GiB);
    expect(() => parseSizeArg('--host-budget')('32 gigs')).toThrow(InvalidArgumentError);
    expect(() => parseSizeArg('--host-budget')('-1G')).toThrow(/--host-budget must be greater than zero/);
  });

  it('formatSize writes IEC figures back', () => {
    expect(formatSize(4 * GiB)).toBe('4 GiB');
    expect(formatSize(1.5 * MiB)).toBe('1.5 MiB');
    expect(formatSize(512)).toBe('512 B');
    expect(parseSize(formatSize(4 * GiB).replace(' ', ''), '--x')).toBe(4 * GiB);
  });
});

describe('parseFractionArg', () => {
  it('takes 0..1 and names the flag otherwise', () => {
    const p = parseFractionArg('--kv-warm-link-share');
    expect(p('0')).toBe(0);
    expect(p('0.35')).toBe(0.35);
    expect(p('1')).toBe(1);
    for (const bad of ['', ' ', '1.01', '-0.5', 'half', 'NaN']) expect(() => p(bad), bad).toThrow(/--kv-warm-link-share must be a number from 0 to 1/);
  });
});
