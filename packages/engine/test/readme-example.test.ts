import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { quickstart } from '../examples/quickstart.js';
import { DEFAULT_MODEL, ROOT } from './fixtures.js';

describe('the README example', () => {
  it('is in the README verbatim and generates text on the default model', async () => {
    const source = readFileSync(join(ROOT, 'packages/engine/examples/quickstart.ts'), 'utf8');
    expect(readFileSync(join(ROOT, 'README.md'), 'utf8')).toContain(source.trim());
    const a = await quickstart(DEFAULT_MODEL);
    expect(a.length).toBeGreaterThan(20);
    // Seeded sampling: the same text again.
    expect(await quickstart(DEFAULT_MODEL)).toBe(a);
  });
});
