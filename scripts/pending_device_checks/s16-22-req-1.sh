# s16-22 req-1 (session 16): DEEPINFER_DSPARK_FLUSH_WARM=1 (DSpark on CUDA runs one pass of the feature log's full flush
# at startup, nothing written, so the first full flush's GEMM planning is not paid while requests run; off by default,
# not yet run on a GPU). Binaries of main after the s16-22 merge: scripts/device_tests.sh --build plus the targets
# test_dspark test_cuda_dspark bench_dspark_host (build-cuda/, copied into BIN beside the others); reads models/default
# (needs the shipped model). ~70 s on one H100 / H200.
# (a) test_dspark on CUDA (invariant) with FLUSH_WARM=1: 2,964 / 0, fixed configs' drafted / accepted 617/358, 1990/487,
#     1490/469 (sessions 15 / 16), proposals in the step, none missed; test_cuda_dspark 195 / 0.
# (b) bench_dspark_host plain vs scheduled at 16 / 64 / 256 on CUDA, FLUSH_WARM 0 and 1 alternating: session 16 (s16-22
#     req-1, H200) had 0.98x / 0.93x / 0.98x with 0, the 64's gap one 3.4-3.8 ms step (the first full flush at step ~128).
#     With 1 the 64 should have no such step (max step < 1 ms) and reach ~0.99x. If so and (a) passes: flip
#     DEEPINFER_DSPARK_FLUSH_WARM's default to 1 (switches.c / switches.md).
set -u
cd "$DI_SOURCE_DIR"
B="$BIN"
export LD_LIBRARY_PATH="$B:${LD_LIBRARY_PATH:-}"
declare -A RC
SB=""; command -v stdbuf >/dev/null && SB="stdbuf -oL"
T0=$SECONDS; BUDGET=${BUDGET:-90}
# step NAME TIMEOUT MIN_LEFT cmd...: runs only if MIN_LEFT seconds of the budget are left
step() { local n="$1" t="$2" need="$3"; shift 3
  if [ $((BUDGET - (SECONDS - T0))) -lt "$need" ]; then RC[$n]="skipped (time)"; echo "=== $n: skipped"; return; fi
  local s=$SECONDS; timeout "$t" "$@" > "$LOG/$n.log" 2>&1; RC[$n]="$? ($((SECONDS - s)) s)"; echo "=== $n: ${RC[$n]}"; }
[ -f "$B/COMMIT" ] && cat "$B/COMMIT"; nvidia-smi --query-gpu=name --format=csv,noheader
M="model models/default"
step inv 40 40 env DEEPINFER_DSPARK_FLUSH_WARM=1 DEEPINFER_ACCELERATOR=cuda DEEPINFER_BATCH_INVARIANT=1 $SB "$B/test_dspark"
step cdspark 20 20 env DEEPINFER_DSPARK_FLUSH_WARM=1 $SB "$B/test_cuda_dspark"
step cuda_w0_1 10 10 env DEEPINFER_DSPARK_FLUSH_WARM=0 $SB "$B/bench_dspark_host" $M cuda 16,64,256 200
step cuda_w1_1 10 10 env DEEPINFER_DSPARK_FLUSH_WARM=1 $SB "$B/bench_dspark_host" $M cuda 16,64,256 200
step cuda_w0_2 10 10 env DEEPINFER_DSPARK_FLUSH_WARM=0 $SB "$B/bench_dspark_host" $M cuda 16,64,256 200
step cuda_w1_2 10 10 env DEEPINFER_DSPARK_FLUSH_WARM=1 $SB "$B/bench_dspark_host" $M cuda 16,64,256 200
# ratios: scheduled (online) tok/s over the mean of plain and plain again, per batch
ratio() { awk -F'|' '/^\| [0-9]/ { n=$2+0; c=$3; gsub(/^ +| +$/,"",c); t=$4+0;
  if (c=="plain" || c=="plain again") { p[n]+=t; np[n]++ } else if (c=="dspark scheduled") { s[n]=t; sm[n]=$16; lk[n]=$19 }
  else if (c=="dspark scheduled, startup profile") st[n]=t }
  END { for (n in s) if (np[n]) printf " %d: %.3fx (startup %.3fx; plain %.0f; sched median/p90/max%s; looks%s)\n", n, s[n]/(p[n]/np[n]), st[n]/(p[n]/np[n]), p[n]/np[n], sm[n], lk[n] }' "$1"; }
echo "---- scheduled / plain (tok/s)"
for n in cuda_w0_1 cuda_w1_1 cuda_w0_2 cuda_w1_2; do [ -f "$LOG/$n.log" ] && { echo "$n"; ratio "$LOG/$n.log" | sort -n; }; done
echo "---- tests"
grep -h "budget 0 blocks 0:\|budget 16\|blocks 6:" "$LOG/inv.log" | sed -E 's/.*"num_speculative_tokens": ([0-9]).* (budget [^:]*): ([0-9]+ drafted, [0-9]+ accepted).*, ([0-9]+ proposals in the step[^,;]*).*/k=\1 \2: \3, \4/'
grep -h "passed, .* failed" "$LOG/inv.log" "$LOG/cdspark.log"
for n in inv cdspark cuda_w0_1 cuda_w1_1 cuda_w0_2 cuda_w1_2; do echo "$n: ${RC[$n]:-not run}"; done
