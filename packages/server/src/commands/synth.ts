import { readFile } from 'node:fs/promises';
import { GGUF_CONVERT_TYPES, writeSyntheticCheckpoint, writeSyntheticGguf, type GgufConvertType } from '@nerva/models';
import type { Command } from 'commander';
import { parseIntArg, progressBar } from '../cli-util.js';

export function registerSynth(program: Command): void {
  program
    .command('synth')
    .description('write a random bf16 checkpoint in Hugging Face layout from a config.json (for benchmarks at real sizes)')
    .requiredOption('--config <file>', 'a config.json, e.g. ../shared/configs/qwen3-8b.json')
    .requiredOption('--out <dir>', 'output folder')
    .option('--seed <n>', 'random seed', parseIntArg('--seed'), 0)
    .option('--shard-mb <n>', 'shard size in MiB', parseIntArg('--shard-mb'), 2048)
    .option('--gguf <type>', `write one GGUF file (--out is its path) with random blocks at this type: ${GGUF_CONVERT_TYPES.join(', ')}`)
    .action(async (f: { config: string; out: string; seed: number; shardMb: number; gguf?: string }) => {
      const bar = progressBar(`writing ${f.out}`);
      if (f.gguf !== undefined) {
        const config = JSON.parse(await readFile(f.config, 'utf8')) as object;
        const r = await writeSyntheticGguf({ config, out: f.out, type: f.gguf as GgufConvertType, seed: f.seed, overwrite: true, onProgress: (d, t) => bar(d, t) });
        process.stdout.write(JSON.stringify(r) + '\n');
        return;
      }
      const r = await writeSyntheticCheckpoint({
        config: f.config,
        outDir: f.out,
        seed: f.seed,
        shardBytes: f.shardMb * 2 ** 20,
        onProgress: (done: number, total: number) => bar(done, total),
      });
      process.stdout.write(JSON.stringify(r ?? { out: f.out }) + '\n');
    });
}
