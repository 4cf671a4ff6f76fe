#!/usr/bin/env node
// The bin is this committed file, not dist/cli.js, so that installing the workspace creates the
// `nerva-bench` link without warnings before anything is built; the CLI itself lives in dist/.
import { existsSync } from 'node:fs';

const cli = new URL('../dist/cli.js', import.meta.url);
if (!existsSync(cli)) {
  process.stderr.write('nerva-bench: error: @nerva/bench is not built (no dist/cli.js); run `pnpm build` first\n');
  process.exit(1);
}
await import(cli.href);
