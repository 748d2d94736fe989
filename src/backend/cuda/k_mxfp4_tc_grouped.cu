/* DeepSeek-V4's MXFP4 routed experts on the tensor cores (cuda_v4_mxtc.h): W4A16 grouped GEMMs for steps of
 * many tokens (decode batches, prefill), as SGLang runs V4's experts on Hopper (no FP4 tensor cores there).
 *
 * Operands are swapped against the usual GEMM: the weight rows are mma.sync m16n8k16's A (16 rows), the slots
 * of one expert its B (8 tokens a fragment), so a tile of 8 .. 64 slots fills the N side whatever the number
 * of tokens an expert gets. A CTA (4 warps) owns 128 weight rows (up: 64 outputs' gate rows from w1 and the
 * same outputs' up rows from w3, so the SwiGLU is done on the accumulators; down: 128 outputs) and one tile
 * of slots; K runs in stages of 128 values through a 4-deep cp.async ring: the raw code bytes (64 a row),
 * the row's 4 E8M0 scale bytes, and the slots' bf16 activations (gathered by the tile's slot list).
 *
 * The K order inside a stage is permuted, identically in both operands (a dot product does not care): in a
 * 64-value half, a lane quad q owns the physical values 16q .. 16q + 15 (8 consecutive code bytes: one 8-byte
 * shared load per row; one E8M0 scale) over the 4 mma steps, and its B values are 16 consecutive bf16 (two
 * 16-byte loads). Decoding: a code s.ee.m becomes the bf16 bits s << 15 | eem << 6, i.e. the value times
 * 2^-126 (e = 0 lands on bf16 subnormals, which the bf16 multiply keeps), then times 2^126 and the block's
 * scale 2^(E-127), both exact (one multiply by 2^(E-1) when every scale of the warp's stage allows it, E in
 * 1..128), so the tensor cores multiply exactly the dequantized weight by the bf16-rounded activation and sum
 * in fp32. Forms (di_v4k_mx_tc_form): 1, the default, takes a code word's nibbles j and j + 4 as one
 * bf16x2 (their bits are 16 apart, so 4 pairs cost ~3 integer ops each), which asks the activations to be
 * stored with the positions of each 8 permuted alike (0 4 1 5 2 6 3 7: the bf16 conversion and the up
 * product's act store do it); 0 decodes a byte (nibbles 2j, 2j + 1) a pair, activations in natural order.
 * (A form 2, form 1 on 8 warps with each stage's K halves on two warps, was dropped in session 15: it failed
 * its float64 checks on the H200, rel L2 ~1.2; see git history before that.)
 *
 * Shared-memory layouts are chosen for conflict-free reads: code rows of 64 bytes with the two 32-byte halves
 * swapped on rows 2, 3 (mod 4); activation rows padded to 272 bytes. Every output's sum runs over the same
 * K stages, halves and steps in the same order whatever the tile size or the other slots (an mma column
 * depends only on its own B column): batch-invariant, tested bit for bit (test_cuda_mx_tc). Partial K
 * (K % 128) and partial rows are zero-filled / clamped and not stored. */
#include "k_v4_common.cuh"
#include "cuda_v4_mxtc.h"
#include "cuda_v4_kernels.h"

#define MT_BK 128    /* K values per stage */
#define MT_ROWS 128  /* weight rows per CTA */
#define MT_WARPS 4   /* each 32 rows: 2 m16 fragments */
#define MT_STAGES 4
#define MT_XLD 136   /* bf16 per staged activation row (272 bytes) */
#define MT_MAXE 1025 /* experts + 1 (the tile builder's shared arrays; k_v4_dense.cu's GROUP_MAX_E) */

template <int BT> struct mt_smem {
  uint8_t w[MT_STAGES][MT_ROWS * 64];
  uint32_t sc[MT_STAGES][MT_ROWS];
  bf16 x[MT_STAGES][BT * MT_XLD];
};

