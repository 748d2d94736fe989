#!/bin/sh
# Expert parallel on CPU ranks: wall time of `generate` (128-token prompt, 32 greedy tokens) on the
# bench/configs/v3-ep shapes (random weights) at 1, 2 and 4 ranks, and the seconds rank 0 spent in
# the exchange (the summary line). One thread per rank. Usage: bench/bench_ep_cpu.sh [build dir]
set -e
B=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
IDS=$(seq -s, 2 129)
for np in 1 2 4; do
  t0=$(date +%s.%N)
  out=$(mpirun --oversubscribe -np $np "$B/deepinfer" generate --model bench/configs/v3-ep --load-format dummy \
    --prompt-ids "$IDS" --max-tokens 32 --temperature 0 --ignore-eos --threads 1 --enable-expert-parallel 2>&1 >/dev/null)
  t1=$(date +%s.%N)
  ex=$(echo "$out" | sed -n 's/.* \([0-9.]*\) s in the exchange.*/\1/p')
  echo "ranks $np: wall $(echo "$t1 - $t0" | bc) s, exchange on rank 0 $ex s"
done
