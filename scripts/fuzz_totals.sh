#!/usr/bin/env bash
# scripts/fuzz_totals.sh [LEDGER...]: the executions per fuzz target summed over every run recorded in
# the ledgers (default fuzz/runs.tsv; written by scripts/fuzz_run.sh and scripts/fuzz_parallel.sh,
# one tab-separated line per target and run: date, commit, machine, seconds, target, executions,
# exec/s, cov, ft, corpus+, findings, finding files), as a Markdown table: runs, seconds, executions,
# findings, the latest run's exec/s and machine, and against the issue's aim of 10 million executions
# per target: reached, or the hours still needed at the best rate recorded for that target.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- fuzz/runs.tsv
AIM=${FUZZ_AIM:-10000000}
grep -hv '^#' "$@" | awk -F'\t' -v aim="$AIM" '
  function commas(v,   s) { s = sprintf("%d", v); while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]($|,)/, ",&", s); return s }
  NF >= 11 && $6 ~ /^[0-9]+$/ {
    t = $5; runs[t]++; secs[t] += $4; ex[t] += $6; find[t] += $11
    if ($7 + 0 > best[t]) best[t] = $7 + 0
    last[t] = $7 " (" $3 ", " $1 ")"
  }
  END {
    print "| target | runs | seconds | executions | findings | latest exec/s | 10M aim |"
    print "| --- | ---: | ---: | ---: | ---: | --- | --- |"
    n = 0; for (t in runs) names[++n] = t
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (names[j] < names[i]) { x = names[i]; names[i] = names[j]; names[j] = x }
    for (i = 1; i <= n; i++) {
      t = names[i]
      aimtxt = ex[t] >= aim ? "reached" : best[t] > 0 ? sprintf("%.2f h more at %d/s", (aim - ex[t]) / best[t] / 3600, best[t]) : "?"
      printf "| %s | %d | %d | %s | %d | %s | %s |\n", t, runs[t], secs[t], commas(ex[t]), find[t], last[t], aimtxt
    }
  }'
