import {
  existsSync,
  mkdtempSync,
  readFileSync,
  writeFileSync,
  copyFileSync,
  rmSync,
  mkdirSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { FIXTURES, nerva } from "./cli-helpers.js";

const tmp = mkdtempSync(join(tmpdir(), "nerva-cli-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe("nerva run", () => {
  it("streams Shakespeare-like text from the embedded default model and ends with one JSON line", async () => {
    const { stdout, stderr } = await nerva([
      "run",
      "--max-tokens",
      "40",
      "--seed",
      "3",
      "--backend",
      "cpu",
      "--json",
    ]);
    const lines = stdout.trimEnd().split("\n");
    const j = JSON.parse(lines[lines.length - 1]);
    expect(j.backend).toBe("cpu");
    expect(j.model).toContain("tiny-shakespeare-qwen3");
    expect(j.token_ids).toHaveLength(40);
    expect(j.first_logits_top5).toHaveLength(5);
    expect(j.ledger.decode_tokens).toBe(39);
    expect(j.ledger.hot_path_allocations).toBe(0);
    // The streamed text is the JSON text; it is English-looking words.
    expect(stdout.startsWith(j.text)).toBe(true);
    expect(
      j.text.split(/\s+/).filter((w: string) => /^[A-Za-z',.;:!?-]+$/.test(w))
        .length
    ).toBeGreaterThan(15);
    expect(stderr).not.toContain("error");
  });

  it("matches the transformers float64 greedy reference through the CLI", async () => {
    const dir = join(FIXTURES, "models/tiny-random-qwen3");
    const ref = JSON.parse(readFileSync(join(dir, "reference.json"), "utf8"))
      .cases[0];
    const { stdout } = await nerva([
      "run",
      "--model",
      dir,
      "--prompt-ids",
      ref.prompt_ids.join(","),
      "--temperature",
      "0",
      "--max-tokens",
      "12",
      "--backend",
      "cpu",
      "--json",
    ]);
    const j = JSON.parse(stdout.trimEnd().split("\n").pop()!);
    expect(j.prompt_ids).toEqual(ref.prompt_ids);
    expect(j.token_ids.length).toBeGreaterThan(0);
    expect(j.token_ids).toEqual(ref.greedy_f64.slice(0, j.token_ids.length));
    expect(j.first_logits_top5.map((p: number[]) => p[0])).toEqual(
      ref.top5_ids_f64
    );
  });

  it("--numerics bf16 follows transformers bf16 where it leaves the float64 path", async () => {
    const dir = join(FIXTURES, "models/tiny-random-llama-sharded");
    const ref = JSON.parse(readFileSync(join(dir, "reference.json"), "utf8"))
      .cases[2];
    expect(ref.bf16_agrees_for).toBeLessThan(ref.greedy_f64.length);
    const args = [
      "run",
      "--model",
      dir,
      "--prompt-ids",
      ref.prompt_ids.join(","),
      "--temperature",
      "0",
      "--max-tokens",
      String(ref.greedy_bf16_gpu.length),
      "--backend",
      "cpu",
      "--json",
    ];
    const j = JSON.parse(
      (await nerva([...args, "--numerics", "bf16"])).stdout
        .trimEnd()
        .split("\n")
        .pop()!
    );
    expect(j.numerics).toBe("bf16");
    expect(j.token_ids).toEqual(ref.greedy_bf16_gpu);
    const bad = await nerva([...args, "--numerics", "fp8"]).then(
      () => undefined,
      (e: { stderr: string; code: number }) => e
    );
    expect(bad?.code).not.toBe(0);
    expect(bad?.stderr).toMatch(
      /--numerics.*fp8|fp8.*--numerics|Allowed choices/
    );
  });

  it("a broken model folder exits non-zero with one message naming the file and the problem", async () => {
    const dir = join(tmp, "broken");
    const src = join(FIXTURES, "models/tiny-random-qwen3");
    mkdirSync(dir, { recursive: true });
    copyFileSync(join(src, "config.json"), join(dir, "config.json"));
    writeFileSync(join(dir, "model.safetensors"), Buffer.from([1, 2, 3]));
    const err = await nerva([
      "run",
      "--model",
      dir,
      "--prompt-ids",
      "1,2",
      "--backend",
      "cpu",
    ]).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e
    );
    expect(err).toBeDefined();
    expect(err!.code).not.toBe(0);
    const lines = err!.stderr.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^nerva: error: /);
    expect(lines[0]).toContain("model.safetensors");
  });

  it("rejects a bad flag value with a clear message", async () => {
    const err = await nerva(["run", "--max-tokens", "lots"]).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e
    );
    expect(err?.code).not.toBe(0);
    expect(err?.stderr).toContain("--max-tokens must be an integer");
  });

  it("--vram-budget takes sizes; garbage, negatives and zero are errors naming the flag", async () => {
    const fail = (args: string[]) =>
      nerva(["run", "--backend", "cpu", "--max-tokens", "1", ...args]).then(
        () => undefined,
        (e: { code: number; stderr: string }) => e
      );
    for (const [args, msg] of [
      [["--vram-budget", "lots"], "--vram-budget must be a size such as 4GiB"],
      [["--vram-budget", "-4GiB"], "--vram-budget must be greater than zero"],
      [["--vram-budget", "0"], "--vram-budget must be greater than zero"],
      [["--host-budget", "4 gigs"], "--host-budget must be a size"],
    ] as [string[], string][]) {
      const err = await fail(args);
      expect(err?.code, args.join(" ")).not.toBe(0);
      expect(err?.stderr, args.join(" ")).toContain(msg);
    }
  });

  it("with a --vram-budget too small for every weight the run is paged and gives the resident tokens", async () => {
    const args = [
      "run",
      "--prompt-ids",
      "1,2,3",
      "--max-tokens",
      "8",
      "--temperature",
      "0",
      "--backend",
      "cpu",
      "--json",
    ];
    const last = (out: string) => JSON.parse(out.trimEnd().split("\n").pop()!);
    const resident = last((await nerva(args)).stdout);
    expect(resident.memory.mode).toBe("resident");
    const weights = resident.memory.weights.total_bytes;
    // 1.5x the weights, as a size with a unit the way a user writes it: the budget also holds the
    // KV cache (sized from the budget when no kv_cache_bytes is given) and the activations, so the
    // weights get less room than they need and some layers stream.
    const budget = `${Math.round((1.5 * weights) / 2 ** 20)}MiB`;
    const paged = last(
      (await nerva([...args, "--vram-budget", budget])).stdout
    );
    expect(paged.memory.mode).toBe("paged");
    const tier = paged.memory.tiers.find(
      (t: { tier: string }) => t.tier === "dram"
    );
    expect(tier.budget_bytes).toBe(
      Math.round((1.5 * weights) / 2 ** 20) * 2 ** 20
    );
    expect(
      tier.weights_bytes +
        tier.staging_bytes +
        tier.kv_cache_bytes +
        tier.other_bytes
    ).toBeLessThanOrEqual(tier.budget_bytes);
    expect(paged.memory.weights.streamed_bytes).toBeGreaterThan(0);
    expect(paged.memory.weights.slots).toBeGreaterThan(0);
    expect(paged.token_ids).toEqual(resident.token_ids);
    expect(paged.ledger.hot_path_allocations).toBe(0);
  });
});