static __device__ __forceinline__ void mt_cp_async4(void *smem, const void *gmem, int bytes) {
  uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
/* the E8M0 byte as bf16 bits, both halves (2^(E-127); 255 NaN, 0 the smallest normal's half, as e8m0_scale) */
static __device__ __forceinline__ __nv_bfloat162 mt_scale2(uint32_t e) {
  const uint32_t b = e == 255 ? 0x7fc0u : e == 0 ? 0x0040u : e << 7;
  const uint32_t v = b | b << 16;
  return *(const __nv_bfloat162 *)&v;
}
/* 2^126 x 2^(E-127) = 2^(E-1) as bf16 bits, both halves (E in 1..128) */
static __device__ __forceinline__ __nv_bfloat162 mt_fold2(uint32_t e) {
  const uint32_t b = (e + 126) << 7, v = b | b << 16;
  return *(const __nv_bfloat162 *)&v;
}
/* the 8 codes of a word (nibble j = value j) as 4 bf16x2 of values (j, j + 4), j = 0..3, times the scale: FAST,
 * sc2 = mt_fold2 (one multiply), else sc2 = mt_scale2 (times 2^126 first) */
template <bool FAST> static __device__ __forceinline__ void mt_dec4(uint32_t w, __nv_bfloat162 sc2, uint32_t *out) {
  const uint32_t S = 0x80008000u, M = 0x01c001c0u, k126 = 0x7e807e80u;
  const uint32_t p[4] = {(w << 12 & S) | (w << 6 & M), (w << 8 & S) | (w << 2 & M), (w << 4 & S) | (w >> 2 & M),
                         (w & S) | (w >> 6 & M)};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    __nv_bfloat162 h = *(const __nv_bfloat162 *)&p[i];
    if (!FAST) h = __hmul2(h, *(const __nv_bfloat162 *)&k126);
    h = __hmul2(h, sc2);
    out[i] = *(const uint32_t *)&h;
  }
}
/* a lane's code words of half c (8 bytes of each of its 4 fragment rows, rows 2, 3 mod 4 with the halves
 * swapped) and their E8M0 scales as bf16x2 factors (FAST: the one-multiply fold; both forms' stages) */
template <bool FAST>
static __device__ __forceinline__ void mt_frags(uint2 (&wv)[2][2], __nv_bfloat162 (&sc2)[2][2], const uint8_t *sw,
                                                const uint32_t (&scw)[2][2], const int (&rr)[2][2], int c, int q) {
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = rr[m][h];
      wv[m][h] = *(const uint2 *)(sw + r * 64 + ((c ^ ((r >> 1) & 1)) << 5) + 8 * q);
      const uint32_t e = (scw[m][h] >> (8 * (2 * c + (q >> 1)))) & 0xffu;
      sc2[m][h] = FAST ? mt_fold2(e) : mt_scale2(e);
    }
}
/* form 1's stage: 2 halves x 2 words x (steps A: pairs 0, 1; B: pairs 2, 3) */
template <int BT, bool FAST>
static __device__ __forceinline__ void mt_stage1(float (&acc)[2][BT / 8][4], const uint8_t *sw, const uint32_t (&scw)[2][2],
                                                 const bf16 *sx, const int (&rr)[2][2], int g, int q) {
#pragma unroll
  for (int c = 0; c < 2; c++) {
    uint2 wv[2][2];
    __nv_bfloat162 sc2[2][2];
    mt_frags<FAST>(wv, sc2, sw, scw, rr, c, q);
#pragma unroll
    for (int sp = 0; sp < 2; sp++) {
      uint4 bv[BT / 8];
#pragma unroll
      for (int n = 0; n < BT / 8; n++) bv[n] = *(const uint4 *)(sx + (n * 8 + g) * MT_XLD + 64 * c + 16 * q + 8 * sp);
      uint32_t P[2][2][4];
#pragma unroll
      for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) mt_dec4<FAST>(sp ? wv[m][h].y : wv[m][h].x, sc2[m][h], P[m][h]);
#pragma unroll
      for (int ss = 0; ss < 2; ss++) {
#pragma unroll
        for (int n = 0; n < BT / 8; n++) {
          const uint32_t b[2] = {ss ? bv[n].z : bv[n].x, ss ? bv[n].w : bv[n].y};
#pragma unroll
          for (int m = 0; m < 2; m++) {
            const uint32_t a[4] = {P[m][0][2 * ss], P[m][1][2 * ss], P[m][0][2 * ss + 1], P[m][1][2 * ss + 1]};
            di_mma16816(acc[m][n], a, b);
          }
        }
      }
    }
  }
}
/* act's stored position of output o under form 1 (the inverse of the 0 4 1 5 2 6 3 7 order of each 8) */
static __device__ __forceinline__ int mt_perm_pos(int o) { return (o & ~7) | (o & 3) << 1 | (o >> 2 & 1); }

