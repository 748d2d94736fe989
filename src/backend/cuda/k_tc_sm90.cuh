/* Hopper primitives of the TMA wgmma GEMMs (k_tc_tma.cuh for the dense products, k_tc_grouped.cu for
 * the experts; the wgmma fence/commit/wait of k_tc_wgmma.cuh too): shared-memory descriptors of the
 * 128-byte swizzle, mbarriers, the TMA tile load, the m64n128k16 bf16 wgmma, and on the host the tensor
 * map of a [batch][rows][K] bf16 operand (cuTensorMapEncodeTiled through the runtime's driver entry
 * point: nothing new to link). */
#ifndef DI_K_TC_SM90_CUH
#define DI_K_TC_SM90_CUH
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include <cuda.h> /* CUtensorMap and its enums only: the encoder comes through the runtime's entry point */

static __device__ __forceinline__ uint32_t tt_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* K-major operand of 64-wide k rows (128 B) in the 128-byte swizzle: 8-row atoms of 1024 B */
static __device__ __forceinline__ uint64_t tt_desc(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

static __device__ __forceinline__ void tt_bar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void tt_bar_expect(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void tt_bar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void tt_bar_wait(uint32_t bar, int parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
/* one box of the 3-D map into shared memory, completing on bar */
static __device__ __forceinline__ void tt_tma3(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2,
                                               uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
          dst),
      "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
static __device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_wait0(void) { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
static __device__ __forceinline__ void tt_wait1(void) { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_proxy_fence(void) { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

static __device__ __forceinline__ void tt_mma64x128(float *d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(1));
}

typedef CUresult (*tt_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static tt_encode_fn tt_encoder(void) {
  static tt_encode_fn fn;
  static int tried;
  if (!tried) {
    void *p = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = (tt_encode_fn)p;
    tried = 1;
  }
  return fn;
}

/* The 3-D map of a [batch][rows][K] operand (row stride ld, head stride sb elements) in boxes of 64 k x
 * box_rows rows, 128-byte swizzle, zero fill outside; *zrow: coordinates (k, head, row) (sb < ld). */
static di_status tt_map(CUtensorMap *map, const bf16 *base, int K, int rows, int batch, int ld, int64_t sb,
                        int box_rows, int *zrow) {
  const tt_encode_fn enc = tt_encoder();
  if (!enc) return di_error_set(DI_ERR_BACKEND, "cuda: cuTensorMapEncodeTiled not available from the driver");
  *zrow = batch > 1 && sb < ld;
  const cuuint64_t rs = (cuuint64_t)ld * 2, zs = batch > 1 ? (cuuint64_t)sb * 2 : rs * rows;
  const cuuint64_t dims[3] = {(cuuint64_t)K, (cuuint64_t)(*zrow ? batch : rows), (cuuint64_t)(*zrow ? rows : batch)};
  const cuuint64_t strides[2] = {*zrow ? zs : rs, *zrow ? rs : zs};
  const cuuint32_t box[3] = {64 /* one 128-byte swizzle row */, (cuuint32_t)(*zrow ? 1 : box_rows), (cuuint32_t)(*zrow ? box_rows : 1)};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return di_error_set(DI_ERR_BACKEND, "cuda: cuTensorMapEncodeTiled (%d x %d x %d, ld %d, head stride %lld) failed: %d",
                        batch, rows, K, ld, (long long)sb, (int)r);
  return DI_OK;
}

static int tt_sm_count(void) {
  static int n;
  if (!n) {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    n = v > 0 ? v : 1;
  }
  return n;
}

#endif
