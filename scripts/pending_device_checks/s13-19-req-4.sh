# s13-19 req-4: binaries of 47e677e (v5 tensor-core attention; CUDA-core decode kernel's key loads a row per NT/32 threads) + *_v6 (k_mla_fixed_tc.cu v6, uncommitted: each warpgroup runs both S chains, no score exchange)
set -u
cd "$DI_SOURCE_DIR"
B="$BIN/cudabin"
export LD_LIBRARY_PATH="$B:${LD_LIBRARY_PATH:-}"
declare -A RC
step() { local n="$1" t="$2"; shift 2; local s=$SECONDS; timeout "$t" "$@" > "$LOG/$n.log" 2>&1; RC[$n]="$? ($((SECONDS - s)) s)"; echo "=== $n: ${RC[$n]}"; tail -n 3 "$LOG/$n.log"; }
step attn_fixed 90 "$B/test_cuda_attn_fixed"
step attn_fixed_v6 90 "$B/test_cuda_attn_fixed_v6"
step attn_bench_v6 60 "$B/test_cuda_attn_fixed_v6" --bench
step kernels_attn 90 "$B/test_cuda_kernels" --attn-only
step invariance 60 "$B/test_cuda_invariance"
step invariance_tc2 60 env DEEPINFER_CUDA_MLA_FIXED_TC=2 "$B/test_cuda_invariance"
step invariance_kv8 60 "$B/test_cuda_invariance" --kv8
step engine_inv 90 "$B/test_cuda_engine" --invariant-only
step bench 150 "$B/bench_cuda_decode" bench/configs/v2-lite.json --modes default,invariant --batches 1,16,64,256 --prefill 512,4096,16384 --reps 3
step bench_v6 90 "$B/bench_cuda_decode_v6" bench/configs/v2-lite.json --modes default,invariant --batches 1 --gen 16 --prefill 4096,16384 --reps 3
if command -v ncu >/dev/null; then
step ncu_v6 60 ncu --clock-control none --set full --import-source no -k regex:mla_fixed_tc_kernel --launch-skip 7 --launch-count 1 -o "$LOG/v6" "$B/test_cuda_attn_fixed_v6" --bench
step ncu_v6_details 30 ncu --import "$LOG/v6.ncu-rep" --page details
step ncu_v6_source 30 ncu --import "$LOG/v6.ncu-rep" --page source --csv --print-source sass
rm -f "$LOG/v6.ncu-rep"
fi
echo "---- summary"
for n in attn_fixed attn_fixed_v6 attn_bench_v6 kernels_attn invariance invariance_tc2 invariance_kv8 engine_inv bench bench_v6 ncu_v6 ncu_v6_details ncu_v6_source; do echo "$n: ${RC[$n]:-not run}"; done
grep -h "passed, .* failed" "$LOG"/*.log
grep -h "bench attention H=16 prompt  4096" "$LOG/attn_bench_v6.log" | head -1
grep -h "invariant / default" "$LOG/bench.log" "$LOG/bench_v6.log"