/* one code byte (low nibble first) to two bf16 values times the scale (form 0) */
static __device__ __forceinline__ uint32_t mt_dec(uint32_t byte, __nv_bfloat162 sc2) {
  const uint32_t p = (byte & 0xfu) | (byte & 0xf0u) << 12;
  const uint32_t r = (p & 0x00080008u) << 12 | (p & 0x00070007u) << 6;
  const uint32_t k126 = 0x7e807e80u; /* 2^126, both halves */
  __nv_bfloat162 h = __hmul2(*(const __nv_bfloat162 *)&r, *(const __nv_bfloat162 *)&k126);
  h = __hmul2(h, sc2);
  return *(const uint32_t *)&h;
}

/* form 0's stage: 2 halves x 4 steps, bytes 2s, 2s + 1 of a lane's 8 per step */
template <int BT>
static __device__ __forceinline__ void mt_stage0(float (&acc)[2][BT / 8][4], const uint8_t *sw, const uint32_t (&scw)[2][2],
                                                 const bf16 *sx, const int (&rr)[2][2], int g, int q) {
#pragma unroll
  for (int c = 0; c < 2; c++) {
    uint2 wv[2][2];
    __nv_bfloat162 sc2[2][2];
    mt_frags<false>(wv, sc2, sw, scw, rr, c, q);
#pragma unroll
    for (int sp = 0; sp < 2; sp++) {
      uint4 bv[BT / 8];
#pragma unroll
      for (int n = 0; n < BT / 8; n++) bv[n] = *(const uint4 *)(sx + (n * 8 + g) * MT_XLD + 64 * c + 16 * q + 8 * sp);
#pragma unroll
      for (int ss = 0; ss < 2; ss++) {
        const int s = 2 * sp + ss; /* bytes 2s, 2s + 1 of the lane's 8 */
        uint32_t a[2][4];
#pragma unroll
        for (int m = 0; m < 2; m++) {
          const uint32_t w0 = s < 2 ? wv[m][0].x : wv[m][0].y, w1 = s < 2 ? wv[m][1].x : wv[m][1].y;
          const int sh = 16 * (s & 1);
          a[m][0] = mt_dec(w0 >> sh, sc2[m][0]);
          a[m][1] = mt_dec(w1 >> sh, sc2[m][1]);
          a[m][2] = mt_dec(w0 >> (sh + 8), sc2[m][0]);
          a[m][3] = mt_dec(w1 >> (sh + 8), sc2[m][1]);
        }
#pragma unroll
        for (int n = 0; n < BT / 8; n++) {
          const uint32_t b[2] = {ss ? bv[n].z : bv[n].x, ss ? bv[n].w : bv[n].y};
#pragma unroll
          for (int m = 0; m < 2; m++) di_mma16816(acc[m][n], a[m], b);
        }
      }
    }
  }
}

/* UP: act[ts][o] = swiglu(w1[e][o] . x, w3[e][o] . x) (bf16), X = xb rows ts / ns; else y[ts][o] = w2[e][o] . act
 * (float), X = act rows ts. N outputs, K columns, X rows K apart. */
