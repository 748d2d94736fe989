#!/bin/sh
# Expert parallel on CPU ranks: the decode step time and the share of it spent in the exchange, at 1, 2
# and 4 ranks, on the bench/configs/v3-ep shapes (random weights): `generate` of a 128-token prompt with
# 1 and with 33 greedy tokens; the difference of the two runs is 32 decode steps (start-up, weights and
# prefill cancel out), and the difference of rank 0's exchange seconds (the summary line) over it is the
# exchange's share of a decode step. One thread per rank. Usage: bench/bench_ep_cpu.sh [build dir]
set -e
B=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
IDS=$(seq -s, 2 129)
run() { # np max_tokens -> "wall exchange"
  t0=$(date +%s.%N)
  out=$(mpirun --oversubscribe -np "$1" "$B/deepinfer" generate --model bench/configs/v3-ep --load-format dummy \
    --prompt-ids "$IDS" --max-tokens "$2" --temperature 0 --ignore-eos --threads 1 --enable-expert-parallel 2>&1 >/dev/null)
  t1=$(date +%s.%N)
  echo "$(echo "$t1 - $t0" | bc) $(echo "$out" | sed -n 's/.* \([0-9.]*\) s in the exchange.*/\1/p')"
}
for np in 1 2 4; do
  set -- $(run $np 1) $(run $np 33)
  step=$(echo "scale=4; ($3 - $1) / 32" | bc)
  share=$(echo "scale=1; 100 * ($4 - $2) / ($3 - $1)" | bc)
  echo "ranks $np: wall $1 s (1 token) / $3 s (33 tokens); decode step $step s; exchange on rank 0 $2 / $4 s: ${share}% of a decode step"
done
