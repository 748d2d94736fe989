#!/usr/bin/env bash
# s16-20 req-1 (session 16, issue 20; no model): what branch s16-20 added to the V4 CUDA backend, run on main's binaries
# after its merge (scripts/device_tests.sh --build builds every binary it needs: test_cuda_v4_kernels, test_cuda_mx_tc,
# test_cuda_v4, bench_cuda_v4). The same checks as /work/devq/s16-20-req-1 of session 16 (whose bench ran: PERFORMANCE.md
# "Session 16, s16-20"; its tests crashed at exit on a bug fixed since), with the baseline ("m" runs) the same binary at
# the old settings (DEEPINFER_CUDA_V4_FORK=0
# DEEPINFER_CUDA_V4_MX_TC=0 = the defaults) instead of a main binary:
# 1. test_cuda_v4_kernels (the mHC pre-step in parts == one call; MXFP4 forms 6 / 7 == form 1), test_cuda_mx_tc (the
#    MX_TC choice per mode), test_cuda_v4 with DEEPINFER_CUDA_V4_FORK=3 and graphs (every check; graphs on == off).
# 2. bench_cuda_v4 hashes: FORK=3 MX_TC=0 == the baseline on every line (the forks keep the bits); MX_TC=2 == it at batch 1;
#    the invariant mode with MX_TC=2 == it (4K); forms 6 / 7, FORK=7, graphs == it at batch 1; the baseline == session 15's
#    hashes (printed). Speed: baseline vs FORK=3 / MX_TC=2 (alternating) at 4K / 128K, batches 1, 2, 4, 16, 64, prefill
#    4,096; batch 1 with FORK 0 / 1 / 2 / 7, forms 6 / 7, graphs. With MX_TC's default at 2 (the branch's last commit)
#    the "m" runs set 0 explicitly, so the comparison stands either way. What matters now: the three tests' result.
set -u
T0=$(date +%s)
BUDGET=${BUDGET_S:-240}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
S=$LOG/summary.txt
: >"$S"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
ldd "$BIN/test_cuda_v4" | grep -q "not found" && echo "MISSING LIBRARIES: $(ldd "$BIN/test_cuda_v4" | grep 'not found' | tr '\n' ' ')" >>"$S"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$LOG/gpu.txt" 2>&1
echo "gpu: $(head -1 "$LOG/gpu.txt")" >>"$S"
# 1. the three tests at once (correctness; no timing while they run)
timeout 60 "$BIN/test_cuda_v4_kernels" >"$LOG/t_v4_kernels.log" 2>&1 &
P1=$!
timeout 60 "$BIN/test_cuda_mx_tc" >"$LOG/t_mx_tc.log" 2>&1 &
P2=$!
DEEPINFER_CUDA_V4_FORK=3 TEST_V4_GRAPHS=1 timeout 60 "$BIN/test_cuda_v4" >"$LOG/t_v4_fork3_graphs.log" 2>&1 &
P3=$!
wait $P1; R1=$?; wait $P2; R2=$?; wait $P3; R3=$?
for t in "t_v4_kernels $R1" "t_mx_tc $R2" "t_v4_fork3_graphs $R3"; do
  set -- $t
  echo "$1: rc $2; $(grep -E 'passed, [0-9]+ failed' "$LOG/$1.log" | tail -1); FAIL lines $(grep -c FAIL "$LOG/$1.log")" >>"$S"