template <int BT, bool UP, int FORM>
__global__ void __launch_bounds__(MT_WARPS * 32) mx_tc_k(const bf16 *X, const int32_t *perm, const int32_t *tiles, int ns,
                                                         di_cuk_mxfp4w wa, di_cuk_mxfp4w wb, int N, int K, float lim,
                                                         void *out) {
  extern __shared__ __align__(16) unsigned char mt_raw[];
  mt_smem<BT> &sm = *reinterpret_cast<mt_smem<BT> *>(mt_raw);
  __shared__ int s_row[BT], s_ts[BT];
  if ((int)blockIdx.y >= tiles[0]) return;
  const int32_t *tl = tiles + 1 + 3 * blockIdx.y;
  const int e = tl[0], first = tl[1], cnt = tl[2];
  /* 4 warps of 32 rows */
  constexpr int NTH = MT_WARPS * 32;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int rg = warp;
  for (int t = tid; t < BT; t += blockDim.x) {
    const int ts = t < cnt ? perm[first + t] : -1;
    s_ts[t] = ts;
    s_row[t] = ts < 0 ? -1 : UP ? ts / ns : ts;
  }
  __syncthreads();
  const int o0 = blockIdx.x * (UP ? MT_ROWS / 2 : MT_ROWS);
  /* this thread's copies: code rows (tid >> 2) + NTH / 4 i, 16-byte chunk tid & 3; the scale word of row tid */
  constexpr int NQ = MT_ROWS * 4 / NTH;
  const int cj = tid & 3;
  const uint8_t *qrow[NQ];
  uint32_t qdst[NQ];
#pragma unroll
  for (int i = 0; i < NQ; i++) {
    const int r = (tid >> 2) + NTH / 4 * i;
    const int up1 = UP && r >= MT_ROWS / 2;
    const int o = o0 + (up1 ? r - MT_ROWS / 2 : r), oc = o < N ? o : N - 1;
    qrow[i] = (up1 ? wb.q : wa.q) + ((size_t)e * N + oc) * (up1 ? wb.ldq : wa.ldq);
    qdst[i] = r * 64 + (((cj >> 1) ^ ((r >> 1) & 1)) << 5) + ((cj & 1) << 4);
  }
  const uint8_t *srow;
  {
    const int sr = tid;
    const int up1 = UP && sr >= MT_ROWS / 2;
    const int o = o0 + (up1 ? sr - MT_ROWS / 2 : sr), oc = o < N ? o : N - 1;
    srow = (up1 ? wb.scale : wa.scale) + ((size_t)e * N + oc) * (up1 ? wb.lds : wa.lds);
  }
  const int nk = (K + MT_BK - 1) / MT_BK;
  auto load = [&](int st, int kt) {
    const int k0 = kt * MT_BK;
#pragma unroll
    for (int i = 0; i < NQ; i++) {
      const bool ok = k0 + 32 * cj < K;
      di_cp_async16(sm.w[st] + qdst[i], ok ? qrow[i] + k0 / 2 + 16 * cj : qrow[i], ok);
    }
    const int nb = (K - k0) / 32;
    mt_cp_async4(&sm.sc[st][tid], srow + k0 / 32, nb >= 4 ? 4 : nb);
#pragma unroll
    for (int i = 0; i < (BT * 16 + NTH - 1) / NTH; i++) {
      const int idx = tid + NTH * i, t = idx >> 4, j = idx & 15;
      if (BT * 16 % NTH != 0 && idx >= BT * 16) break;
      const int row = s_row[t];
      const bool ok = row >= 0 && k0 + 8 * j < K;
      di_cp_async16(&sm.x[st][t * MT_XLD + 8 * j], ok ? X + (size_t)row * K + k0 + 8 * j : X, ok);
    }
  };
  float acc[2][BT / 8][4];
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int n = 0; n < BT / 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[m][n][i] = 0.f;
  /* this thread's shared rows: fragment m, half h (row g or g + 8) */
  int rr[2][2];
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int h = 0; h < 2; h++) rr[m][h] = (UP ? m * (MT_ROWS / 2) + rg * 16 : rg * 32 + m * 16) + g + 8 * h;

#pragma unroll
  for (int st = 0; st < MT_STAGES - 1; st++) {
    if (st < nk) load(st, st);
    di_cp_commit();
  }
  for (int kt = 0; kt < nk; kt++) {
    di_cp_wait<MT_STAGES - 2>();
    __syncthreads(); /* stage kt landed for every thread; stage kt - 1's reads are done */
    if (kt + MT_STAGES - 1 < nk) load((kt + MT_STAGES - 1) % MT_STAGES, kt + MT_STAGES - 1);
    di_cp_commit();
    const int st = kt % MT_STAGES;
    const uint8_t *sw = sm.w[st];
    const bf16 *sx = sm.x[st];
    uint32_t scw[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
      for (int h = 0; h < 2; h++) scw[m][h] = sm.sc[st][rr[m][h]];
    if constexpr (FORM != 0) {
      uint32_t bad = 0; /* a scale byte outside 1..128 (the one-multiply decode's range) */
#pragma unroll
      for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) bad |= __vsub4(scw[m][h], 0x01010101u) & 0x80808080u;
      if (__all_sync(0xffffffffu, bad == 0)) mt_stage1<BT, true>(acc, sw, scw, sx, rr, g, q);
      else mt_stage1<BT, false>(acc, sw, scw, sx, rr, g, q);
    } else {
      mt_stage0<BT>(acc, sw, scw, sx, rr, g, q);
    }
  }
  di_cp_wait<0>();
  /* accumulator i of fragment (m, n): output row g + 8 (i >> 1), slot column n * 8 + 2q + (i & 1) */
