import { copyFileSync, mkdirSync, readdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';

/**
 * A model in a Hugging Face hub cache, laid out as huggingface_hub does: the files are blobs
 * under `models--Org--Name/blobs/`, `snapshots/<rev>/<file>` are relative symlinks to them, and
 * `refs/main` names the revision. Returns the snapshot folder.
 */
export function hubSnapshot(hub: string, repo: string, rev: string, from: string): string {
  const repoDir = join(hub, `models--${repo.replace('/', '--')}`);
  const snap = join(repoDir, 'snapshots', rev);
  mkdirSync(snap, { recursive: true });
  mkdirSync(join(repoDir, 'blobs'), { recursive: true });
  mkdirSync(join(repoDir, 'refs'), { recursive: true });
  readdirSync(from).forEach((f, i) => {
    const blob = join(repoDir, 'blobs', `${rev}-${i}`);
    copyFileSync(join(from, f), blob);
    symlinkSync(relative(snap, blob), join(snap, f));
  });
  writeFileSync(join(repoDir, 'refs', 'main'), rev);
  return snap;
}
