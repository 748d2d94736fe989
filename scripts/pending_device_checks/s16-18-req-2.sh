# s16-18 req-2 (session 16; binaries of main since the s16-18 merge, built by scripts/device_tests.sh --build:
# bench_cuda_decode, test_cuda_kernels, test_cuda_model; no model; ~60 s): DEEPINFER_CUDA_SKINNY_ROWS (the persistent
# skinny GEMM of the one-row lm_head; same bits; off by default) end to end in a clean process, alternating with the
# default in one process (req-1 measured it only after the removed evict_last prefetch had slowed every step:
# 2.004 vs 2.011 ms graph; its kernel 109.0 vs 114.6 us), its bit / float64 checks, and the fixtures with it on.
set -u
export DEEPINFER_CUDA_GPU_TIME=1
step() { # name timeout cmd...
  local n="$1" t="$2"; shift 2
  local s=$SECONDS
  timeout "$t" "$@" > "$LOG/$n.log" 2>&1
  echo "=== $n: exit $? in $((SECONDS - s)) s"
}
step bench 40 "$BIN/bench_cuda_decode" bench/configs/v2-lite.json --quantization fp8 --batches 1 --prefill 0 --prompt 512 \
  --gen 64 --reps 5 --skinny-rows 0,16384
sed -n '/^median of/,/^$/p' "$LOG/bench.log"
grep -E '^--- |graph [0-9.]* ms' "$LOG/bench.log" | grep -oE 'SKINNY_ROWS=[0-9]+|graph [0-9.]+' | paste -sd' '
step rows 25 "$BIN/test_cuda_kernels" --rows-only
grep -E '^time gemm|passed' "$LOG/rows.log"
step model 40 env DEEPINFER_CUDA_SKINNY_ROWS=1 "$BIN/test_cuda_model"
tail -1 "$LOG/model.log" # (2 failures expected without models/default)
