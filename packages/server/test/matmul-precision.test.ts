import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  FIXTURES,
  lastJson as last,
  nerva as nervaRun,
} from "./cli-helpers.js";
import { checkFlags, loadConfigFile, mergeConfig } from "../src/config.js";
import { ConfigError } from "../src/errors.js";
import { startTestServer } from "./helpers.js";

const MODEL = join(FIXTURES, "models/tiny-random-qwen3");
// NERVA_MATMUL cleared unless a test sets it: the flag, the file and the default are what is tested.
const nerva = (args: string[], env: Record<string, string> = {}) =>
  nervaRun(args, { NERVA_MATMUL: "", ...env });
const tmp = mkdtempSync(join(tmpdir(), "nerva-matmul-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe("matmul precision: matmul_precision / --matmul-precision", () => {
  it("the TOML key takes exact or bf16; anything else is an error naming the key and the file", async () => {
    const p = join(tmp, "ok.toml");
    writeFileSync(p, 'matmul_precision = "bf16"\n');
    expect(await loadConfigFile(p)).toEqual({ matmulPrecision: "bf16" });
    expect(
      mergeConfig(
        await loadConfigFile(p),
        checkFlags({ matmulPrecision: "exact" })
      ).matmulPrecision
    ).toBe("exact");
    for (const bad of ['"fp8"', "16", '""']) {
      const q = join(tmp, "bad.toml");
      writeFileSync(q, `matmul_precision = ${bad}\n`);
      const err = await loadConfigFile(q).catch((e: unknown) => e);
      expect(err, bad).toBeInstanceOf(ConfigError);
      expect((err as ConfigError).key).toBe("matmul_precision");
      expect((err as Error).message, bad).toMatch(
        /"matmul_precision" must be "exact" or "bf16"/
      );
    }
  });

  it("nerva run --matmul-precision bf16 reports it in --json and rounds a 12-token prefill; NERVA_MATMUL is the default; bad values are refused", async () => {
    const args = [
      "run",
      "--model",
      MODEL,
      "--prompt-ids",
      "1,2,3,4,5,6,7,8,9,10,11,12",
      "--max-tokens",
      "2",
      "--temperature",
      "0",
      "--backend",
      "cpu",
      "--json",
    ];
    const bf = last(
      (await nerva([...args, "--matmul-precision", "bf16"])).stdout
    );
    const ex = last((await nerva(args)).stdout);
    expect(bf.matmul_precision).toBe("bf16");
    expect(ex.matmul_precision).toBe("exact");
    expect(
      bf.ledger.notes.some((n: string) => n.startsWith("matmul precision bf16"))
    ).toBe(true);
    // The same prompt, the activations of its matmuls rounded: the top logits move a little.
    expect(bf.first_logits_top5).not.toEqual(ex.first_logits_top5);
    for (let i = 0; i < 5; i++)
      expect(
        Math.abs(bf.first_logits_top5[i][1] - ex.first_logits_top5[i][1])
      ).toBeLessThan(0.05 * Math.abs(ex.first_logits_top5[0][1]) + 1e-3);
    const env = last((await nerva(args, { NERVA_MATMUL: "bf16" })).stdout);
    expect(env.matmul_precision).toBe("bf16");
    expect(env.first_logits_top5).toEqual(bf.first_logits_top5);
    const flag = await nerva([...args, "--matmul-precision", "fp8"]).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e
    );
    expect(flag?.code).not.toBe(0);
    expect(flag?.stderr).toContain("argument 'fp8' is invalid");
    const badEnv = await nerva(args, { NERVA_MATMUL: "tf32" }).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e
    );
    expect(badEnv?.code).not.toBe(0);
    expect(badEnv?.stderr).toContain(
      'NERVA_MATMUL must be exact or bf16, got "tf32"'
    );
    for (const cmd of ["run", "serve"])
      expect((await nerva([cmd, "--help"])).stdout, cmd).toContain(
        "--matmul-precision <p>"
      );
  });

  it("nerva serve hands it to the engine it loads (in its worker)", async () => {
    const s = await startTestServer({ matmulPrecision: "bf16" });
    try {
      expect(s.state.engine?.info.capabilities.matmulPrecision).toBe("bf16");
      expect(
        s.state.engine?.info.notes.some((n) =>
          n.startsWith("matmul precision bf16")
        )
      ).toBe(true);
    } finally {
      await s.shutdown();
    }
  });
});
