# s14-19 req-2: the fixed-split decode form with key tiles in flight (DEEPINFER_CUDA_ATTN_FIXED_DEPTH) and the
# merge in the attention kernel (DEEPINFER_CUDA_ATTN_FIXED_FUSE): bit-identity (kernel test, invariance,
# engine) with both on, kernel and model benches with them off / on; the per-head MLA GEMMs (absorb, W_UV)
# invariant vs default; the invariant mode at splits of 256 / 128 keys (batch 1, prefill 4,096).
# Binaries of 274ad9e (main + 47e677e, v5 tensor-core kernel, the two switches off by default).
set -u
cd "$DI_SOURCE_DIR"
B="$BIN"
export LD_LIBRARY_PATH="$B:${LD_LIBRARY_PATH:-}"
declare -A RC
NAMES="attn_fixed attn_bench invariance_dec invariance_dec_kv8 engine_dec tc_mla bench_base bench_dec bench_fuse bench_split"
summary() {
  echo "---- summary"
  for n in $NAMES; do echo "$n: ${RC[$n]:-not run}"; done
  grep -H "passed, .* failed" "$LOG"/*.log 2>/dev/null
  grep -h "bench decode\|H=16 prompt  4096" "$LOG/attn_bench.log" 2>/dev/null | cut -c1-400
  grep -h "^mla " "$LOG/tc_mla.log" 2>/dev/null
  grep -H "invariant / default\|^invariant  *attn" "$LOG"/bench_*.log 2>/dev/null
}
trap 'echo "(interrupted)"; summary; exit 130' INT TERM
step() { local n="$1" t="$2"; shift 2; local s=$SECONDS; timeout "$t" "$@" > "$LOG/$n.log" 2>&1; RC[$n]="$? ($((SECONDS - s)) s)"; echo "=== $n: ${RC[$n]}"; tail -n 2 "$LOG/$n.log" | cut -c1-300; }
ON="DEEPINFER_CUDA_ATTN_FIXED_DEPTH=4 DEEPINFER_CUDA_ATTN_FIXED_FUSE=1"
BD="bench/configs/v2-lite.json --modes default,invariant --batches 1,16,64 --prefill 0 --reps 3"
step attn_fixed 45 "$B/test_cuda_attn_fixed"
step attn_bench 20 "$B/test_cuda_attn_fixed" --bench
step invariance_dec 15 env $ON "$B/test_cuda_invariance"
step invariance_dec_kv8 15 env $ON "$B/test_cuda_invariance" --kv8
step engine_dec 15 env $ON "$B/test_cuda_engine" --invariant-only
step tc_mla 15 "$B/test_cuda_tc_gemm" --bench-mla
step bench_base 40 "$B/bench_cuda_decode" $BD
step bench_dec 40 env $ON "$B/bench_cuda_decode" $BD
step bench_fuse 40 env DEEPINFER_CUDA_ATTN_FIXED_FUSE=1 "$B/bench_cuda_decode" $BD
step bench_split 30 env $ON "$B/bench_cuda_decode" bench/configs/v2-lite.json --modes invariant --attn-fixed 256,128 --batches 1 --prefill 4096 --reps 3
trap - INT TERM
summary
