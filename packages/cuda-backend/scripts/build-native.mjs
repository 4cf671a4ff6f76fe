#!/usr/bin/env node
// Builds the CUDA addon: nvcc compiles each kernel translation unit (native/common/*.cu|.cc,
// native/ops/**/*.cu) in parallel and archives them into build/nerva_kernels.a, node-gyp compiles
// the Node-API glue and links it with that archive and the static CUDA runtime. cuBLAS is not
// linked (it is loaded at run time), so this needs only nvcc and the Node headers.
//   --if-available  exit 0 with a message when nvcc is missing (CI without CUDA)
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, realpathSync, rmSync } from 'node:fs';
import os from 'node:os';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { gencodeFlags, selectArchitectures } from './archs.mjs';

const pkgDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const ifAvailable = process.argv.includes('--if-available');

function findNvcc() {
  const cands = [];
  for (const v of ['CUDA_HOME', 'CUDA_PATH', 'CUDA_ROOT']) if (process.env[v]) cands.push(path.join(process.env[v], 'bin', 'nvcc'));
  const which = spawnSync('sh', ['-c', 'command -v nvcc'], { encoding: 'utf8' });
  if (which.status === 0 && which.stdout.trim()) cands.push(which.stdout.trim());
  cands.push('/usr/local/cuda/bin/nvcc');
  return cands.find((c) => existsSync(c)) ?? null;
}

// The toolkit root holding include/cuda_runtime.h and lib64/libcudart_static.a (nvcc may be a
// wrapper outside it, e.g. /usr/local/bin/nvcc).
function findCudaHome(nvccPath) {
  const cands = [];
  for (const v of ['CUDA_HOME', 'CUDA_PATH', 'CUDA_ROOT']) if (process.env[v]) cands.push(process.env[v]);
  cands.push(path.resolve(path.dirname(realpathSync(nvccPath)), '..'), '/usr/local/cuda');
  const ok = cands.find((c) => existsSync(path.join(c, 'include', 'cuda_runtime.h')));
  if (!ok) {
    console.error(`[build-native] no CUDA toolkit (include/cuda_runtime.h) in ${cands.join(', ')}`);
    process.exit(1);
  }
  return ok;
}

function localComputeCap() {
  const r = spawnSync('nvidia-smi', ['--query-gpu=compute_cap', '--format=csv,noheader'], { encoding: 'utf8' });
  return r.status === 0 && r.stdout.trim() ? r.stdout.trim() : null;
}

function run(cmd, args, opts = {}) {
  console.log(`[build-native] ${cmd} ${args.join(' ')}`);
  const r = spawnSync(cmd, args, { stdio: 'inherit', cwd: pkgDir, ...opts });
  if (r.status !== 0) {
    console.error(`[build-native] failed: ${cmd} exited with ${r.status ?? r.signal}`);
    process.exit(r.status || 1);
  }
}

const nvcc = findNvcc();
if (!nvcc) {
  const msg = '[build-native] nvcc not found (set CUDA_HOME or put nvcc on PATH): the CUDA addon was not built';
  if (ifAvailable) {
    console.log(`${msg}; skipping (--if-available).`);
    process.exit(0);
  }
  console.error(msg);
  process.exit(1);
}
const cudaHome = findCudaHome(nvcc);
const { archs, source } = selectArchitectures(process.env, localComputeCap());
console.log(`[build-native] nvcc ${nvcc} (CUDA at ${cudaHome}); architectures ${archs.join(';')} (from ${source})`);

const require = createRequire(import.meta.url);
const nodeGyp = require.resolve('node-gyp/bin/node-gyp.js');
const gypArgs = [`-Dcuda_home=${cudaHome}`];
const nodedirArgs = [];
// Local Node installs ship headers in /usr/include/node; use them rather than downloading.
if (!process.env.npm_config_nodedir) {
  const prefix = path.resolve(path.dirname(process.execPath), '..');
  if (existsSync(path.join(prefix, 'include', 'node', 'node_api.h'))) nodedirArgs.push(`--nodedir=${prefix}`);
}

run(process.execPath, [nodeGyp, 'clean']);
run(process.execPath, [nodeGyp, 'configure', ...nodedirArgs, '--', ...gypArgs]);
// The kernel translation units: every .cu under native/common and native/ops (the knob table, plain
// C++, is one of the addon's sources in binding.gyp).
function kernelSources() {
  const out = [];
  const walk = (rel) => {
    for (const e of readdirSync(path.join(pkgDir, rel), { withFileTypes: true })) {
      const p = path.join(rel, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.cu')) out.push(p);
    }
  };
  walk(path.join('native', 'common'));
  walk(path.join('native', 'ops'));
  return out.sort();
}

// Runs `jobs` (argument lists for nvcc) at most `width` at a time; exits on the first failure.
async function compileAll(jobs, width) {
  let next = 0;
  const worker = async () => {
    while (next < jobs.length) {
      const args = jobs[next++];
      console.log(`[build-native] ${nvcc} ${args.join(' ')}`);
      const code = await new Promise((resolve) => {
        const p = spawn(nvcc, args, { stdio: 'inherit', cwd: pkgDir });
        p.on('close', (c, sig) => resolve(c ?? sig));
      });
      if (code !== 0) {
        console.error(`[build-native] failed: nvcc exited with ${code}`);
        process.exit(typeof code === 'number' && code > 0 ? code : 1);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, width) }, worker));
}

const objDir = path.join(pkgDir, 'build', 'kernels');
rmSync(objDir, { recursive: true, force: true });
mkdirSync(objDir, { recursive: true });
const common = ['-O3', '-std=c++17', '-Xcompiler', '-fPIC', '-lineinfo', '-Inative', '-Inative/common', '-Inative/host', `-I${path.join(cudaHome, 'include')}`];
const objects = [];
const jobs = kernelSources().map((src) => {
  const obj = path.join('build', 'kernels', `${src.replace(/^native[\\/]/, '').replace(/[\\/]/g, '_').replace(/\.(cu|cc)$/, '')}.o`);
  objects.push(obj);
  return ['-c', src, '-o', obj, ...common, ...(src.endsWith('.cu') ? gencodeFlags(archs) : [])];
});
const width = os.availableParallelism?.() ?? os.cpus().length;
await compileAll(jobs, width);
rmSync(path.join(pkgDir, 'build', 'nerva_kernels.a'), { force: true });
run('ar', ['rcs', 'build/nerva_kernels.a', ...objects]);
run(process.execPath, [nodeGyp, 'build', ...nodedirArgs]);
const out = path.join(pkgDir, 'build', 'Release', 'nerva_cuda.node');
if (!existsSync(out)) {
  console.error(`[build-native] ${out} missing after the build`);
  process.exit(1);
}
try {
  execFileSync(process.execPath, ['-e', `require(${JSON.stringify(out)})`], { stdio: 'pipe' });
  console.log(`[build-native] built and loadable: ${out}`);
} catch (e) {
  console.log(`[build-native] built ${out}; loading it here failed (expected without a GPU driver): ${String(e.stderr ?? e).split('\n')[0]}`);
}
