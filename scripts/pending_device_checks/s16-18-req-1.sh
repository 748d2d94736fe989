#!/bin/bash
# s16-18 req-1 (session 16; binaries: bench_cuda_decode, test_cuda_fp8, test_cuda_kernels, test_cuda_model of branch
# s16-18 or of main after its merge, all built by scripts/device_tests.sh --build; no model): V2-Lite FP8 batch-1 decode
# with three same-bits switches, all off by default (DEEPINFER_CUDA_FP8_PF_DOWN, DEEPINFER_CUDA_SKINNY_ROWS,
# DEEPINFER_CUDA_FP8_GV16=3), A/B'd in one process (the 0:0 setting is the default path), optionally against MAINBIN
# (a main without them) in the same run, and the checks of what they touch. The most useful step first; LIMIT seconds.
set -u
export DEEPINFER_CUDA_GPU_TIME=1
S=$SECONDS
: > "$LOG/summary.txt"
sum() { echo "$@" | tee -a "$LOG/summary.txt"; } # (also to stdout: the run may be cut at its budget)
LIMIT=${S1618_LIMIT:-150} # seconds this script may use (the queue's budget: 160)
left() { echo $(( LIMIT - (SECONDS - S) )); }
tl() { local t; t=$(left); [ "$t" -gt "$1" ] && t=$1; [ "$t" -lt 1 ] && t=1; echo "$t"; } # a step's timeout, never 0
sum "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
BENCH_ARGS="bench/configs/v2-lite.json --quantization fp8 --batches 1 --prefill 0 --prompt 512 --gen 64"
# per run: the setting's label, decode tok/s, graph ms/step
runs() { awk '/^--- /{l=$0; sub(/^--- DEEPINFER_CUDA_FP8_/,"",l); sub(/ DEEPINFER_CUDA_/," ",l); sub(/, rep .*/,"",l)}
              /^1 +[0-9]/{g=""; for(i=1;i<=NF;i++) if($i=="graph") g=$(i+1); printf "[%s] %s tok/s g %s; ", l, $2, g}' "$1"; }
HAVE_MAIN=0
[ -n "${MAINBIN:-}" ] && [ -x "$MAINBIN/bench_cuda_decode" ] && HAVE_MAIN=1

# 1. the branch first (its 0:0 setting is an in-process baseline if the run is cut): 8 settings P:R[:G] alternated in
#    one process, 3 reps (0:0 runs main's kernels: the changed kernel file's PTX is main's but for one unused
#    parameter; skinny_kernel untouched)
timeout $(tl 70) "$BIN/bench_cuda_decode" $BENCH_ARGS --reps 3 --decode-opts 0:0,1:0,2:0,3:0,0:0:3,2:0:3,0:16384,3:16384:3 \
  > "$LOG/bench_branch.txt" 2>&1
sum "bench branch rc $? at $((SECONDS-S)) s"
sed -n '/^median of/,/^$/p' "$LOG/bench_branch.txt" | head -8 | tee -a "$LOG/summary.txt"
runs "$LOG/bench_branch.txt" > "$LOG/bench_branch_runs.txt"

# 2. main's batch 1 (3 reps in one process)
if [ $HAVE_MAIN = 1 ]; then
  timeout $(tl 40) "$MAINBIN/bench_cuda_decode" $BENCH_ARGS --reps 3 > "$LOG/bench_main1.txt" 2>&1
  sum "bench main #1 rc $? at $((SECONDS-S)) s: $(runs "$LOG/bench_main1.txt")"
else
  sum "MAINBIN missing: no main runs (the 0:0 setting above is the default path)"
fi

# 3. model level, every fixture with the switches on (SKINNY_ROWS=1: every default-mode skinny product on the new
#    kernel) + check_pf_down_bits (PF_DOWN 0..3 and 3 + GV16=3 decode logits bit for bit); models/default absent:
#    2 failures expected
DEEPINFER_CUDA_SKINNY_ROWS=1 DEEPINFER_CUDA_FP8_PF_DOWN=3 DEEPINFER_CUDA_FP8_GV16=3 timeout $(tl 50) "$BIN/test_cuda_model" \
  > "$LOG/model.txt" 2>&1
sum "test_cuda_model (SKINNY_ROWS=1 PF_DOWN=3 GV16=3) rc $? at $((SECONDS-S)) s: $(grep -E 'passed|failed' "$LOG/model.txt" | tail -1)"
grep -E 'PF_DOWN 1 / 2 / 3' "$LOG/model.txt" | tee -a "$LOG/summary.txt"
grep -E 'FAIL' "$LOG/model.txt" | head -3 | cut -c1-200 | tee -a "$LOG/summary.txt"

# 4. the 16-row GEMV checks (float64, the 2-row kernel's bits, the prefetch form's bits), with hash lines, beside
#    main's binary on the same inputs (both at once: correctness only)
T4=$(tl 30)
DI_TEST_HASH_FILE="$LOG/hash_branch.txt" timeout $T4 "$BIN/test_cuda_fp8" --gv16-only --no-timings > "$LOG/fp8_gv16_branch.txt" 2>&1 &
P1=$!
[ $HAVE_MAIN = 1 ] && DI_TEST_HASH_FILE="$LOG/hash_main.txt" timeout $T4 "$MAINBIN/test_cuda_fp8" --gv16-only --no-timings \
  > "$LOG/fp8_gv16_main.txt" 2>&1
wait $P1
sum "test_cuda_fp8 --gv16-only (branch) rc $? at $((SECONDS-S)) s: $(tail -1 "$LOG/fp8_gv16_branch.txt")"
grep -E 'FAIL' "$LOG/fp8_gv16_branch.txt" | head -3 | cut -c1-200 | tee -a "$LOG/summary.txt"
if [ -s "$LOG/hash_main.txt" ] && [ -s "$LOG/hash_branch.txt" ]; then
  n=$(wc -l < "$LOG/hash_main.txt"); nb=$(wc -l < "$LOG/hash_branch.txt"); c=$(( n < nb ? n : nb ))
  if cmp -s <(head -n $c "$LOG/hash_main.txt") <(head -n $c "$LOG/hash_branch.txt"); then m=identical; else m=DIFFER; fi
  sum "hashes: main $n lines, branch $nb, the first $c $m"
else
  sum "hashes missing"
fi

# 5. the persistent skinny GEMM vs the skinny kernel (bits, float64, time at the lm_head shapes)
timeout $(tl 25) "$BIN/test_cuda_kernels" --rows-only > "$LOG/kernels_rows.txt" 2>&1
sum "test_cuda_kernels --rows-only rc $? at $((SECONDS-S)) s: $(grep -cE '^skinny rows' "$LOG/kernels_rows.txt") cases; $(tail -1 "$LOG/kernels_rows.txt")"
grep -E '^time gemm' "$LOG/kernels_rows.txt" | tee -a "$LOG/summary.txt"

# 6. the one-token gate/up + down + combine pair with the down prefetch (kernel timing)
timeout $(tl 20) "$BIN/test_cuda_fp8" --pf-time > "$LOG/fp8_pftime.txt" 2>&1
sum "test_cuda_fp8 --pf-time rc $? at $((SECONDS-S)) s"
grep -E 'down\+combine, ' "$LOG/fp8_pftime.txt" | cut -c40- | tee -a "$LOG/summary.txt"

# 7. main again if time is left (drift between processes)
if [ $HAVE_MAIN = 1 ] && [ $(left) -gt 35 ]; then
  timeout $(tl 60) "$MAINBIN/bench_cuda_decode" $BENCH_ARGS --reps 3 > "$LOG/bench_main2.txt" 2>&1
  sum "bench main #2 rc $? at $((SECONDS-S)) s: $(runs "$LOG/bench_main2.txt")"
fi
echo "=== s16-18 req-1 summary ($((SECONDS-S)) s)"
tail -c 1400 "$LOG/summary.txt"
