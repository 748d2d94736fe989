/* The decode-sized form of the invariant tensor-core GEMM (included by k_tc_gemm.cu; the "gemv" core:
 * DEEPINFER_CUDA_TC_CORE=gemv, products of up to TC_HYBRID_MMA_M rows, W [N][K]). It computes the very
 * chains of the tile kernels (so, with the cores' k16 steps bit-equal, the same bits): per output element
 * one mma.sync m16n8k16 chain per split over k = split begin .. split end (whole 64-wide k tiles, steps
 * past K on zeros as the tiles' zero fill gives), the splits tc_splits(N, K) added in split order onto a
 * zero total (S = 1: the chain itself), then tc_store. Bandwidth-oriented: no shared-memory staging; a
 * warp owns one split of 8 output columns and loads its mma fragments straight from global memory (W
 * rows n: two 4-byte words per lane per k16 step, a whole 32-byte sector per row; X rows from L1/L2),
 * S x (8 / S) warps per CTA, the split partials added in shared memory in split order. */
#ifndef DI_K_TC_GEMV_CUH
#define DI_K_TC_GEMV_CUH

static __device__ __forceinline__ uint32_t tcv_ld32(const bf16 *p) { return __ldg((const unsigned int *)p); }

static __global__ void __launch_bounds__(256) tc_gemv_kernel(const tc_args a, int nb8) {
  __shared__ float part[8][16][8]; /* [warp = block * S + split][row][column] */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, S = a.S, z = blockIdx.z;
  const int sp = warp % S, j = warp / S, nk = (a.K + TC_BK - 1) / TC_BK;
  const int g = lane >> 2, kq = (lane & 3) * 2, n = (blockIdx.x * nb8 + j) * 8 + g;
  const int k_begin = tc_split_begin(sp, S, nk) * TC_BK, k_end = tc_split_begin(sp + 1, S, nk) * TC_BK;
  const bf16 *X = a.X + a.sx * z, *wr = a.W + a.sw * z + (int64_t)(n < a.N ? n : 0) * a.ldw;
  const bf16 *x0 = X + (int64_t)(g < a.M ? g : 0) * a.ldx, *x1 = X + (int64_t)(g + 8 < a.M ? g + 8 : 0) * a.ldx;
  const bool nok = n < a.N, r0 = g < a.M, r1 = g + 8 < a.M;
  DI_PDL_ENTRY();
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
  for (int k = k_begin; k < k_end; k += 16) {
    const int ka = k + kq, kb = ka + 8;
    uint32_t b[2], af[4];
    b[0] = nok && ka < a.K ? tcv_ld32(wr + ka) : 0u;
    b[1] = nok && kb < a.K ? tcv_ld32(wr + kb) : 0u;
    af[0] = r0 && ka < a.K ? tcv_ld32(x0 + ka) : 0u;
    af[1] = r1 && ka < a.K ? tcv_ld32(x1 + ka) : 0u;
    af[2] = r0 && kb < a.K ? tcv_ld32(x0 + kb) : 0u;
    af[3] = r1 && kb < a.K ? tcv_ld32(x1 + kb) : 0u;
    di_mma16816(acc, af, b);
  }
  /* accumulator: c0, c1 = row g, columns kq, kq + 1; c2, c3 = row g + 8 */
  part[warp][g][kq] = acc[0];
  part[warp][g][kq + 1] = acc[1];
  part[warp][g + 8][kq] = acc[2];
  part[warp][g + 8][kq + 1] = acc[3];
  __syncthreads();
  for (int e = threadIdx.x; e < nb8 * 128; e += blockDim.x) {
    const int jj = e >> 7, m = (e >> 3) & 15, c = e & 7, nn = (blockIdx.x * nb8 + jj) * 8 + c;
    if (m >= a.M || nn >= a.N) continue;
    float v;
    if (S == 1) v = part[jj][m][c];
    else {
      v = 0.f;
      for (int q = 0; q < S; q++) v = __fadd_rn(v, part[jj * S + q][m][c]);
    }
    tc_store(a, z, m, nn, v);
  }
}

static di_status tcv_launch(const tc_args &a, int batch, cudaStream_t s) {
  const int nb8 = a.S >= 8 ? 1 : 8 / a.S;
  const dim3 grid((a.N + 8 * nb8 - 1) / (8 * nb8), 1, batch);
  DI_CU(di_launch(tc_gemv_kernel, grid, 32 * a.S * nb8, 0, s, a, nb8));
  return DI_OK;
}
#endif
