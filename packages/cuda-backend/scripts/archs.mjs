// Picks the CUDA architectures to compile for. Pure: the environment and the local GPU's compute
// capability (or null) come in as arguments, so it is unit-tested without a GPU.

/** The list used when nothing is configured and no GPU is visible: Ampere, Ada, Hopper. */
export const DEFAULT_ARCHS = ['80', '86', '89', '90'];

const LIST_VARS = ['NERVA_CUDA_ARCHITECTURES', 'CUDAARCHS', 'CMAKE_CUDA_ARCHITECTURES'];
const ONE_VARS = ['CUDA_ARCH'];

/** Normalizes one entry: "90", "sm_90", "9.0", "90a", "compute_90", "90-real" -> "90" / "90a". */
export function normalizeArch(raw) {
  let s = String(raw).trim().toLowerCase();
  s = s.replace(/^(sm_|compute_)/, '').replace(/-(real|virtual)$/, '');
  if (/^\d+\.\d+$/.test(s)) s = s.replace('.', '');
  if (!/^\d{2,3}[af]?$/.test(s)) throw new Error(`invalid CUDA architecture "${raw}" (expected e.g. 90, sm_90, 9.0)`);
  return s;
}

/** Parses a list like "80;90", "80,90" or "80 90"; duplicates dropped, order kept. */
export function parseArchList(value) {
  const out = [];
  for (const part of String(value).split(/[;,\s]+/)) {
    if (!part) continue;
    const a = normalizeArch(part);
    if (!out.includes(a)) out.push(a);
  }
  return out;
}

/**
 * @param {Record<string, string | undefined>} env
 * @param {string | null} localComputeCap e.g. "9.0" from nvidia-smi, or null
 * @returns {{ archs: string[], source: string }}
 */
export function selectArchitectures(env, localComputeCap) {
  for (const v of LIST_VARS) {
    const val = env[v];
    if (val && val.trim() && !['native', 'all', 'all-major'].includes(val.trim())) {
      const archs = parseArchList(val);
      if (archs.length) return { archs, source: v };
    }
  }
  for (const v of ONE_VARS) {
    const val = env[v];
    if (val && val.trim()) return { archs: [normalizeArch(val)], source: v };
  }
  if (localComputeCap && localComputeCap.trim()) {
    const caps = parseArchList(localComputeCap.split('\n').filter(Boolean).join(';'));
    if (caps.length) return { archs: caps, source: 'nvidia-smi' };
  }
  return { archs: [...DEFAULT_ARCHS], source: 'default' };
}

/**
 * nvcc -gencode flags: SASS for every arch, plus PTX of the newest for forward compatibility.
 * Hopper's SASS is built for sm_90a: it loads on the same devices as sm_90 (compute capability 9.0
 * is the only 9.x), and only that target has wgmma, which the prefill attention uses. Arch-specific
 * PTX does not carry forward, so the PTX is the plain target of the newest arch.
 */
export function gencodeFlags(archs) {
  const flags = [];
  for (const a of archs) {
    const sass = a === '90' ? '90a' : a;
    flags.push(`-gencode=arch=compute_${sass},code=sm_${sass}`);
  }
  const newest = [...archs].sort((a, b) => parseInt(a, 10) - parseInt(b, 10)).at(-1);
  if (newest) {
    const ptx = newest.replace(/[af]$/, '');
    flags.push(`-gencode=arch=compute_${ptx},code=compute_${ptx}`);
  }
  return flags;
}
