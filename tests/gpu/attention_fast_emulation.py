#!/usr/bin/env python3
"""Lane-level emulation of src/backend/cuda/attention_fast.cu (no GPU needed).

Each kernel (attn_fast_fwd_kernel, attn_fast_dkdv_kernel, attn_fast_dq_kernel) is transcribed
per lane: the same shared-memory row/column formulas for every ldmatrix, the same fragment
reuse (C of S -> A of P), masks and online softmax, with ldmatrix (.trans or not) and
mma.m16n8k16 emulated from the PTX ISA's fragment figures. Checked against plain attention in
float64 (no bf16 rounding), it catches index errors that would otherwise only show on a GPU:
a wrong address formula gives errors of order 1, the transcription matches to ~1e-15.
Every tile configuration of attention_fast.h (FWD, BWD below; the D-64-only ones at D 64): a warp
with M m-tiles runs as M warps of one m-tile each, whose first row (key) is (warp M + mt) 16, as
in the kernels (each m-tile's arithmetic is that of M = 1; only the shared K/V or Q/dO fragments
are loaded once for both).
Not part of ctest (needs numpy); run by hand after changing the kernels' index arithmetic:
    python3 tests/gpu/attention_fast_emulation.py [configuration names...]
"""
import numpy as np, math, sys

