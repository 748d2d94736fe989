#!/usr/bin/env bash
# scripts/fuzz_plan.sh [LEDGER...]: the plan that scripts/fuzz_bg.sh schedules its workers by, from the
# fuzz ledgers (default fuzz/runs.tsv): per target with a binary in build-fuzz/, tab-separated, the
# executions still needed for the aim of 10 million (FUZZ_AIM), 0 when reached, and the exec/s per core
# to expect: the latest run's (runs of several workers record core-seconds, so theirs is per core too;
# the latest rather than the best, since a target's speed changes with its code and corpus).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- fuzz/runs.tsv
AIM=${FUZZ_AIM:-10000000}
echo "# target	executions left	exec/s per core (from $*)"
grep -hv '^#' "$@" | awk -F'\t' -v aim="$AIM" '
  NF >= 11 && $6 ~ /^[0-9]+$/ { ex[$5] += $6; if ($7 + 0 > 0) rate[$5] = $7 + 0 }
  END { for (t in ex) if (system("test -x build-fuzz/fuzz_" t) == 0)
          printf "%s\t%d\t%d\n", t, (ex[t] >= aim ? 0 : aim - ex[t]), rate[t] }' | sort
