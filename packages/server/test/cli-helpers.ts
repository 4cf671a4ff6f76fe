import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

/** What the CLI tests share: the repository root, the fixtures and the built `nerva` CLI. */
const run = promisify(execFile);
function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "pnpm-workspace.yaml"))) dir = dirname(dir);
  return dir;
}
export const ROOT = repoRoot();
export const FIXTURES =
  process.env.NERVA_FIXTURES ?? resolve(ROOT, "../shared/fixtures");
export const CLI = join(ROOT, "packages/server/dist/cli.js");

/** Runs `nerva ARGS` (env added to this process's); rejects with { code, stderr } on a non-zero exit. */
export const nerva = (args: string[], env: Record<string, string> = {}) =>
  run(process.execPath, [CLI, ...args], {
    cwd: ROOT,
    maxBuffer: 1 << 26,
    env: { ...process.env, ...env },
  });

/** The error of a `nerva ARGS` run expected to fail (undefined if it succeeded). */
export const nervaFails = (args: string[], env: Record<string, string> = {}) =>
  nerva(args, env).then(
    () => undefined,
    (e: { code: number; stderr: string }) => e
  );

/** The last line of stdout as JSON (`--json` output). */
export const lastJson = (out: string) =>
  JSON.parse(out.trimEnd().split("\n").pop()!);
