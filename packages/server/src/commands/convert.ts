import { resolve } from 'node:path';
import { convertToGguf, GGUF_CONVERT_TYPES, type GgufConvertType } from '@nerva/models';
import { InvalidArgumentError, type Command } from 'commander';
import { parseSizeArg, progressBar } from '../cli-util.js';

function parseType(v: string): GgufConvertType {
  const t = v.toUpperCase();
  if (!(GGUF_CONVERT_TYPES as readonly string[]).includes(t)) throw new InvalidArgumentError(`--type must be one of ${GGUF_CONVERT_TYPES.join(', ')}, got "${v}"`);
  return t as GgufConvertType;
}

interface ConvertFlags {
  out: string;
  type: GgufConvertType;
  name?: string;
  force?: boolean;
  allowRequantize?: boolean;
  splitMaxSize?: number;
}

export function registerConvert(program: Command): void {
  program
    .command('convert')
    .description('convert a Hugging Face safetensors model folder to a GGUF file (llama.cpp layout, names, metadata and type rules), or write a GGUF file again at another type (as llama-quantize does)')
    .argument('<source>', 'model folder (config.json + safetensors [+ tokenizer.json]) or a .gguf file')
    .requiredOption('--out <file>', 'the .gguf file to write (written under a temporary name, renamed when complete)')
    .option('--type <type>', `file type: ${GGUF_CONVERT_TYPES.join(' | ')} (llama-quantize's names and per-tensor mixes, without an importance matrix; Q4_K: every quantizable tensor Q4_K)`, parseType, 'F16')
    .option('--name <name>', "general.name (default: the folder's name; a .gguf source's own)")
    .option('--allow-requantize', 'a .gguf source: re-encode tensors that are already block-quantized (they are rounded twice)')
    .option('--split-max-size <size>', "most tensor bytes a file holds (e.g. 45G): a larger model is written as llama.cpp's splits, OUT-00001-of-0000N.gguf...", parseSizeArg('--split-max-size'))
    .option('--force', 'replace an existing output file')
    .action(async (dir: string, f: ConvertFlags) => {
      const bar = progressBar(`converting to ${f.type}`);
      const r = await convertToGguf({
        source: dir,
        out: f.out,
        type: f.type,
        overwrite: f.force === true,
        allowRequantize: f.allowRequantize === true,
        ...(f.splitMaxSize !== undefined && { splitMaxBytes: f.splitMaxSize }),
        ...(f.name !== undefined && { name: f.name }),
        onProgress: (done, total) => bar(done, total),
      });
      const byType: Record<string, number> = {};
      for (const t of r.tensors) byType[t.type] = (byType[t.type] ?? 0) + 1;
      process.stdout.write(JSON.stringify({ out: resolve(r.out), files: r.files.map((p) => resolve(p)), bytes: r.bytes, type: f.type, file_type: r.fileType, tensors: r.tensors.length, tensor_types: byType, tokenizer: r.tokenizer }) + '\n');
    });
}