describe("nerva run --pipeline-parallel", () => {
  const args = [
    "run",
    "--prompt-ids",
    "1,5,9,14,3,27,8,2,11,6",
    "--max-tokens",
    "8",
    "--temperature",
    "0",
    "--backend",
    "cpu",
    "--json",
  ];
  const last = (out: string) => JSON.parse(out.trimEnd().split("\n").pop()!);
  const fail = (extra: string[]) =>
    nerva([...args, ...extra]).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e
    );

  it("2 and 3 stages give one stage's tokens and say how they ran", async () => {
    const one = last((await nerva(args)).stdout);
    expect(one.pipeline).toBeNull();
    for (const n of [2, 3]) {
      const r = await nerva([...args, "--pipeline-parallel", String(n)]);
      const j = last(r.stdout);
      expect(j.token_ids).toEqual(one.token_ids);
      expect(j.first_logits_top5).toEqual(one.first_logits_top5);
      expect(j.pipeline.stages).toHaveLength(n);
      expect(j.pipeline.links).toEqual(new Array(n - 1).fill("in-process"));
      expect(r.stderr).toContain(`nerva: pipeline: ${n} stages`);
      expect(r.stderr).toContain(
        "stages share one backend and its host memory"
      );
    }
  });

  it("--pipeline-micro-batches splits a pass into micro-batches: one stage's tokens, the count in --json", async () => {
    const one = last((await nerva(args)).stdout);
    const j = last((await nerva([...args, "--pipeline-parallel", "2", "--pipeline-micro-batches", "2"])).stdout);
    expect(j.token_ids).toEqual(one.token_ids);
    expect(j.pipeline.microBatches).toBe(2);
    const err = await fail(["--pipeline-parallel", "2", "--pipeline-micro-batches", "0"]);
    expect(err?.stderr).toContain('--pipeline-micro-batches must be a positive integer, got "0"');
  });

  it("under a VRAM budget each stage holds its layers resident: one stage's tokens, each stage's residency in --json", async () => {
    const one = last((await nerva(args)).stdout);
    const r = await nerva([...args, "--pipeline-parallel", "2", "--vram-budget", "24MiB"]);
    const j = last(r.stdout);
    expect(j.token_ids).toEqual(one.token_ids);
    expect(j.memory.mode).toBe("resident");
    expect(j.memory.devices.map((d: { layers: number[] }) => d.layers)).toEqual([[0, 3], [3, 6]]);
    for (const d of j.memory.devices) {
      expect(d.budget_bytes).toBe(24 * 2 ** 20);
      expect(d.weight_bytes + d.kv_bytes).toBeLessThanOrEqual(d.budget_bytes);
    }
    expect(r.stderr).toContain("pipeline under VRAM budgets, all resident: stage 0 ");
  });

  it("a bad stage count, more stages than layers, budgets that cannot fit and a host budget with stages are clear errors", async () => {
    for (const [extra, msg] of [
      [
        ["--pipeline-parallel", "0"],
        '--pipeline-parallel must be a positive integer, got "0"',
      ],
      [
        ["--pipeline-parallel", "two"],
        '--pipeline-parallel must be an integer, got "two"',
      ],
      [
        ["--pipeline-parallel", "7"],
        "pipelineParallel 7 exceeds the model's 6 decoder layers",
      ],
      [
        ["--pipeline-parallel", "2", "--vram-budget", "16MiB"],
        "the model does not fit 2 stages under VRAM budgets of 16.0 MiB, 16.0 MiB: stage 0 (layers 0-2) needs",
      ],
      [
        ["--pipeline-parallel", "2", "--stage-vram-budgets", "1GiB"],
        "stageVramBudgets lists 1 budget(s) for 2 pipeline stage(s): give one per stage",
      ],
      [
        ["--pipeline-parallel", "2", "--host-budget", "1GiB"],
        "pipelineParallel 2 with a host budget is not supported yet",
      ],
    ] as [string[], string][]) {
      const err = await fail(extra);
      expect(err?.code, extra.join(" ")).not.toBe(0);
      expect(err?.stderr, extra.join(" ")).toContain(msg);
    }
  });
});

