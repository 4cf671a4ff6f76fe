import {
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  mkdirSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  FIXTURES,
  lastJson as last,
  nerva,
  nervaFails as fail,
} from "./cli-helpers.js";

const tmp = mkdtempSync(join(tmpdir(), "nerva-kv-cli-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const MODEL = join(FIXTURES, "models/tiny-random-qwen3");
/** One KV page of the fixture on the CPU backend: 16 tokens of float32 K and V for every layer. */
function pageBytes(model: string): number {
  const c = JSON.parse(readFileSync(join(model, "config.json"), "utf8"));
  const headDim = c.head_dim ?? c.hidden_size / c.num_attention_heads;
  return 2 * c.num_hidden_layers * c.num_key_value_heads * headDim * 4 * 16;
}
const PB = pageBytes(MODEL);
// 90 prompt tokens + 16 generated: 7 pages of 16, more than the 4 a 5-page hot pool holds.
const PROMPT = Array.from({ length: 90 }, (_, i) => 1 + ((i * 37 + 11) % 500));
const ARGS = [
  "run",
  "--model",
  MODEL,
  "--prompt-ids",
  PROMPT.join(","),
  "--max-tokens",
  "16",
  "--temperature",
  "0",
  "--backend",
  "cpu",
  "--json",
];

describe("nerva run --kv-vram-budget", () => {
  it("the flags take sizes; garbage, zero, and a warm or cold tier without the hot budget are errors naming the flag", async () => {
    for (const [args, msg] of [
      [
        ["--kv-vram-budget", "lots"],
        "--kv-vram-budget must be a size such as 4GiB",
      ],
      [["--kv-vram-budget", "0"], "--kv-vram-budget must be greater than zero"],
      [
        ["--kv-vram-budget", "-64MiB"],
        "--kv-vram-budget must be greater than zero",
      ],
      [["--kv-host-budget", "4 gigs"], "--kv-host-budget must be a size"],
      [
        ["--kv-host-budget", "64MiB"],
        "kv_host_budget (--kv-host-budget) needs kv_vram_budget (--kv-vram-budget)",
      ],
      [
        ["--kv-offload-dir", tmp],
        "kv_offload_dir (--kv-offload-dir) needs kv_vram_budget (--kv-vram-budget)",
      ],
    ] as [string[], string][]) {
      const err = await fail([
        "run",
        "--backend",
        "cpu",
        "--max-tokens",
        "1",
        ...args,
      ]);
      expect(err?.code, args.join(" ")).not.toBe(0);
      expect(err?.stderr, args.join(" ")).toContain(msg);
    }
    for (const cmd of ["run", "serve"]) {
      const help = (await nerva([cmd, "--help"])).stdout;
      for (const flag of [
        "--kv-vram-budget <size>",
        "--kv-host-budget <size>",
        "--kv-offload-dir <dir>",
      ])
        expect(help, `${cmd} ${flag}`).toContain(flag);
    }
  });

  it("a hot pool of 5 pages gives the all-hot tokens; --json memory has the kv budgets and pages per tier", async () => {
    const allHot = last((await nerva(ARGS)).stdout);
    expect(allHot.token_ids).toHaveLength(16);
    expect(allHot.memory.kv).toBeUndefined();
    expect(allHot.memory.kv_vram_budget_bytes).toBeNull();
    expect(allHot.memory.kv_host_budget_bytes).toBeNull();
    expect(allHot.memory.kv_offload_dir).toBeNull();
    expect(allHot.memory.kv_warm_link_share).toBeNull();

    // The smallest hot pool: the null page, a sink, the recent window of 2 and the page being written.
    const budget = `${(5 * PB) / 1024}KiB`;
    const r = await nerva([...ARGS, "--kv-vram-budget", budget]);
    const j = last(r.stdout);
    expect(j.token_ids).toEqual(allHot.token_ids);
    expect(j.first_logits_top5.map((p: number[]) => p[0])).toEqual(
      allHot.first_logits_top5.map((p: number[]) => p[0])
    );
    expect(j.ledger.hot_path_allocations).toBe(0);
    expect(j.memory.kv_vram_budget_bytes).toBe(5 * PB);
    expect(j.memory.kv_host_budget_bytes).toBeNull();
    // The share in effect: the CPU backend computes in host memory, so by default no link share.
    expect(j.memory.kv_warm_link_share).toBe(0);
    const kv = j.memory.kv;
    expect(kv.block_size).toBe(16);
    expect(kv.page_bytes).toBe(PB);
    // 4 usable hot pages; the warm pool defaults to 8x the hot budget; no cold tier without a dir.
    expect(kv.tiers.hot).toMatchObject({ capacity_pages: 4, bytes: 5 * PB });
    expect(kv.tiers.warm).toMatchObject({ capacity_pages: 40, bytes: 40 * PB });
    expect(kv.tiers.cold).toEqual({
      capacity_pages: 0,
      used_pages: 0,
      bytes: 0,
    });
    // The 7 pages of the sequence (kept by the prefix cache) cannot all be hot: some are warm.
    expect(kv.tiers.hot.used_pages).toBeLessThanOrEqual(4);
    expect(kv.tiers.warm.used_pages).toBeGreaterThan(0);
    expect(
      kv.tiers.hot.used_pages + kv.tiers.warm.used_pages
    ).toBeLessThanOrEqual(Math.ceil((PROMPT.length + 16) / 16));
    expect(kv.demotions).toBeGreaterThan(0);
    expect(kv.moved.d2h.bytes).toBe(kv.demotions * PB);
    expect(kv.moved.disk_write.bytes).toBe(0);
    // Every decode pass merged host partials over the warm pages.
    expect(kv.tiered_passes).toBeGreaterThanOrEqual(15);
    expect(kv.preemptions).toBe(0);
    expect(r.stderr).toContain("nerva: tiered KV: 4 hot pages, 40 warm");
  });

  it("--kv-host-budget sizes the warm pool, --kv-offload-dir adds a cold tier whose file is removed at exit", async () => {
    const dir = join(tmp, "kv-cold");
    mkdirSync(dir, { recursive: true });
    const j = last(
      (
        await nerva([
          ...ARGS,
          "--kv-vram-budget",
          String(5 * PB),
          "--kv-host-budget",
          String(8 * PB),
          "--kv-offload-dir",
          dir,
          "--kv-warm-link-share",
          "0.5",
        ])
      ).stdout
    );
    expect(j.memory.kv_vram_budget_bytes).toBe(5 * PB);
    expect(j.memory.kv_host_budget_bytes).toBe(8 * PB);
    // The given link share: half the warm pool's slots staged (4 of 8).
    expect(j.memory.kv_warm_link_share).toBe(0.5);
    expect(j.memory.kv.staging).toMatchObject({ share: 0.5, capacity_pages: 4 });
    expect(j.memory.kv_offload_dir).toBe(dir);
    const kv = j.memory.kv;
    expect(kv.tiers.hot.capacity_pages).toBe(4);
    expect(kv.tiers.warm.capacity_pages).toBe(8);
    // The cold tier holds 4x the hot and warm slots (5 + 8), float32 pages on disk.
    expect(kv.tiers.cold.capacity_pages).toBe(4 * (5 + 8));
    expect(kv.tiers.cold.bytes).toBe(4 * (5 + 8) * PB);
    expect(readdirSync(dir)).toEqual([]);
  });

  it("a kv budget too small for one sequence's window is one clear error with the smallest that works", async () => {
    const err = await fail([...ARGS, "--kv-vram-budget", "1"]);
    expect(err?.code).toBe(1);
    // The weights load before the KV pool is sized: the load's progress line comes first.
    const lines = err!.stderr.trim().split("\n").filter((l) => !l.startsWith("nerva: loading "));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(
      /^nerva: error: kvVramBudget 1 bytes holds 0 KV pages of \d+ bytes/
    );
    expect(lines[0]).toContain(`use at least ${5 * PB} bytes`);
    // One byte short of the smallest is refused the same way; the smallest runs (above).
    const short = await fail([...ARGS, "--kv-vram-budget", String(5 * PB - 1)]);
    expect(short?.stderr).toContain(`holds 4 KV pages of ${PB} bytes`);
  });
});