done
grep -E "^model: MX_TC unset|mHC pre-step in parts|experts MXFP4 \(hidden 4096, width 2048, 2 tokens" "$LOG/t_mx_tc.log" "$LOG/t_v4_kernels.log" | cut -c1-330 >>"$S"
echo "tests done at $(( $(date +%s) - T0 )) s" >>"$S"
# 2. bench_cuda_v4 runs (native weights); each line: batch, context, ms/step, logits hash
DEC="4096,131072 32 6 1,2,4,16,64 0"  # + PROFILE 4: session 15's step count
run() { # name need_s bin env... -- args...
  local name=$1 need=$2 bin=$3; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  if [ "$(left)" -lt "$need" ]; then echo "$name: skipped (budget)" >>"$S"; return; fi
  env DEEPINFER_CUDA_V4_NATIVE=1 "${envs[@]}" timeout $(( $(left) - 2 )) "$bin/bench_cuda_v4" "$@" >"$LOG/b_$name.log" 2>&1
  local rc=$?
  echo "$name (${envs[*]}): rc $rc $(grep -E '^prefill of' "$LOG/b_$name.log" | sed -E 's/prefill of ([0-9]+) tokens in steps of ([0-9]+)( again \(scratch grown\))?: ([0-9.]+) ms, ([0-9]+) tok.s/pf\1\/\2\3 \5 tok\/s/' | tr '\n' ' ')" >>"$S"
  awk '/^decode batch/ { b=$3; c=$6; sub(":","",c); printf "  b%s@%s %s %s\n", b, c, $7, $NF }' "$LOG/b_$name.log" | paste -sd' ' >>"$S"
}
run m1 14 "$BIN" DEEPINFER_CUDA_V4_FORK=0 DEEPINFER_CUDA_V4_MX_TC=0 -- $DEC 4
run a1 14 "$BIN" DEEPINFER_CUDA_V4_FORK=3 DEEPINFER_CUDA_V4_MX_TC=0 -- $DEC 4
run b1 12 "$BIN" DEEPINFER_CUDA_V4_FORK=3 DEEPINFER_CUDA_V4_MX_TC=2 -- $DEC 4
run mp 20 "$BIN" DEEPINFER_CUDA_V4_FORK=0 DEEPINFER_CUDA_V4_MX_TC=0 -- 4096 32 2 1 4096 1
run bp 14 "$BIN" DEEPINFER_CUDA_V4_FORK=3 DEEPINFER_CUDA_V4_MX_TC=2 -- 4096 32 2 1 4096 1
run m2 12 "$BIN" DEEPINFER_CUDA_V4_FORK=0 DEEPINFER_CUDA_V4_MX_TC=0 -- $DEC 4
run b2 12 "$BIN" DEEPINFER_CUDA_V4_FORK=3 DEEPINFER_CUDA_V4_MX_TC=2 -- $DEC 4
run f7 8 "$BIN" DEEPINFER_CUDA_V4_FORK=7 -- 4096,131072 32 6 1 0 4
run x6 8 "$BIN" DEEPINFER_CUDA_V4_FORK=3 BENCH_V4_MX_FORM=6 -- 4096,131072 32 6 1 0 4
run x7 8 "$BIN" DEEPINFER_CUDA_V4_FORK=3 BENCH_V4_MX_FORM=7 -- 4096,131072 32 6 1 0 4
run bi 10 "$BIN" DEEPINFER_CUDA_V4_FORK=3 DEEPINFER_CUDA_V4_MX_TC=2 DEEPINFER_BATCH_INVARIANT=1 -- 4096 32 6 1,16,64 0 4
run m3 8 "$BIN" DEEPINFER_CUDA_V4_FORK=0 DEEPINFER_CUDA_V4_MX_TC=0 -- 4096,131072 32 6 1 0 4
run f0 8 "$BIN" DEEPINFER_CUDA_V4_FORK=0 -- 4096,131072 32 6 1 0 4
run g1 10 "$BIN" DEEPINFER_CUDA_V4_FORK=7 DEEPINFER_CUDA_V4_GRAPHS=1 -- 4096,131072 32 6 1,16,64 0 4
run f1 8 "$BIN" DEEPINFER_CUDA_V4_FORK=1 -- 4096,131072 32 6 1 0 4
run f2 8 "$BIN" DEEPINFER_CUDA_V4_FORK=2 -- 4096,131072 32 6 1 0 4
run a2 12 "$BIN" DEEPINFER_CUDA_V4_FORK=3 DEEPINFER_CUDA_V4_MX_TC=0 -- $DEC 4
echo "done at $(( $(date +%s) - T0 )) s" >>"$S"
# compact verdict: logits hashes against main's (m1) per line, and ms a step
H() { awk '/^decode batch/ { c=$6; sub(":","",c); print "b" $3 "@" c, $NF }' "$LOG/b_$1.log" 2>/dev/null; }
same() { # name [filter]: how many of its lines (matching filter) have m1's hash, of how many
  local n=0 k=0
  while read -r key h; do
    [ -n "${2:-}" ] && ! echo "$key" | grep -qE "$2" && continue
    n=$((n + 1)); H m1 | grep -q "^$key $h\$" && k=$((k + 1))
  done < <(H "$1")
  echo "$1 $k/$n"
}
{
  echo "== session 15's hashes (s15-20 req-1 / req-2, main then; 4K b1 b16 b64, 128K b1 b16 b64): afea066517fe5286 d5467cd94f1eb181 37697e995f2bf1fd 8d2d3a26d70ce170 c20f34c37247503c 1a252c84a8bf9551"
  echo "== m1: $(H m1 | grep -E '^b(1|16|64)@' | sort -t@ -k2,2n -k1.2,1n | awk '{print $2}' | paste -sd' ')"
  echo "== hashes equal to the baseline's (m1): $(same a1) (all: FORK=3 MX_TC=0) $(same a2) $(same b1 '^b1@') (batch 1, MX_TC=2) $(same bi '@4096') (invariant with MX_TC=2, 4K) $(same f7) $(same x6) $(same x7) $(same f0) $(same f1) $(same f2) $(same g1 '^b1@') $(same m3)"
  ms() { awk -v keys="$2" '/^decode batch/ { c=$6; sub(":","",c); v["b" $3 "@" c]=$7 } END { n=split(keys,k," "); o=""; for (i=1;i<=n;i++) o=o (i>1?"/":"") v[k[i]]; print o }' "$LOG/b_$1.log" 2>/dev/null; }
  K1="b1@4096 b2@4096 b4@4096 b16@4096 b64@4096 b1@131072 b16@131072 b64@131072"
  printf '== ms/step b1/b2/b4/b16/b64 @4K, b1/b16/b64 @128K:'
  for r in m1 a1 b1 m2 b2 a2; do [ -f "$LOG/b_$r.log" ] && printf ' %s %s' "$r" "$(ms $r "$K1")"; done
  echo
  printf '== ms/step b1@4K/b1@128K:'
  for r in m3 f0 f1 f2 f7 x6 x7 g1 bi; do [ -f "$LOG/b_$r.log" ] && printf ' %s %s' "$r" "$(ms $r "b1@4096 b1@131072")"; done
  echo
  printf '== g1 (graphs) b16/b64 @4K, @128K: %s; bi (invariant) b16/b64 @4K: %s\n' "$(ms g1 "b16@4096 b64@4096 b16@131072 b64@131072")" "$(ms bi "b16@4096 b64@4096")"
  pf() { grep -E '^prefill of' "$LOG/b_$1.log" 2>/dev/null | grep -oE '[0-9]+ tok/s' | paste -sd' '; }
  echo "== prefill 4096 (one step, again, steps of 512) tok/s: baseline $(pf mp) / mine (MX_TC=2, FORK=3) $(pf bp)"
} >>"$S"
cat "$S"
