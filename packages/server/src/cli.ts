#!/usr/bin/env node
import { NervaError } from '@nerva/core';
import { Command, CommanderError } from 'commander';
import { registerConvert } from './commands/convert.js';
import { registerRun } from './commands/run.js';
import { registerServe } from './commands/serve.js';
import { registerSynth } from './commands/synth.js';
import { registerTokenize } from './commands/tokenize.js';

const program = new Command();
program.name('nerva').description('NERVA: an inference operating system for LLMs').exitOverride();
registerRun(program);
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
