import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { checkFlags, loadConfigFile, mergeConfig } from "../src/config.js";
import { ConfigError } from "../src/errors.js";
import {
  FIXTURES,
  lastJson as last,
  nerva,
  nervaFails,
} from "./cli-helpers.js";

const MODEL = join(FIXTURES, "models/tiny-random-qwen3");
const tmp = mkdtempSync(join(tmpdir(), "nerva-kv-dtype-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe("KV cache dtype: kv_cache_dtype / --kv-cache-dtype", () => {
  it("the TOML key takes auto, f32 or bf16; anything else is an error naming the key and the file", async () => {
    const p = join(tmp, "ok.toml");
    writeFileSync(p, 'kv_cache_dtype = "bf16"\n');
    expect(await loadConfigFile(p)).toEqual({ kvCacheDtype: "bf16" });
    // A flag overrides the file.
    expect(
      mergeConfig(await loadConfigFile(p), checkFlags({ kvCacheDtype: "f32" }))
        .kvCacheDtype
    ).toBe("f32");
    for (const bad of ['"f16"', "16", '""']) {
      const q = join(tmp, "bad.toml");
      writeFileSync(q, `kv_cache_dtype = ${bad}\n`);
      const err = await loadConfigFile(q).catch((e: unknown) => e);
      expect(err, bad).toBeInstanceOf(ConfigError);
      expect((err as Error).message, bad).toMatch(
        /"kv_cache_dtype" must be "auto", "f32" or "bf16"/
      );
      expect((err as Error).message, bad).toContain(q);
    }
  });

  it("nerva run --kv-cache-dtype bf16 reports it in --json; a bad value is refused", async () => {
    const args = [
      "run",
      "--model",
      MODEL,
      "--prompt-ids",
      "1,2,3,4,5",
      "--max-tokens",
      "4",
      "--temperature",
      "0",
      "--backend",
      "cpu",
      "--json",
    ];
    const bf = last(
      (await nerva([...args, "--kv-cache-dtype", "bf16"])).stdout
    );
    expect(bf.kv_cache_dtype).toBe("bf16");
    expect(bf.token_ids).toHaveLength(4);
    const auto = last((await nerva(args)).stdout);
    expect(auto.kv_cache_dtype).toBe("f32");
    const err = await nervaFails([...args, "--kv-cache-dtype", "f16"]);
    expect(err?.code).not.toBe(0);
    expect(err?.stderr).toContain("argument 'f16' is invalid");
    for (const cmd of ["run", "serve"])
      expect((await nerva([cmd, "--help"])).stdout, cmd).toContain(
        "--kv-cache-dtype <dtype>"
      );
  });
});
