# s14-19 req-3 (17:15 batch; read after the session by the lead / the next session): the final branch's
# binaries: DEEPINFER_CUDA_ABSORB_NK=1 (the invariant absorption on W_UK [N][K] copies, the hybrid core):
# test_cuda_tc_gemm on the hybrid core (the [N][K] absorb shape, both forms bit-identical),
# invariance and engine with it on, --bench-mla, the prefill bench with it off / on; and the final bench.
set -u
cd "$DI_SOURCE_DIR"
B="$BIN"
export LD_LIBRARY_PATH="$B:${LD_LIBRARY_PATH:-}"
declare -A RC
NAMES="tc_gemm_hybrid invariance_nk engine_nk tc_mla bench_final bench_nk"
summary() {
  echo "---- summary"
  for n in $NAMES; do echo "$n: ${RC[$n]:-not run}"; done
  grep -H "passed, .* failed" "$LOG"/*.log 2>/dev/null
  grep -h "absorb \[" "$LOG"/tc_gemm_hybrid.log 2>/dev/null | head -n 8
  grep -h "^mla " "$LOG/tc_mla.log" 2>/dev/null
  grep -H "invariant / default" "$LOG"/bench_*.log 2>/dev/null
}
trap 'echo "(interrupted)"; summary; exit 130' INT TERM
step() { local n="$1" t="$2"; shift 2; local s=$SECONDS; timeout "$t" "$@" > "$LOG/$n.log" 2>&1; RC[$n]="$? ($((SECONDS - s)) s)"; echo "=== $n: ${RC[$n]}"; tail -n 2 "$LOG/$n.log" | cut -c1-300; }
step tc_gemm_hybrid 35 "$B/test_cuda_tc_gemm" --core hybrid

step invariance_nk 15 env DEEPINFER_CUDA_ABSORB_NK=1 "$B/test_cuda_invariance"
step engine_nk 15 env DEEPINFER_CUDA_ABSORB_NK=1 "$B/test_cuda_engine" --invariant-only
step tc_mla 15 "$B/test_cuda_tc_gemm" --bench-mla
step bench_final 90 "$B/bench_cuda_decode" bench/configs/v2-lite.json --modes default,invariant --batches 1,16,64,256 --prefill 512,4096,16384 --reps 3
step bench_nk 30 env DEEPINFER_CUDA_ABSORB_NK=1 "$B/bench_cuda_decode" bench/configs/v2-lite.json --modes default,invariant --batches 1 --gen 16 --prefill 512,4096,16384 --reps 3
trap - INT TERM
summary
