#!/usr/bin/env bash
# Run here (dev machine) before a GPU run: fills the git-ignored .device/ folder that travels with
# `carry`: Node.js, the Node-API headers, and the bundled entry points.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .device/include/node-api-headers .device/include/node-addon-api
[ -f .device/node.xz ] || cp ../shared/device/node-v20.20.2-linux-x64.xz .device/node.xz
# .gitignore names .device/ already; the exclude line is for older checkouts (a worktree's .git is a file).
git check-ignore -q .device || echo '/.device/' >> "$(git rev-parse --git-path info/exclude)"
cp packages/cuda-backend/node_modules/node-api-headers/include/*.h .device/include/node-api-headers/
cp packages/cuda-backend/node_modules/node-addon-api/*.h .device/include/node-addon-api/
rm -rf .device/fixtures .device/configs && mkdir -p .device/fixtures
cp -r ../shared/fixtures/models .device/fixtures/models && cp -r ../shared/configs .device/configs
# The tree carries models/tiny-shakespeare-qwen3 (14 MB) already; a second copy would not fit carry's 64 MiB.
rm -rf .device/fixtures/models/tiny-shakespeare-qwen3
# Constrained decoding (phase grammar): XGrammar's package, which the engine loads at run time from a
# node_modules folder (its WebAssembly is inlined in lib/index.js, 1.1 MiB), found from .device/dist;
# and Qwen3's tokenizer for the synthetic checkpoints (11 MiB as is, 1.4 MiB packed; run.sh unpacks it).
xg=packages/engine/node_modules/@mlc-ai/web-xgrammar
rm -rf .device/node_modules && mkdir -p .device/node_modules/@mlc-ai/web-xgrammar/lib
cp "$xg/package.json" .device/node_modules/@mlc-ai/web-xgrammar/ && cp "$xg/lib/index.js" .device/node_modules/@mlc-ai/web-xgrammar/lib/
mkdir -p .device/tokenizers/qwen3 && install -m 644 ../shared/fixtures/tokenizers/qwen3/tokenizer_config.json .device/tokenizers/qwen3/
[ .device/tokenizers/qwen3/tokenizer.json.xz -nt ../shared/fixtures/tokenizers/qwen3/tokenizer.json ] || xz -T0 -9 -c ../shared/fixtures/tokenizers/qwen3/tokenizer.json > .device/tokenizers/qwen3/tokenizer.json.xz
node tools/gpu/bundle.mjs
# The bundles repeat the same modules: 15 MiB as files, 0.5 MiB packed (run.sh unpacks them).
rm -rf .device/dist .device/dist.tar.xz && tar -C tools/gpu -cf - dist | xz -T0 -6 > .device/dist.tar.xz
# vitest for run.sh's vitest phase (~5.5 MiB), packed again when the lockfile changes.
[ .device/vitest.tar.xz -nt pnpm-lock.yaml ] || node tools/gpu/pack_vitest.mjs .device/vitest.tar.xz
# --addon: build the addon here too (nvcc targets sm_90a unless NERVA_CUDA_ARCHITECTURES says
# otherwise), so run.sh's build phase copies it instead of compiling on the device (~60 s saved).
if [ "${1:-}" = --addon ]; then
  rm -rf .device/addon
  NERVA_CUDA_ARCHITECTURES=${NERVA_CUDA_ARCHITECTURES:-90} bash tools/gpu/build-addon.sh .device/addon
  rm -rf .device/addon/*.o .device/addon/kernels .device/addon/kernels.a
  # Packed for carry (11 MiB as built, ~1.5 MiB xz); run.sh and compare.sh unpack it.
  xz -T0 -f .device/addon/nerva_cuda.node
  find packages/cuda-backend/native -type f | LC_ALL=C sort | xargs cat tools/gpu/build-addon.sh | sha256sum | cut -c1-16 > .device/addon/sources.sha
fi
du -sh .device
