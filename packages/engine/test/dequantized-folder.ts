import { copyFile, mkdir, open as openFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { canonicalWeightNames, GgufCheckpoint, listWeightSlots } from '@nerva/models';

/** Files of a model folder beside its weights that a dequantized copy keeps as they are. */
const SIDE_FILES = ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json'];

/**
 * Write the weights of the GGUF file `gguf`, dequantized to float32 (`GgufCheckpoint.readF32`,
 * HF names and row order), as `out/model.safetensors`, beside the config and tokenizer files of
 * the HF folder `source`: the f32 model a quantized run is exact with respect to. Writes every
 * tensor the engine reads (the spec's canonical slots); returns their names.
 */
export async function writeDequantizedFolder(gguf: string, source: string, out: string): Promise<string[]> {
  await mkdir(out, { recursive: true });
  for (const f of SIDE_FILES) if (existsSync(join(source, f))) await copyFile(join(source, f), join(out, f));
  const ck = await GgufCheckpoint.open(gguf);
  try {
    const names = listWeightSlots(canonicalWeightNames(ck.spec)).map((s) => s.name);
    const header: Record<string, unknown> = { __metadata__: { format: 'pt' } };
    let off = 0;
    for (const n of names) {
      const bytes = ck.info(n).shape.reduce((a, b) => a * b, 1) * 4;
      header[n] = { dtype: 'F32', shape: ck.info(n).shape, data_offsets: [off, off + bytes] };
      off += bytes;
    }
    let text = JSON.stringify(header);
    // The data section starts 8-byte aligned (the safetensors convention).
    text += ' '.repeat((8 - ((Buffer.byteLength(text) + 8) % 8)) % 8);
    const head = Buffer.from(text, 'utf8');
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(head.length));
    const fh = await openFile(join(out, 'model.safetensors'), 'w');
    try {
      await fh.write(len);
      await fh.write(head);
      for (const n of names) {
        const f = await ck.readF32(n);
        await fh.write(new Uint8Array(f.buffer, f.byteOffset, f.byteLength));
      }
    } finally {
      await fh.close();
    }
    return names;
  } finally {
    await ck.close();
  }
}
