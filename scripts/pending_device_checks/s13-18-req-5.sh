# s13-18 req-5 (issue 18): final A/B, 3 alternating bf16 / FP8 runs (FP8: tcg from 4 tokens, 64-row tiles), V3 layer, FP8 model agreement
# binaries of a75feb7
set -u
cd "$DI_SOURCE_DIR"
B="$BIN"
export LD_LIBRARY_PATH="$B:${LD_LIBRARY_PATH:-}"
export DEEPINFER_CUDA_GPU_TIME=1
declare -A RC
step() { local n="$1" t="$2"; shift 2; local s=$SECONDS; timeout "$t" "$@" > "$LOG/$n.log" 2>&1; RC[$n]="$? ($((SECONDS - s)) s)"; echo "=== $n: ${RC[$n]}"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
step model_fp8 40 env DEEPINFER_CUDA_FP8=1 "$B/test_cuda_model"
step fp8_checks 40 "$B/test_cuda_fp8" --gmma-only --no-timings
V2="bench/configs/v2-lite.json --prompt 512 --gen 64 --batches 1,2,4,8,16,64,256 --prefill 512,4096"
for r in 1 2 3; do
  step bf16_$r 45 "$B/bench_cuda_decode" $V2
  step fp8_$r 45 env DEEPINFER_CUDA_FP8=1 "$B/bench_cuda_decode" $V2 --quantization fp8
done
step fp8_min2 30 env DEEPINFER_CUDA_FP8=1 DEEPINFER_CUDA_FP8_GMMA_MIN_T=2 "$B/bench_cuda_decode" bench/configs/v2-lite.json --quantization fp8 --prompt 512 --gen 64 --batches 2,3,4 --prefill 0
V3="$B/tree/bench/configs/v3-layer.json --prompt 512 --gen 64 --batches 1,4,16,64,256 --prefill 512,4096"
step v3_fp8 30 env DEEPINFER_CUDA_FP8=1 "$B/bench_cuda_decode" $V3 --quantization fp8
step v3_bf16 30 "$B/bench_cuda_decode" $V3
echo "---- summary"
for n in model_fp8 fp8_checks; do echo "$n: ${RC[$n]:-not run}"; done
grep -h "passed, .* failed" "$LOG/model_fp8.log" "$LOG/fp8_checks.log"
for n in bf16_1 fp8_1 bf16_2 fp8_2 bf16_3 fp8_3 fp8_min2 v3_fp8 v3_bf16; do echo -n "$n ${RC[$n]:-not run}:"; grep -E "^(1|2|3|4|8|16|64|256|512|4096) " "$LOG/$n.log" | awk '{printf " %s:%s", $1, $2}'; echo; done
