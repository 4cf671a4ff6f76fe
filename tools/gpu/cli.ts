// GPU machine: the `nerva` CLI itself (packages/server/src/cli.ts), bundled so it runs there.
import '../../packages/server/src/cli.ts';