describe("nerva run --tensor-parallel", () => {
  const args = ["run", "--prompt-ids", "1,5,9,14,3,27,8,2,11,6", "--max-tokens", "8", "--temperature", "0", "--backend", "cpu", "--json"];
  const last = (out: string) => JSON.parse(out.trimEnd().split("\n").pop()!);

  it("2 shards give one backend's tokens and report each shard's slices and residency", async () => {
    const one = last((await nerva(args)).stdout);
    expect(one.tensor_parallel).toBeNull();
    const r = await nerva([...args, "--tensor-parallel", "2"]);
    const j = last(r.stdout);
    expect(j.token_ids).toEqual(one.token_ids);
    expect(j.first_logits_top5).toEqual(one.first_logits_top5);
    expect(j.tensor_parallel.shards).toHaveLength(2);
    expect(j.tensor_parallel.shards.map((s: { kvHeads: number[] }) => s.kvHeads)).toEqual([[0, 1], [1, 2]]);
    for (const s of j.tensor_parallel.shards) expect(s.weightBytes).toBeGreaterThan(0);
    expect(r.stderr).toContain("nerva: tensor parallel: 2 shards");
    // The memory report's per-device residency: each shard's weights and its half of the KV cache.
    expect(j.memory.devices).toHaveLength(2);
    expect(j.memory.devices[0].kv_bytes).toBe(j.memory.devices[1].kv_bytes);
    expect(j.memory.devices[0].weight_bytes).toBe(j.tensor_parallel.shards[0].weightBytes);
  });

  it("a bad shard count and a count that does not divide the KV heads are clear errors", async () => {
    for (const [extra, msg] of [
      [["--tensor-parallel", "0"], '--tensor-parallel must be a positive integer, got "0"'],
      [["--tensor-parallel", "4"], "tensorParallel 4 does not divide the model's 2 KV head(s)"],
      [["--tensor-parallel", "2", "--pipeline-parallel", "7"], "pipelineParallel 7 exceeds the model's 6 decoder layers"],
    ] as [string[], string][]) {
      const err = await nerva([...args, ...extra]).then(
        () => undefined,
        (e: { code: number; stderr: string }) => e
      );
      expect(err?.code, extra.join(" ")).not.toBe(0);
      expect(err?.stderr, extra.join(" ")).toContain(msg);
    }
  });
});

