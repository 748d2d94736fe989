# CPU-BENCH (the last step benchmarks DSpark on the host's CPU cores)
# s13-22 req-3 (binaries of COMMIT): the greedy rounds in two kernels (vocabulary over 64 CTAs); tests, CUDA bench with proposals in the graph, CPU bench.
set -u
cd "$DI_SOURCE_DIR"
B="$BIN"
export LD_LIBRARY_PATH="$B:${LD_LIBRARY_PATH:-}"
declare -A RC
SB=""; command -v stdbuf >/dev/null && SB="stdbuf -oL"
step() { local n="$1" t="$2"; shift 2; local s=$SECONDS; timeout "$t" "$@" > "$LOG/$n.log" 2>&1; RC[$n]="$? ($((SECONDS - s)) s)"; echo "=== $n: ${RC[$n]}"; tail -n 8 "$LOG/$n.log"; }
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv,noheader
cat "$B/COMMIT"; nproc
step cuda_dspark 30 "$B/test_cuda_dspark"
step dspark_cuda_inv 60 env DEEPINFER_ACCELERATOR=cuda DEEPINFER_BATCH_INVARIANT=1 $SB "$B/test_dspark"
step engine_dspark 60 $SB "$B/test_cuda_engine" --dspark
export DEEPINFER_LIB="$B/libdeepinfer.so" PYTHONPATH="$B/tree/python"
step bench 60 python3 "$B/tree/bench/bench_dspark.py" --accelerator cuda --batches 1,16,64,256 --temperatures 0 --tokens 128 --num-kv-blocks 4096
step bench_cpu 100 python3 "$B/tree/bench/bench_dspark.py" --batches 1,16,64,256 --temperatures 0 --tokens 64 --threads 16 --quick --num-kv-blocks 2048
echo "---- summary"
for n in cuda_dspark dspark_cuda_inv engine_dspark bench bench_cpu; do echo "$n: ${RC[$n]:-not run}"; done
grep -h "passed, .* failed" "$LOG"/*.log
grep -h "greedy drafts on the device" "$LOG/cuda_dspark.log"
grep "^| [0-9]" "$LOG/bench.log" "$LOG/bench_cpu.log" | cut -c1-170
