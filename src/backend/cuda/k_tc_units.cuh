/* The tile walk the persistent warp-specialized grouped GEMMs share (k_tc_grouped.cu: bf16, k_fp8_tc_grouped.cu:
 * E4M3): each CTA takes units u = blockIdx.x, + gridDim.x, .. of (entry u / nblk of the device tile list,
 * column block u % nblk); warpgroup 0 produces a ring of stages (full / empty mbarriers, the A rows gathered
 * by cp.async into the 128-byte swizzle, counted on the full barrier), two consumer warpgroups take them.
 * What the stage holds and how it is consumed stays in each kernel. Needs k_tc_sm90.cuh first. */
#ifndef DI_K_TC_UNITS_CUH
#define DI_K_TC_UNITS_CUH
#include "k_tc_sm90.cuh"

/* a unit: expert e, its rows [m0, mend) of the tile (tile = e << 16 | i: rows off[e] + i * bm ..), columns n0 .. */
struct tg_unit { int e, m0, mend, n0; };
static __device__ __forceinline__ tg_unit tg_unit_at(const int32_t *tiles, const int32_t *off, int bm, int u, int nblk,
                                                     int bn) {
  tg_unit r;
  const int tile = tiles[u / nblk];
  r.n0 = (u % nblk) * bn;
  r.e = tile >> 16;
  r.m0 = off[r.e] + (tile & 0xffff) * bm;
  r.mend = min(off[r.e + 1], r.m0 + bm);
  return r;
}

/* thread 0: full[s] (bars + 8 s) waits for the 128 producer threads' copies and thread 0's expect_tx, empty[s]
 * (bars + 8 (stages + s)) for the consumers' 8 warps */
static __device__ __forceinline__ void tg_bars_init(uint32_t bars, int stages) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; s++) {
      tt_bar_init(bars + 8 * s, 128 + 1);
      tt_bar_init(bars + 8 * (stages + s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
}

/* the producer thread t's 4 A rows (t / 8 + 16 i) of unit u: their activation row times mul, -1 absent */
static __device__ __forceinline__ void tg_src_rows(int64_t (&src)[4], int t, const tg_unit &u, int bm, const int32_t *a_rows,
                                                   int64_t mul) {
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int r = (t >> 3) + 16 * i, m = u.m0 + r;
    src[i] = r < bm && m < u.mend ? (int64_t)(a_rows ? a_rows[m] : m) * mul : -1;
  }
}

/* 16-byte chunk cc of A row r into the stage at st (128-byte swizzle: chunk c of row r at r * 128 + (c ^ r % 8) * 16);
 * p false: zeros */
static __device__ __forceinline__ void tg_cp_row16(uint32_t st, int r, int cc, const void *g, bool p) {
  const uint32_t d = st + r * 128 + ((cc ^ (r & 7)) << 4);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(g), "r"(p ? 16 : 0) : "memory");
}

/* the producer thread's copies so far arrive on bar when they land */
static __device__ __forceinline__ void tg_cp_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

template <int STAGES> static __device__ __forceinline__ void tg_next(int &stage, int &phase) {
  if (++stage == STAGES) stage = 0, phase ^= 1;
}

#endif
