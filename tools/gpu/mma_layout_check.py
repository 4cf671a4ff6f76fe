# The index math of k_attn_decode_gqa_tc (ops/attention/decode_gqa.cu) on the CPU: PTX semantics of
# ldmatrix m8n8 x4 [.trans] and mma m16n8k16 row.col emulated in float64 (no bf16 rounding), so a
# fragment-layout mistake shows here, without a GPU. Run: python3 tools/gpu/mma_layout_check.py
import numpy as np
rng = np.random.default_rng(1)
HD, KEYS, LD = 128, 32, 136
def ldsm4(smem, addrs, trans):
    # addrs[t]: element offset of the row thread t supplies (matrix t//8, row t%8)
    r = np.zeros((32, 4, 2))
    for j in range(4):
        M = np.array([smem[addrs[8*j + i]: addrs[8*j + i] + 8] for i in range(8)])
        for t in range(32):
            g, c = t // 4, t % 4
            if not trans: r[t, j] = M[g, 2*c:2*c+2]
            else: r[t, j] = [M[2*c, g], M[2*c+1, g]]
    return r
def mma(d, a, b0, b1):
    # a[t] = 4 pairs, b0[t], b1[t] pairs; d[t] = 4 floats
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for t in range(32):
        g, c = t // 4, t % 4
        A[g, 2*c:2*c+2] = a[t][0]; A[g+8, 2*c:2*c+2] = a[t][1]
        A[g, 2*c+8:2*c+10] = a[t][2]; A[g+8, 2*c+8:2*c+10] = a[t][3]
        B[2*c:2*c+2, g] = b0[t]; B[2*c+8:2*c+10, g] = b1[t]
    D = A @ B
    for t in range(32):
        g, c = t // 4, t % 4
        d[t] += [D[g, 2*c], D[g, 2*c+1], D[g+8, 2*c], D[g+8, 2*c+1]]
def split(x):  # stand-in for pa2Split: hi = x, lo = 0 (layout check only)
    return x, 0.0
for G in (1, 2, 4, 8):
    q = rng.standard_normal((G, HD)); K = rng.standard_normal((KEYS, HD)); V = rng.standard_normal((KEYS, HD))
    Ks = np.zeros(KEYS * LD); Vs = np.zeros(KEYS * LD)
    for j in range(KEYS): Ks[j*LD:j*LD+HD] = K[j]; Vs[j*LD:j*LD+HD] = V[j]
    sc = np.full((G, KEYS), np.nan)
    # qa per thread
    qa = np.zeros((32, HD // 16, 4, 2))
    for t in range(32):
        gq, cq = t // 4, (t % 4) * 2
        for ks in range(HD // 16):
            d = ks * 16 + cq
            if gq < G:
                qa[t, ks, 0] = [q[gq, d], q[gq, d+1]]; qa[t, ks, 1] = [0, 0]
                qa[t, ks, 2] = [q[gq, d+8], q[gq, d+9]]; qa[t, ks, 3] = [0, 0]
    for warp in range(4):
        d4 = np.zeros((32, 4))
        for kk in range(HD // 32):
            addrs = [(8*warp + (lane & 7)) * LD + kk*32 + (lane >> 3) * 8 for lane in range(32)]
            b = ldsm4(Ks, addrs, False)
            mma(d4, qa[:, 2*kk], b[:, 0], b[:, 1]); mma(d4, qa[:, 2*kk+1], b[:, 2], b[:, 3])
        for t in range(32):
            gq, cq = t // 4, (t % 4) * 2
            if gq < G:
                key = 8*warp + cq
                sc[gq, key] = d4[t, 0] + d4[t, 2]; sc[gq, key+1] = d4[t, 1] + d4[t, 3]
    assert np.allclose(sc, q @ K.T), ('scores', G)
    P = rng.random((G, KEYS)); sc = P.copy()
    out = np.full((G, HD), np.nan)
    for warp in range(4):
        acc = np.zeros((4, 32, 4))
        for ks in range(KEYS // 16):
            pa = np.zeros((32, 4, 2))
            for t in range(32):
                gq, cq = t // 4, (t % 4) * 2
                if gq < G:
                    pa[t, 0] = sc[gq, 16*ks+cq:16*ks+cq+2]; pa[t, 2] = sc[gq, 16*ks+cq+8:16*ks+cq+10]
            for np_ in range(2):
                addrs = [(16*ks + ((lane >> 3) & 1)*8 + (lane & 7)) * LD + 32*warp + 16*np_ + ((lane >> 3) >> 1)*8 for lane in range(32)]
                b = ldsm4(Vs, addrs, True)
                mma(acc[2*np_], pa, b[:, 0], b[:, 1]); mma(acc[2*np_+1], pa, b[:, 2], b[:, 3])
        for t in range(32):
            gq, cq = t // 4, (t % 4) * 2
            if gq < G:
                for nt in range(4):
                    d = 32*warp + 8*nt + cq
                    out[gq, d] = acc[nt, t, 0] + acc[nt, t, 2]; out[gq, d+1] = acc[nt, t, 1] + acc[nt, t, 3]
    assert np.allclose(out, P @ V), ('out', G)
    print('G', G, 'ok')