#pragma unroll
  for (int n = 0; n < BT / 8; n++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int t = n * 8 + 2 * q + (i & 1);
      if (t >= cnt) continue;
      const size_t ts = (size_t)s_ts[t];
      if (UP) {
        const int o = o0 + rg * 16 + g + 8 * (i >> 1);
        if (o >= N) continue;
        const float gr = acc[0][n][i], u = acc[1][n][i];
        const float gv = gr > lim ? lim : gr;
        const float uv = u > lim ? lim : u < -lim ? -lim : u;
        ((bf16 *)out)[ts * N + (FORM != 0 ? mt_perm_pos(o) : o)] = __float2bfloat16((float)(gv / (1.0 + exp(-(double)gv))) * uv);
      } else {
#pragma unroll
        for (int m = 0; m < 2; m++) {
          const int o = o0 + rg * 32 + m * 16 + g + 8 * (i >> 1);
          if (o < N) ((float *)out)[ts * N + o] = acc[m][n][i];
        }
      }
    }
}

/* the tile list of bt slots from tiles8's (expert-grouped, ascending experts) list: per expert its first slot in
 * perm and its count, then thread 0 cuts each expert's run in tiles of bt */
__global__ void mx_tc_tiles_k(const int32_t *t8, int E1, int e_skip, int bt, int max_tiles, int32_t *work) {
  __shared__ int start[MT_MAXE], cnt[MT_MAXE];
  for (int e = threadIdx.x; e < E1; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int n8 = t8[0];
  for (int j = threadIdx.x; j < n8; j += blockDim.x) {
    const int e = t8[1 + 3 * j];
    atomicAdd(&cnt[e], t8[3 + 3 * j]);
    if (j == 0 || t8[1 + 3 * (j - 1)] != e) start[e] = t8[2 + 3 * j];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int nt = 0;
    for (int e = 0; e < E1; e++) {
      if (e == e_skip) continue;
      for (int j = 0; j < cnt[e] && nt < max_tiles; j += bt, nt++) {
        work[1 + 3 * nt] = e;
        work[2 + 3 * nt] = start[e] + j;
        work[3 + 3 * nt] = cnt[e] - j < bt ? cnt[e] - j : bt;
      }
    }
    work[0] = nt;
  }
}

/* 8 floats to 8 bf16, in order (form 0) or as 0 4 1 5 2 6 3 7 (form 1) */
__global__ void mx_tc_acts_k(const float4 *x, int n8, uint4 *xb, int perm) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const float4 a = x[2 * i], b = x[2 * i + 1];
  xb[i] = perm ? make_uint4(di_pack_bf16(a.x, b.x), di_pack_bf16(a.y, b.y), di_pack_bf16(a.z, b.z), di_pack_bf16(a.w, b.w))
               : make_uint4(di_pack_bf16(a.x, a.y), di_pack_bf16(a.z, a.w), di_pack_bf16(b.x, b.y), di_pack_bf16(b.z, b.w));
}

static int g_mt_bt = 0, g_mt_form = 1;
extern "C" void di_v4k_mx_tc_tile(int bt) { g_mt_bt = bt; }
extern "C" void di_v4k_mx_tc_form(int form) { g_mt_form = form == 0 ? 0 : 1; }
extern "C" int di_v4k_mx_tc_get_form(void) { return g_mt_form; }

extern "C" int di_v4k_mx_tc_pick_tile(int T, int n_slots, int E1) {
  if (g_mt_bt == 8 || g_mt_bt == 16 || g_mt_bt == 32 || g_mt_bt == 64) return g_mt_bt;
  const double per = E1 > 1 ? (double)T * (n_slots - 1) / (E1 - 1) : (double)T * n_slots; /* routed slots an expert */
  return per <= 8 ? 8 : per <= 16 ? 16 : per <= 32 ? 32 : 64;
}

