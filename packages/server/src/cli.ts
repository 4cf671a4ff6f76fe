#!/usr/bin/env node
import { NervaError } from '@nerva/core';
import { readFileSync } from 'node:fs';
import { Command, CommanderError } from 'commander';
import { registerConvert } from './commands/convert.js';
import { registerChat } from './commands/chat.js';
import { registerList } from './commands/list.js';
import { registerRun } from './commands/run.js';
import { registerServe } from './commands/serve.js';
import { registerSynth } from './commands/synth.js';
import { registerTokenize } from './commands/tokenize.js';

const program = new Command();
// dist/cli.js (or its chunk) sits one folder below the package's package.json, in a checkout and an install alike.
// (A bundle elsewhere, e.g. for a GPU machine, has no package.json beside it: the version is then unknown.)
const version = ((): string => {
  try {
    return (JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }).version;
  } catch {
    return 'unknown (bundled)';
  }
})();
program.name('nerva').description('NERVA: an inference operating system for LLMs').version(version, '-V, --version', 'print the version of @nerva/server').exitOverride();
registerRun(program);
registerChat(program);
registerList(program);
registerTokenize(program);
registerSynth(program);
registerConvert(program);
registerServe(program);

try {
  await program.parseAsync(process.argv);
} catch (e) {
  if (e instanceof CommanderError) process.exit(e.exitCode);
  // One clear line, never a stack trace, for errors a user can act on.
  const msg = e instanceof NervaError || e instanceof Error ? e.message : String(e);
  process.stderr.write(`nerva: error: ${msg}\n`);
  if (process.env.NERVA_DEBUG) console.error(e);
  process.exit(1);
}