def ldmatrix_x4(smem, addr, trans):
    # addr[l] = (row, col) each lane supplies; matrix i gets lanes 8i..8i+7's rows.
    mats = []
    for i in range(4):
        m = np.zeros((8, 8))
        for j in range(8):
            r, c = addr[8 * i + j]
            m[j, :] = smem[r, c:c + 8]
        mats.append(m)
    out = []  # out[l][i] = (lo, hi)
    for t in range(32):
        regs = []
        for i in range(4):
            m = mats[i]
            if not trans:
                regs.append((m[t // 4, 2 * (t % 4)], m[t // 4, 2 * (t % 4) + 1]))
            else:
                regs.append((m[2 * (t % 4), t // 4], m[2 * (t % 4) + 1, t // 4]))
        out.append(regs)
    return out

def mma(c, a, b0, b1):
    # c[l] = 4 floats, a[l] = 4 (lo,hi), b0[l], b1[l] = (lo,hi); documented layouts.
    A = np.zeros((16, 16)); B = np.zeros((16, 8)); C = np.zeros((16, 8))
    for l in range(32):
        g, tg = l // 4, l % 4
        A[g, 2*tg:2*tg+2] = a[l][0]; A[g+8, 2*tg:2*tg+2] = a[l][1]
        A[g, 2*tg+8:2*tg+10] = a[l][2]; A[g+8, 2*tg+8:2*tg+10] = a[l][3]
        B[2*tg:2*tg+2, g] = b0[l]; B[2*tg+8:2*tg+10, g] = b1[l]
        C[g, 2*tg:2*tg+2] = c[l][0:2]; C[g+8, 2*tg:2*tg+2] = c[l][2:4]
    Dm = A @ B + C
    for l in range(32):
        g, tg = l // 4, l % 4
        c[l][0:2] = Dm[g, 2*tg:2*tg+2]; c[l][2:4] = Dm[g+8, 2*tg:2*tg+2]

def block(q, k, v, i0, Tq, Tk, D, causal, scale, W=4, M=1, Bc=64):
    Br, LD = 16 * M * W, D + 8
    sl2 = scale * 1.4426950408889634
    Qs = np.zeros((Br, LD)); 
    rows = min(Br, Tq - i0); Qs[:rows, :D] = q[i0:i0 + rows]
    kend = min(Tk, i0 + Br) if causal else Tk
    ntiles = (kend + Bc - 1) // Bc
    O = np.zeros((Tq, D)); L = np.zeros(Tq)
    for warp in range(W * M):
        qf = []
        for kk in range(D // 16):
            addr = [(warp*16 + l % 8 + (l // 8) % 2 * 8, kk*16 + l // 16 * 8) for l in range(32)]
            qf.append(ldmatrix_x4(Qs, addr, False))
        o = [[np.zeros(4) for _ in range(32)] for _ in range(D // 8)]
        m = np.full((32, 2), -np.inf); lsum = np.zeros((32, 2))
        for t in range(ntiles):
            j0 = t * Bc
            Kt = np.zeros((Bc, LD)); Vt = np.zeros((Bc, LD))
            kr = min(Bc, Tk - j0); Kt[:kr, :D] = k[j0:j0+kr]; Vt[:kr, :D] = v[j0:j0+kr]
            s = [[np.zeros(4) for _ in range(32)] for _ in range(Bc // 8)]
            for nt in range(Bc // 8):
                for kk in range(0, D // 16, 2):
                    kb = ldmatrix_x4(Kt, [(nt*8 + l % 8, kk*16 + l // 8 * 8) for l in range(32)], False)
                    mma(s[nt], qf[kk], [kb[l][0] for l in range(32)], [kb[l][1] for l in range(32)])
                    mma(s[nt], qf[kk+1], [kb[l][2] for l in range(32)], [kb[l][3] for l in range(32)])
            need_mask = j0 + Bc > Tk or (causal and j0 + Bc - 1 > i0 + warp * 16)
            mx = m.copy()
            for l in range(32):
                g, tg = l // 4, l % 4
                row0 = i0 + warp*16 + g
                for nt in range(Bc // 8):
                    for e in range(4):
                        x = s[nt][l][e] * sl2
                        if need_mask:
                            row = row0 + (8 if e >= 2 else 0); col = j0 + nt*8 + 2*tg + (e & 1)
                            if col >= Tk or (causal and col > row): x = -np.inf
                        s[nt][l][e] = x
                        mx[l, e >> 1] = max(mx[l, e >> 1], x)
            # quad reduce
            mx2 = mx.copy()
            for l in range(32):
                mx2[l] = np.maximum.reduce([mx[(l & ~3) | j] for j in range(4)])
            corr = np.zeros((32, 2))
            for l in range(32):
                for r in range(2):
                    ms = 0.0 if mx2[l, r] == -np.inf else mx2[l, r]
                    corr[l, r] = 2.0 ** (m[l, r] - ms)
                    m[l, r] = mx2[l, r]; mx2[l, r] = ms; lsum[l, r] *= corr[l, r]
                for nt in range(Bc // 8):
                    for e in range(4):
                        p = 2.0 ** (s[nt][l][e] - mx2[l, e >> 1]); s[nt][l][e] = p; lsum[l, e >> 1] += p
                for dt in range(D // 8):
                    o[dt][l][0:2] *= corr[l, 0]; o[dt][l][2:4] *= corr[l, 1]
            for kk in range(Bc // 16):
                pa = [((s[2*kk][l][0], s[2*kk][l][1]), (s[2*kk][l][2], s[2*kk][l][3]),
                       (s[2*kk+1][l][0], s[2*kk+1][l][1]), (s[2*kk+1][l][2], s[2*kk+1][l][3])) for l in range(32)]
                for dt in range(0, D // 8, 2):
                    vb = ldmatrix_x4(Vt, [(kk*16 + l % 8 + (l // 8) % 2 * 8, dt*8 + l // 16 * 8) for l in range(32)], True)
                    mma(o[dt], pa, [vb[l][0] for l in range(32)], [vb[l][1] for l in range(32)])
                    mma(o[dt+1], pa, [vb[l][2] for l in range(32)], [vb[l][3] for l in range(32)])
        lq = lsum.copy()
        for l in range(32):
            lq[l] = sum(lsum[(l & ~3) | j] for j in range(4))
        for l in range(32):
            g, tg = l // 4, l % 4
            for r in range(2):
                row = i0 + warp*16 + g + 8*r
                if row >= Tq: continue
                for dt in range(D // 8):
                    O[row, dt*8 + 2*tg: dt*8 + 2*tg + 2] = o[dt][l][2*r:2*r+2] / lq[l, r]
                if tg == 0: L[row] = (m[l, r] + math.log2(lq[l, r])) * 0.6931471805599453
    return O, L

def ref(q, k, v, causal, scale):
    S = q @ k.T * scale
    if causal:
        S = np.where(np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None], S, -np.inf)
    mx = S.max(1, keepdims=True); P = np.exp(S - mx); l = P.sum(1, keepdims=True)
    return P @ v / l, (np.log(l) + mx)[:, 0]

A_ADDR = lambda base, kk: [(base + l % 8 + (l // 8) % 2 * 8, kk * 16 + l // 16 * 8) for l in range(32)]
B_ADDR = lambda nt, kk: [(nt * 8 + l % 8, kk * 16 + l // 8 * 8) for l in range(32)]
T_ADDR = lambda kk, dt: [(kk * 16 + l % 8 + (l // 8) % 2 * 8, dt * 8 + l // 16 * 8) for l in range(32)]
L2E = 1.4426950408889634

def col(frags, i): return [frags[l][i] for l in range(32)]
def c2a(s, kk):
    return [((s[2*kk][l][0], s[2*kk][l][1]), (s[2*kk][l][2], s[2*kk][l][3]),
             (s[2*kk+1][l][0], s[2*kk+1][l][1]), (s[2*kk+1][l][2], s[2*kk+1][l][3])) for l in range(32)]

def dkdv(q, k, v, do, lse, delta, Tq, Tk, D, causal, scale, k0, W=4, M=1, Bq0=64):
    Bk, Bq, LD = 16 * M * W, (Bq0 if D <= 64 else 32), D + 8
    Ks = np.zeros((Bk, LD)); Vs = np.zeros((Bk, LD))
    kr = min(Bk, Tk - k0); Ks[:kr, :D] = k[k0:k0+kr]; Vs[:kr, :D] = v[k0:k0+kr]
    qstart = k0 // Bq * Bq if causal else 0
    ntq = (Tq - qstart + Bq - 1) // Bq if qstart < Tq else 0
    dK = np.zeros((Tk, D)); dV = np.zeros((Tk, D))
    for warp in range(W * M):
        dk = [[np.zeros(4) for _ in range(32)] for _ in range(D // 8)]
        dv = [[np.zeros(4) for _ in range(32)] for _ in range(D // 8)]
        for t in range(ntq):  # group 1
            i0 = qstart + t * Bq; rows = min(Bq, Tq - i0)
            Qt = np.zeros((Bq, LD)); dOt = np.zeros((Bq, LD)); lse2 = np.zeros(Bq); dl = np.zeros(Bq)
            Qt[:rows, :D] = q[i0:i0+rows]; dOt[:rows, :D] = do[i0:i0+rows]
            lse2[:rows] = lse[i0:i0+rows] * L2E; dl[:rows] = delta[i0:i0+rows]
            st = [[np.zeros(4) for _ in range(32)] for _ in range(Bq // 8)]
            dpt = [[np.zeros(4) for _ in range(32)] for _ in range(Bq // 8)]
            for kk in range(0, D // 16, 2):
                ka = [ldmatrix_x4(Ks, A_ADDR(warp * 16, kk + j), False) for j in range(2)]
                va = [ldmatrix_x4(Vs, A_ADDR(warp * 16, kk + j), False) for j in range(2)]
                for nt in range(Bq // 8):
                    qb = ldmatrix_x4(Qt, B_ADDR(nt, kk), False); ob = ldmatrix_x4(dOt, B_ADDR(nt, kk), False)
                    mma(st[nt], ka[0], col(qb, 0), col(qb, 1)); mma(st[nt], ka[1], col(qb, 2), col(qb, 3))
                    mma(dpt[nt], va[0], col(ob, 0), col(ob, 1)); mma(dpt[nt], va[1], col(ob, 2), col(ob, 3))
            for l in range(32):
                g, tg = l // 4, l % 4
                key0 = k0 + warp * 16 + g
                for nt in range(Bq // 8):
                    for e in range(4):
                        key = key0 + (8 if e >= 2 else 0); c = nt * 8 + 2 * tg + (e & 1); query = i0 + c
                        vis = key < Tk and query < Tq and (not causal or key <= query)
                        p = 2.0 ** (st[nt][l][e] * scale * L2E - lse2[c]) if vis else 0.0
                        st[nt][l][e] = p; dpt[nt][l][e] = p * (dpt[nt][l][e] - dl[c])
            for kk in range(Bq // 16):
                pa = c2a(st, kk); sa = c2a(dpt, kk)
                for dt in range(0, D // 8, 2):
                    ob = ldmatrix_x4(dOt, T_ADDR(kk, dt), True); qb = ldmatrix_x4(Qt, T_ADDR(kk, dt), True)
                    mma(dv[dt], pa, col(ob, 0), col(ob, 1)); mma(dv[dt+1], pa, col(ob, 2), col(ob, 3))
                    mma(dk[dt], sa, col(qb, 0), col(qb, 1)); mma(dk[dt+1], sa, col(qb, 2), col(qb, 3))
        for l in range(32):
            g, tg = l // 4, l % 4
            for r in range(2):
                key = k0 + warp * 16 + g + 8 * r
                if key >= Tk: continue
                for dt in range(D // 8):
                    c = dt * 8 + 2 * tg
                    dK[key, c:c+2] = dk[dt][l][2*r:2*r+2] * scale; dV[key, c:c+2] = dv[dt][l][2*r:2*r+2]
    return dK, dV

def dq_block(q, k, v, do, lse, delta, Tq, Tk, D, causal, scale, i0, W=4, Bc=64):
    Br, LD = 16 * W, D + 8
    Qs = np.zeros((Br, LD)); dOs = np.zeros((Br, LD)); rows = min(Br, Tq - i0)
    Qs[:rows, :D] = q[i0:i0+rows]; dOs[:rows, :D] = do[i0:i0+rows]
    kend = min(Tk, i0 + Br) if causal else Tk
    dQ = np.zeros((Tq, D))
    for warp in range(W):
        dq = [[np.zeros(4) for _ in range(32)] for _ in range(D // 8)]
        for t in range((kend + Bc - 1) // Bc):
            j0 = t * Bc; Kt = np.zeros((Bc, LD)); Vt = np.zeros((Bc, LD)); kr = min(Bc, Tk - j0)
            Kt[:kr, :D] = k[j0:j0+kr]; Vt[:kr, :D] = v[j0:j0+kr]
            s = [[np.zeros(4) for _ in range(32)] for _ in range(Bc // 8)]
            dp = [[np.zeros(4) for _ in range(32)] for _ in range(Bc // 8)]
            for kk in range(0, D // 16, 2):
                qa = [ldmatrix_x4(Qs, A_ADDR(warp * 16, kk + j), False) for j in range(2)]
                oa = [ldmatrix_x4(dOs, A_ADDR(warp * 16, kk + j), False) for j in range(2)]
                for nt in range(Bc // 8):
                    kb = ldmatrix_x4(Kt, B_ADDR(nt, kk), False); vb = ldmatrix_x4(Vt, B_ADDR(nt, kk), False)
                    mma(s[nt], qa[0], col(kb, 0), col(kb, 1)); mma(s[nt], qa[1], col(kb, 2), col(kb, 3))
                    mma(dp[nt], oa[0], col(vb, 0), col(vb, 1)); mma(dp[nt], oa[1], col(vb, 2), col(vb, 3))
            for l in range(32):
                g, tg = l // 4, l % 4
                row0 = i0 + warp * 16 + g
                for nt in range(Bc // 8):
                    for e in range(4):
                        row = row0 + (8 if e >= 2 else 0); key = j0 + nt * 8 + 2 * tg + (e & 1)
                        l2 = lse[row] * L2E if row < Tq else 0.0; dl = delta[row] if row < Tq else 0.0
                        vis = key < Tk and (not causal or key <= row)
                        p = 2.0 ** (s[nt][l][e] * scale * L2E - l2) if vis else 0.0
                        dp[nt][l][e] = p * (dp[nt][l][e] - dl)
            for kk in range(Bc // 16):
                sa = c2a(dp, kk)
                for dt in range(0, D // 8, 2):
                    kb = ldmatrix_x4(Kt, T_ADDR(kk, dt), True)
                    mma(dq[dt], sa, col(kb, 0), col(kb, 1)); mma(dq[dt+1], sa, col(kb, 2), col(kb, 3))
        for l in range(32):
            g, tg = l // 4, l % 4
            for r in range(2):
                row = i0 + warp * 16 + g + 8 * r
                if row >= Tq: continue
                for dt in range(D // 8):
                    c = dt * 8 + 2 * tg; dQ[row, c:c+2] = dq[dt][l][2*r:2*r+2] * scale
    return dQ

def ref_grads(q, k, v, do, causal, scale):
    S = q @ k.T * scale
    mask = np.ones_like(S, dtype=bool)
    if causal: mask = np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None]
    S = np.where(mask, S, -np.inf); mx = S.max(1, keepdims=True); P = np.exp(S - mx); P /= P.sum(1, keepdims=True)
    O = P @ v; dV = P.T @ do; dP = do @ v.T; dS = P * (dP - (do * O).sum(1, keepdims=True))
    return O, dS @ k * scale, dS.T @ q * scale, dV

if __name__ == "__main__":
  FWD = {"f64x64w4": (4, 1, 64), "f128x64w8": (8, 1, 64), "f128x64w4": (4, 2, 64), "f64x128w4": (4, 1, 128)}
  BWD = {"b64x64w4": (4, 1, 64, 4), "b128x64w8": (8, 1, 64, 8), "b128x16w4": (4, 2, 16, 4)}
  only = sys.argv[1:]
  rng = np.random.default_rng(0)
  for name, (W, M, Bc) in FWD.items():
    if only and name not in only: continue
    for (Tq, Tk, D, causal) in [(77, 77, 64, True), (130, 70, 64, False), (40, 150, 128, True), (90, 40, 64, True), (150, 150, 64, True)]:
      if (M > 1 or Bc > 64) and D != 64: continue
      Br = 16 * M * W
      q = rng.uniform(-2.5, 2.5, (Tq, D)); k = rng.uniform(-1, 1, (Tk, D)); v = rng.uniform(-1, 1, (Tk, D))
      scale = 1 / math.sqrt(D)
      O = np.full((Tq, D), np.nan); L = np.full(Tq, np.nan)
      for i0 in range(0, Tq, Br):
          Ob, Lb = block(q, k, v, i0, Tq, Tk, D, causal, scale, W, M, Bc)
          O[i0:i0+Br] = Ob[i0:i0+Br]; L[i0:i0+Br] = Lb[i0:i0+Br]
      Or, Lr = ref(q, k, v, causal, scale)
      print(name, Tq, Tk, D, causal, "max|dO|", np.abs(O - Or).max(), "max|dlse|", np.abs(L - Lr).max(), flush=True)
      assert np.abs(O - Or).max() < 1e-9 and np.abs(L - Lr).max() < 1e-9, "forward emulation differs"
  rng = np.random.default_rng(1)
  for name, (W, M, Bq, Wq) in BWD.items():
    if only and name not in only: continue
    for (Tq, Tk, D, causal) in [(77, 77, 64, True), (130, 70, 64, False), (40, 150, 128, True), (90, 40, 64, True), (70, 70, 128, False), (150, 150, 64, True)]:
      if M > 1 and D != 64: continue
      Bk, Br = 16 * M * W, 16 * Wq
      q = rng.uniform(-2.5, 2.5, (Tq, D)); k = rng.uniform(-1, 1, (Tk, D)); v = rng.uniform(-1, 1, (Tk, D)); do = rng.uniform(-1, 1, (Tq, D))
      scale = 1 / math.sqrt(D)
      O, lse = ref(q, k, v, causal, scale)
      delta = (O * do).sum(1)
      _, dQr, dKr, dVr = ref_grads(q, k, v, do, causal, scale)
      dK = np.full((Tk, D), np.nan); dV = np.full((Tk, D), np.nan); dQ = np.full((Tq, D), np.nan)
      for k0 in range(0, Tk, Bk):
          a, b = dkdv(q, k, v, do, lse, delta, Tq, Tk, D, causal, scale, k0, W, M, Bq)
          dK[k0:k0+Bk] = a[k0:k0+Bk]; dV[k0:k0+Bk] = b[k0:k0+Bk]
      for i0 in range(0, Tq, Br):
          dQ[i0:i0+Br] = dq_block(q, k, v, do, lse, delta, Tq, Tk, D, causal, scale, i0, Wq, 64)[i0:i0+Br]
      print(name, Tq, Tk, D, causal, "dq", np.abs(dQ - dQr).max(), "dk", np.abs(dK - dKr).max(), "dv", np.abs(dV - dVr).max(), flush=True)
      assert max(np.abs(dQ - dQr).max(), np.abs(dK - dKr).max(), np.abs(dV - dVr).max()) < 1e-9, "backward emulation differs"