extern "C" int di_v4k_mx_tc_ok(di_cuk_mxfp4w w1, di_cuk_mxfp4w w3, di_cuk_mxfp4w w2, int D, int I) {
  const di_cuk_mxfp4w *w[3] = {&w1, &w3, &w2};
  if (D <= 0 || I <= 0 || D % 32 || I % 32) return 0;
  for (int i = 0; i < 3; i++)
    if (w[i]->lds % 4 || w[i]->ldq % 16 || (uintptr_t)w[i]->q % 16 || (uintptr_t)w[i]->scale % 4 ||
        w[i]->lds < (i < 2 ? D : I) / 32)
      return 0;
  return 1;
}

extern "C" int di_v4k_mx_tc_max_tiles(int T, int n_slots, int E1, int bt) {
  const int n = T * n_slots;
  return n / bt + (E1 < n ? E1 : n) + 1;
}

static size_t mt_align(size_t b) { return (b + 255) / 256 * 256; }

extern "C" size_t di_v4k_mx_tc_ws_bytes(int T, int n_slots, int D, int I, int E1) {
  return mt_align((size_t)T * D * 2) + mt_align((size_t)T * n_slots * I * 2) +
         mt_align(4 * (1 + 3 * (size_t)di_v4k_mx_tc_max_tiles(T, n_slots, E1, 8)));
}

extern "C" di_status di_v4k_mx_tc_acts(const float *x, int n, uint16_t *xb, di_cu_stream s) {
  if (n <= 0) return DI_OK;
  if (n % 8 || (uintptr_t)x % 16 || (uintptr_t)xb % 16)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda v4: activations to bf16 of %d values (a multiple of 8, aligned)", n);
  mx_tc_acts_k<<<(n / 8 + 255) / 256, 256, 0, s>>>((const float4 *)x, n / 8, (uint4 *)xb, g_mt_form != 0);
  V4_LAUNCH("mx_tc_acts");
  return DI_OK;
}

extern "C" di_status di_v4k_mx_tc_tiles(const int32_t *tiles8, int T, int n_slots, int E1, int e_skip, int bt,
                                        int32_t *work, di_cu_stream s) {
  if (E1 > MT_MAXE) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: %d experts (at most %d)", E1 - 1, MT_MAXE - 1);
  if (bt != 8 && bt != 16 && bt != 32 && bt != 64)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda v4: MXFP4 tensor-core tiles of %d slots (8, 16, 32 or 64)", bt);
  if (T <= 0) return DI_OK;
  mx_tc_tiles_k<<<1, 1024, 0, s>>>(tiles8, E1, e_skip, bt, di_v4k_mx_tc_max_tiles(T, n_slots, E1, bt), work);
  V4_LAUNCH("mx_tc_tiles");
  return DI_OK;
}

