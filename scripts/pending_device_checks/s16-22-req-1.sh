# s16-22 req-1 (session 16; not run: the session's device starts failed). Binaries of main after the s16-22 merge:
# scripts/device_tests.sh --build plus the targets test_dspark test_cuda_dspark bench_dspark_host (build-cuda/, copied
# into BIN beside the others); reads models/default (needs the shipped model). ~170 s on one H100 / H200.
# (a) DEEPINFER_DSPARK_PROP_GRAPH=1 (a graph step's in-step proposal as a CUDA graph of its own behind the step's plain
#     graph; off by default until this passes): test_dspark on CUDA (invariant) must give 2,964 / 0 with the fixed
#     configs' drafted / accepted 617/358, 1990/487, 1490/469 (session 15's) and proposals in the step, none missed;
#     test_cuda_dspark 195 / 0.
# (b) bench_dspark_host plain vs scheduled at 16 / 64 / 256 on CUDA, PROP_GRAPH 0 and 1 alternating (aim: scheduled /
#     plain >= ~0.99x: the first pause, from the probe's and exploration's full cost, should outlast the 200-step window;
#     the looks column says how long it was); looks every 200 steps (BENCH_LOOK_EVERY=200) with both: what one look
#     costs (session 15: 5-7 ms at 64); the CPU (16 cores) with DEEPINFER_DSPARK_PAUSE_FEED 0 (default) and 1
#     (session 15's feeding of every paused row; main before s16-22 was at 0.97x / 0.90x / 0.86x of plain).
# If (a) passes and (b) shows PROP_GRAPH=1 no slower: flip DEEPINFER_DSPARK_PROP_GRAPH's default to 1 (switches.c/.md).
set -u
cd "$DI_SOURCE_DIR"
B="$BIN"
export LD_LIBRARY_PATH="$B:${LD_LIBRARY_PATH:-}"
declare -A RC
SB=""; command -v stdbuf >/dev/null && SB="stdbuf -oL"
T0=$SECONDS; BUDGET=${BUDGET:-170}
# step NAME TIMEOUT MIN_LEFT cmd...: runs only if MIN_LEFT seconds of the budget are left
step() { local n="$1" t="$2" need="$3"; shift 3
  if [ $((BUDGET - (SECONDS - T0))) -lt "$need" ]; then RC[$n]="skipped (time)"; echo "=== $n: skipped"; return; fi
  local s=$SECONDS; timeout "$t" "$@" > "$LOG/$n.log" 2>&1; RC[$n]="$? ($((SECONDS - s)) s)"; echo "=== $n: ${RC[$n]}"; }
[ -f "$B/COMMIT" ] && cat "$B/COMMIT"; nvidia-smi --query-gpu=name --format=csv,noheader
M="model models/default"
step inv 45 45 env DEEPINFER_DSPARK_PROP_GRAPH=1 DEEPINFER_ACCELERATOR=cuda DEEPINFER_BATCH_INVARIANT=1 $SB "$B/test_dspark"
step cdspark 30 30 $SB "$B/test_cuda_dspark"
step cuda_g0_1 22 22 env DEEPINFER_DSPARK_PROP_GRAPH=0 $SB "$B/bench_dspark_host" $M cuda 16,64,256 200
step cuda_g1_1 22 22 env DEEPINFER_DSPARK_PROP_GRAPH=1 $SB "$B/bench_dspark_host" $M cuda 16,64,256 200
step looks_g0 10 10 env DEEPINFER_DSPARK_PROP_GRAPH=0 BENCH_LOOK_EVERY=200 BENCH_ONLY=1 $SB "$B/bench_dspark_host" $M cuda 16,64,256 1500
step looks_g1 10 10 env DEEPINFER_DSPARK_PROP_GRAPH=1 BENCH_LOOK_EVERY=200 BENCH_ONLY=1 $SB "$B/bench_dspark_host" $M cuda 16,64,256 1500
step cpu_f0 30 30 env DEEPINFER_DSPARK_PAUSE_FEED=0 $SB "$B/bench_dspark_host" $M cpu 16,64,256 60
step cpu_f1 30 30 env DEEPINFER_DSPARK_PAUSE_FEED=1 $SB "$B/bench_dspark_host" $M cpu 16,64,256 60
step cuda_g0_2 22 22 env DEEPINFER_DSPARK_PROP_GRAPH=0 $SB "$B/bench_dspark_host" $M cuda 16,64,256 200
step cuda_g1_2 22 22 env DEEPINFER_DSPARK_PROP_GRAPH=1 $SB "$B/bench_dspark_host" $M cuda 16,64,256 200
# ratios: scheduled (online) tok/s over the mean of plain and plain again, per batch
ratio() { awk -F'|' '/^\| [0-9]/ { n=$2+0; c=$3; gsub(/^ +| +$/,"",c); t=$4+0;
  if (c=="plain" || c=="plain again") { p[n]+=t; np[n]++ } else if (c=="dspark scheduled") { s[n]=t; sm[n]=$16; lk[n]=$19 }
  else if (c=="dspark scheduled, startup profile") st[n]=t }
  END { for (n in s) if (np[n]) printf " %d: %.3fx (startup %.3fx; plain %.0f; sched median/p90/max%s; looks%s)\n", n, s[n]/(p[n]/np[n]), st[n]/(p[n]/np[n]), p[n]/np[n], sm[n], lk[n] }' "$1"; }
echo "---- scheduled / plain (tok/s)"
for n in cuda_g0_1 cuda_g1_1 cuda_g0_2 cuda_g1_2 cpu_f0 cpu_f1; do
  [ -f "$LOG/$n.log" ] && { echo "$n"; ratio "$LOG/$n.log" | sort -n; }; done
echo "---- looks every 200 steps (seqs | tok/s | wall | median/p90/max | slow | looks)"
for n in looks_g0 looks_g1; do echo "$n"; grep "^| [0-9]" "$LOG/$n.log" 2>/dev/null | cut -d'|' -f2,4,5,16,17,19; done
echo "---- tests"
grep -h "budget 0 blocks 0:\|budget 16\|blocks 6:" "$LOG/inv.log" | sed -E 's/.*"num_speculative_tokens": ([0-9]).* (budget [^:]*): ([0-9]+ drafted, [0-9]+ accepted).*, ([0-9]+ proposals in the step[^,;]*).*/k=\1 \2: \3, \4/'
grep -h "passed, .* failed" "$LOG/inv.log" "$LOG/cdspark.log"
for n in inv cdspark cuda_g0_1 cuda_g1_1 looks_g0 looks_g1 cpu_f0 cpu_f1 cuda_g0_2 cuda_g1_2; do echo "$n: ${RC[$n]:-not run}"; done
