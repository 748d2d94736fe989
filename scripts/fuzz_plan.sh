#!/usr/bin/env bash
# scripts/fuzz_plan.sh [LEDGER...]: the plan that scripts/fuzz_bg.sh schedules its workers by, from the
# fuzz ledgers (default fuzz/runs.tsv): per target with a binary in build-fuzz/, tab-separated, the
# executions still needed for the aim of 10 million (FUZZ_AIM), 0 when reached, and the exec/s per core
# to expect: the latest run's on the machine the plan is for (FUZZ_PLAN_MACHINE, a regex on the ledger's
# machine column, default "device host"; else the latest run's anywhere). Runs of several workers record
# core-seconds, so theirs is per core too; the latest rather than the best, since a target's speed
# changes with its code and corpus; the machine's own, since the niced runs on the shared VM record
# wall seconds at a fraction of a core.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- fuzz/runs.tsv
AIM=${FUZZ_AIM:-10000000}
echo "# target	executions left	exec/s per core (from $*)"
grep -hv '^#' "$@" | awk -F'\t' -v aim="$AIM" -v machine="${FUZZ_PLAN_MACHINE:-device host}" '
  NF >= 11 && $6 ~ /^[0-9]+$/ { ex[$5] += $6; if ($7 + 0 > 0) { rate[$5] = $7 + 0; if ($3 ~ machine) mrate[$5] = $7 + 0 } }
  END { for (t in ex) if (system("test -x build-fuzz/fuzz_" t) == 0)
          printf "%s\t%d\t%d\n", t, (ex[t] >= aim ? 0 : aim - ex[t]), (t in mrate ? mrate[t] : rate[t]) }' | sort