template <int BT, bool UP, int FORM>
static di_status mt_launch1(dim3 grid, cudaStream_t s, const bf16 *X, const int32_t *perm, const int32_t *tiles, int ns,
                            di_cuk_mxfp4w wa, di_cuk_mxfp4w wb, int N, int K, float lim, void *out) {
  static int attr_set = 0; /* (set once per kernel; not thread-safe, like the backend's other one-time setup) */
  const size_t smem = sizeof(mt_smem<BT>);
  if (!attr_set) {
    DI_CU(cudaFuncSetAttribute(mx_tc_k<BT, UP, FORM>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    attr_set = 1;
  }
  mx_tc_k<BT, UP, FORM><<<grid, MT_WARPS * 32, smem, s>>>(X, perm, tiles, ns, wa, wb, N, K, lim, out);
  V4_LAUNCH(UP ? "mx_tc_up" : "mx_tc_down");
  return DI_OK;
}
template <int BT, bool UP>
static di_status mt_launch(dim3 grid, cudaStream_t s, const bf16 *X, const int32_t *perm, const int32_t *tiles, int ns,
                           di_cuk_mxfp4w wa, di_cuk_mxfp4w wb, int N, int K, float lim, void *out) {
  return g_mt_form ? mt_launch1<BT, UP, 1>(grid, s, X, perm, tiles, ns, wa, wb, N, K, lim, out)
                   : mt_launch1<BT, UP, 0>(grid, s, X, perm, tiles, ns, wa, wb, N, K, lim, out);
}

template <bool UP>
static di_status mt_product(int bt, int max_tiles, cudaStream_t s, const bf16 *X, const int32_t *perm, const int32_t *tiles,
                            int ns, di_cuk_mxfp4w wa, di_cuk_mxfp4w wb, int N, int K, float lim, void *out) {
  if (max_tiles <= 0) return DI_OK;
  if (max_tiles > 65535) return di_error_set(DI_ERR_UNSUPPORTED, "cuda v4: %d MXFP4 tensor-core tiles at once", max_tiles);
  if (K % 32 || N <= 0 || wa.lds % 4 || wb.lds % 4 || ((uintptr_t)X & 15))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda v4: MXFP4 tensor-core product N %d K %d lds %d (K %% 32, lds %% 4)", N, K,
                        wa.lds);
  const dim3 grid((N + (UP ? MT_ROWS / 2 : MT_ROWS) - 1) / (UP ? MT_ROWS / 2 : MT_ROWS), max_tiles);
  switch (bt) {
  case 8: return mt_launch<8, UP>(grid, s, X, perm, tiles, ns, wa, wb, N, K, lim, out);
  case 16: return mt_launch<16, UP>(grid, s, X, perm, tiles, ns, wa, wb, N, K, lim, out);
  case 32: return mt_launch<32, UP>(grid, s, X, perm, tiles, ns, wa, wb, N, K, lim, out);
  case 64: return mt_launch<64, UP>(grid, s, X, perm, tiles, ns, wa, wb, N, K, lim, out);
  }
  return di_error_set(DI_ERR_INVALID_ARG, "cuda v4: MXFP4 tensor-core tiles of %d slots (8, 16, 32 or 64)", bt);
}

extern "C" di_status di_v4k_mx_tc_up(const uint16_t *xb, const int32_t *perm, const int32_t *tiles, int max_tiles, int bt,
                                     di_cuk_mxfp4w w1, di_cuk_mxfp4w w3, int T, int n_slots, int D, int I, float limit,
                                     uint16_t *act, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  return mt_product<true>(bt, max_tiles, s, (const bf16 *)xb, perm, tiles, n_slots, w1, w3, I, D, limit, act);
}

extern "C" di_status di_v4k_mx_tc_down(const uint16_t *act, const int32_t *perm, const int32_t *tiles, int max_tiles, int bt,
                                       di_cuk_mxfp4w w2, int T, int n_slots, int D, int I, float *y, di_cu_stream s) {
  if (T <= 0) return DI_OK;
  return mt_product<false>(bt, max_tiles, s, (const bf16 *)act, perm, tiles, n_slots, w2, w2, D, I, 0.f, y);
}

extern "C" di_status di_v4k_experts_mx_tc(const float *x, const int32_t *ids, const int32_t *tiles8, int E1, di_cuk_mxfp4w w1,
                                          di_cuk_mxfp4w w3, di_cuk_mxfp4w w2, int T, int n_slots, int D, int I, float limit,
                                          void *ws, float *y, di_cu_stream s) {
  (void)ids;
  if (T <= 0) return DI_OK;
  if (!tiles8) return di_error_set(DI_ERR_INVALID_ARG, "cuda v4: the MXFP4 tensor-core experts need the step's tiles");
  const int bt = di_v4k_mx_tc_pick_tile(T, n_slots, E1), mt = di_v4k_mx_tc_max_tiles(T, n_slots, E1, bt);
  uint8_t *p = (uint8_t *)ws;
  uint16_t *xb = (uint16_t *)p, *act = (uint16_t *)(p + mt_align((size_t)T * D * 2));
  int32_t *tiles = (int32_t *)(p + mt_align((size_t)T * D * 2) + mt_align((size_t)T * n_slots * I * 2));
  const int32_t *perm = tiles8 + 1 + 3 * (size_t)di_v4k_expert_max_tiles(T, n_slots, E1);
  DI_TRY(di_v4k_mx_tc_acts(x, T * D, xb, s));
  DI_TRY(di_v4k_mx_tc_tiles(tiles8, T, n_slots, E1, E1 - 1, bt, tiles, s));
  DI_TRY(di_v4k_mx_tc_up(xb, perm, tiles, mt, bt, w1, w3, T, n_slots, D, I, limit, act, s));
  return di_v4k_mx_tc_down(act, perm, tiles, mt, bt, w2, T, n_slots, D, I, y, s);
}