describe("nerva synth", () => {
  it("writes a checkpoint in HF layout that nerva run loads", async () => {
    const out = join(tmp, "synth");
    const cfg = join(FIXTURES, "models/tiny-random-qwen3/config.json");
    const { stdout } = await nerva([
      "synth",
      "--config",
      cfg,
      "--out",
      out,
      "--seed",
      "7",
    ]);
    expect(JSON.parse(stdout.trim()).totalBytes).toBeGreaterThan(0);
    const r = await nerva([
      "run",
      "--model",
      out,
      "--prompt-ids",
      "1,2,3",
      "--max-tokens",
      "4",
      "--temperature",
      "0",
      "--backend",
      "cpu",
      "--json",
    ]);
    expect(
      JSON.parse(r.stdout.trim().split("\n").pop()!).token_ids
    ).toHaveLength(4);
  });

  it("an unsupported model_type in the config is one clear error", async () => {
    const cfg = join(tmp, "next.json");
    writeFileSync(
      cfg,
      JSON.stringify({ model_type: "qwen3_next", hidden_size: 8 })
    );
    const err = await nerva([
      "synth",
      "--config",
      cfg,
      "--out",
      join(tmp, "never"),
    ]).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e
    );
    expect(err?.code).toBe(1);
    expect(err?.stderr).toMatch(/^nerva: error: .*qwen3_next/);
    expect(existsSync(join(tmp, "never", "config.json"))).toBe(false);
  });
});

describe("nerva tokenize", () => {
  const tokDir = join(FIXTURES, "tokenizers/qwen3");
  const ref = JSON.parse(readFileSync(join(tokDir, "reference.json"), "utf8"));

  it("encodes text like Hugging Face tokenizers", async () => {
    const c = ref.encode[0];
    const { stdout } = await nerva([
      "tokenize",
      "--model",
      tokDir,
      "--text",
      c.text,
      "--json",
    ]);
    expect(JSON.parse(stdout)).toEqual({ ids: c.ids, rendered: c.text });
  });

  it("renders a chat with the generation prompt, with and without thinking", async () => {
    for (const c of ref.chat) {
      const file = join(tmp, `chat-${Math.random()}.json`);
      writeFileSync(file, JSON.stringify(c.messages));
      const args = ["tokenize", "--model", tokDir, "--chat", file, "--json"];
      if (c.kwargs.enable_thinking === false) args.push("--no-thinking");
      else if (Object.keys(c.kwargs).length > 0) continue;
      const { stdout } = await nerva(args);
      expect(JSON.parse(stdout)).toEqual({ ids: c.ids, rendered: c.rendered });
    }
  });

  it("a malformed messages file is a clear error", async () => {
    const file = join(tmp, "bad.json");
    writeFileSync(file, "{not json");
    const err = await nerva([
      "tokenize",
      "--model",
      tokDir,
      "--chat",
      file,
    ]).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e
    );
    expect(err?.code).toBe(1);
    expect(err?.stderr).toContain("bad.json: not a JSON file");
  });
});
