# s14-22 req-2 (binaries of COMMIT): DSpark on CUDA, batch 16 / 64 / 256 against plain: (a) test_dspark on CUDA
# (invariant) with the sync-free feature-log flush (DEEPINFER_DSPARK_FLUSH_ASYNC=1): its fixed configs'
# drafted / accepted counts must equal req-1's (617/358, 1990/487, 1490/469); (b) bench_dspark_host model: the
# backend's ops timed per step (where a paused schedule's step goes), flush async and sync; (c) the startup
# profile per graph bucket beside the online schedule (bench_dspark.py).
set -u
cd "$DI_SOURCE_DIR"
B="$BIN"
export LD_LIBRARY_PATH="$B:${LD_LIBRARY_PATH:-}"
declare -A RC
SB=""; command -v stdbuf >/dev/null && SB="stdbuf -oL"
step() { local n="$1" t="$2"; shift 2; local s=$SECONDS; timeout "$t" "$@" > "$LOG/$n.log" 2>&1; RC[$n]="$? ($((SECONDS - s)) s)"; echo "=== $n: ${RC[$n]}"; }
cat "$B/COMMIT"
step inv_async 25 env DEEPINFER_DSPARK_FLUSH_ASYNC=1 DEEPINFER_ACCELERATOR=cuda DEEPINFER_BATCH_INVARIANT=1 $SB "$B/test_dspark"
step split_async 22 env DEEPINFER_DSPARK_FLUSH_ASYNC=1 $SB "$B/bench_dspark_host" model models/default cuda 16,64,256 200
step split_sync 12 env DEEPINFER_DSPARK_FLUSH_ASYNC=0 $SB "$B/bench_dspark_host" model models/default cuda 64,256 200
export DEEPINFER_LIB="$B/libdeepinfer.so" PYTHONPATH="$B/tree/python"
step bench 20 env DEEPINFER_DSPARK_FLUSH_ASYNC=1 python3 "$B/tree/bench/bench_dspark.py" --accelerator cuda --batches 16,64,256 --temperatures 0 --tokens 128 --num-kv-blocks 4096 --configs "plain,dspark scheduled k=5,dspark scheduled k=5 startup"
echo "---- split (seqs | config | tok/s | wall | host | submit | wait | sample | async | fetch)"
grep -h "^| [0-9]" "$LOG/split_async.log" "$LOG/split_sync.log" | cut -d'|' -f2-11 | sed 's/dspark scheduled/ds/; s/, startup profile/+st/'
echo "---- bench"
grep "^| [0-9]" "$LOG/bench.log" | cut -d'|' -f2,4,5,6,11,12
echo "---- summary"
grep -h "budget 0 blocks 0:\|budget 16\|blocks 6:" "$LOG/inv_async.log" | sed 's/, mean.*proposals/ props/' | cut -c1-150
grep -h "passed, .* failed" "$LOG"/*.log
for n in inv_async split_async split_sync bench; do echo "$n: ${RC[$n]:-not run}"; done
