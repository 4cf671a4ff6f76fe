/**
 * Runs the README's examples, which are TypeScript: Node 20 does not run .ts files itself, so the
 * root script runs this file through tsx:
 *
 *   pnpm example quickstart [MODEL]
 *   pnpm example shared-model [MODEL]
 *
 * MODEL is a model folder (relative to the current directory); default: the embedded model.
 * Prints what the example returns (text as is, anything else as JSON).
 */
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { quickstart } from './quickstart.js';
import { sharedModel } from './shared-model.js';

const EXAMPLES: Record<string, (model: string) => Promise<unknown>> = { quickstart, 'shared-model': sharedModel };

const [name, model] = process.argv.slice(2);
const example = name !== undefined ? EXAMPLES[name] : undefined;
if (example === undefined) {
  process.stderr.write(`usage: pnpm example ${Object.keys(EXAMPLES).join('|')} [MODEL]\n`);
  process.exit(2);
}
const dir = model !== undefined ? resolve(model) : fileURLToPath(new URL('../../../models/tiny-shakespeare-qwen3', import.meta.url));
const result = await example(dir);
process.stdout.write((typeof result === 'string' ? result : JSON.stringify(result)) + '\n');
