# s14-19 req-1 (= s13-19 req-4, adapted to session 14's queue): binaries of 61fc3c6 (main + 47e677e: the
# CUDA-core decode attention's key tiles loaded a row per NT/32 threads) and *_v6 (6a7460a: + 11ee580,
# k_mla_fixed_tc.cu v6, each warpgroup runs both S chains). A/B: MAINBIN (main, old loader, v5).
set -u
cd "$DI_SOURCE_DIR"
B="$BIN"
export LD_LIBRARY_PATH="$B:${LD_LIBRARY_PATH:-}"
declare -A RC
NAMES="attn_fixed attn_fixed_v6 attn_bench attn_bench_v6 attn_bench_main kernels_attn invariance invariance_tc2 invariance_kv8 engine_inv bench bench_main bench_v6 ncu_v6"
summary() {
  echo "---- summary"
  for n in $NAMES; do echo "$n: ${RC[$n]:-not run}"; done
  grep -H "passed, .* failed" "$LOG"/attn_fixed*.log "$LOG"/kernels_attn.log "$LOG"/invariance*.log "$LOG"/engine_inv.log 2>/dev/null
  grep -H "H=16 prompt  4096" "$LOG"/attn_bench*.log 2>/dev/null
  grep -H "invariant / default" "$LOG"/bench*.log 2>/dev/null
}
trap 'echo "(interrupted)"; summary; exit 130' INT TERM
step() { local n="$1" t="$2"; shift 2; local s=$SECONDS; timeout "$t" "$@" > "$LOG/$n.log" 2>&1; RC[$n]="$? ($((SECONDS - s)) s)"; echo "=== $n: ${RC[$n]}"; tail -n 3 "$LOG/$n.log"; }
step attn_fixed 45 "$B/test_cuda_attn_fixed"
step attn_fixed_v6 45 "$B/test_cuda_attn_fixed_v6"
step attn_bench 25 "$B/test_cuda_attn_fixed" --bench
step attn_bench_v6 25 "$B/test_cuda_attn_fixed_v6" --bench
[ -x "${MAINBIN:-}/test_cuda_attn_fixed" ] && step attn_bench_main 25 "$MAINBIN/test_cuda_attn_fixed" --bench
step kernels_attn 40 "$B/test_cuda_kernels" --attn-only
step invariance 40 "$B/test_cuda_invariance"
step invariance_tc2 30 env DEEPINFER_CUDA_MLA_FIXED_TC=2 "$B/test_cuda_invariance"
step invariance_kv8 30 "$B/test_cuda_invariance" --kv8
step engine_inv 50 "$B/test_cuda_engine" --invariant-only
step bench 90 "$B/bench_cuda_decode" bench/configs/v2-lite.json --modes default,invariant --batches 1,16,64,256 --prefill 512,4096,16384 --reps 3
[ -x "${MAINBIN:-}/bench_cuda_decode" ] && step bench_main 40 "$MAINBIN/bench_cuda_decode" bench/configs/v2-lite.json --modes default,invariant --batches 1,16,64,256 --prefill 0 --reps 3
step bench_v6 40 "$B/bench_cuda_decode_v6" bench/configs/v2-lite.json --modes default,invariant --batches 1 --gen 16 --prefill 4096,16384 --reps 3
if command -v ncu >/dev/null; then
  # the report stays in /tmp (not in LOG); only the text of its details page comes back
  step ncu_v6 40 sh -c "ncu --clock-control none --set full --import-source no -k regex:mla_fixed_tc_kernel --launch-skip 7 --launch-count 1 -f -o /tmp/s14_19_v6 '$B/test_cuda_attn_fixed_v6' --bench >/dev/null 2>&1; ncu --import /tmp/s14_19_v6.ncu-rep --page details; rm -f /tmp/s14_19_v6.ncu-rep"
fi
trap - INT TERM
summary
