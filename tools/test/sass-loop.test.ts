import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

// tools/gpu/sass_loop.py: a `cuobjdump -sass -fun` dump -> its largest loop's instruction mix. Run
// with python3 (CI has it) on a dump in cuobjdump's layout.
const script = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'gpu', 'sass_loop.py');
const ins = (addr: number, text: string) =>
  `        /*${addr.toString(16).padStart(4, '0')}*/                   ${text} ;                      /* 0x000000000000000000000000 */`;

function run(text: string, ...args: string[]): { status: number | null; stdout: string; stderr: string } {
  const dir = mkdtempSync(path.join(tmpdir(), 'sass-loop-'));
  const file = path.join(dir, 'k.sass');
  writeFileSync(file, text);
  const r = spawnSync('python3', [script, file, ...args], { encoding: 'utf8' });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('sass_loop.py', () => {
  it("counts the opcodes of the longest backward branch's span, guards and modifiers stripped", () => {
    const dump = [
      '\tFunction : _ZN5nerva3ops7k_demoEv',
      ins(0x00, 'MOV R1, c[0x0][0x28]'),
      // a short loop 0x10..0x30, then the long one 0x40..0x90
      ins(0x10, 'IADD3 R0, R0, 0x1, RZ'),
      ins(0x20, 'ISETP.GE.AND P0, PT, R0, 0x4, PT'),
      ins(0x30, '@!P0 BRA 0x10'),
      ins(0x40, 'LDS.U16 R2, [R3]'),
      ins(0x50, 'PRMT R4, R2, 0x7044, R5'),
      ins(0x60, 'FFMA R6, R4, R7, R6'),
      ins(0x70, 'PRMT R4, R2, 0x7144, R5'),
      ins(0x80, 'FFMA R6, R4, R8, R6'),
      ins(0x90, '@P1 BRA 0x40'),
      ins(0xa0, 'EXIT'),
    ].join('\n');
    const r = run(dump, '--top', '3');
    expect(r.status).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toBe('loop 0x40..0x90: 6 instructions of 11 in the function');
    expect(lines.slice(1).map((l) => l.trim())).toEqual(['2 PRMT', '2 FFMA', '1 LDS']);
  });

  it('refuses a file without SASS or without a loop, with the reason', () => {
    const empty = run('no such function\n');
    expect(empty.status).not.toBe(0);
    expect(empty.stderr).toMatch(/no SASS instructions/);
    const straight = run([ins(0x00, 'MOV R1, R2'), ins(0x10, 'EXIT')].join('\n'));
    expect(straight.status).not.toBe(0);
    expect(straight.stderr).toMatch(/no backward branch/);
  });
});
