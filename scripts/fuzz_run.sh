#!/usr/bin/env bash
# ./build.sh fuzz-run [SECONDS]: runs every libFuzzer target in build-fuzz/ for SECONDS (default 60),
# one after another, each from its corpus fuzz/corpus/<target>/ (scripts/fuzz_target.sh: the run,
# the merge of new coverage into the corpus, findings kept as crash-<target>-<sha1> where the
# corpus-replay tests run them), and prints per target the executions, exec/s, coverage (edges,
# features) and findings; exits 1 when there was one. Every target's line is also appended to the
# ledger fuzz/runs.tsv (date, commit, machine, seconds, then the line), from which
# scripts/fuzz_totals.sh sums the executions per target over all recorded runs.
# Environment: FUZZ_TARGETS="grammar engine" runs only those; FUZZ_BUILD (default build-fuzz);
# FUZZ_TIMEOUT (seconds one input may take, default 20); FUZZ_OUT (work dir, default
# build-fuzz/fuzz-run: logs, the new inputs before the merge, artifacts); FUZZ_MACHINE (the ledger's
# machine column, default vm-2core); FUZZ_LEDGER (default fuzz/runs.tsv; empty: no ledger).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET="${1:-60}"
BUILD="${FUZZ_BUILD:-build-fuzz}"
OUT="${FUZZ_OUT:-$BUILD/fuzz-run}"
LEDGER="${FUZZ_LEDGER-fuzz/runs.tsv}"
export DI_SOURCE_DIR="${DI_SOURCE_DIR:-$PWD}"
if ! ls "$BUILD"/fuzz_* >/dev/null 2>&1; then echo "fuzz_run: no targets in $BUILD (./build.sh fuzz)" >&2; exit 2; fi
mkdir -p "$OUT"
summary="$OUT/summary.txt"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
row() { printf '%-16s %12s %8s %7s %8s %9s %s\n' "$@"; }
row target executions exec/s cov ft corpus+ findings | tee "$summary"
found_any=0
for bin in "$BUILD"/fuzz_*; do
  [ -x "$bin" ] || continue
  t="${bin##*/fuzz_}"
  if [ -n "${FUZZ_TARGETS:-}" ] && ! grep -qw -- "$t" <<<"$FUZZ_TARGETS"; then continue; fi
  line=$(scripts/fuzz_target.sh "$bin" "fuzz/corpus/$t" "$OUT/$t" "$BUDGET") || found_any=1
  IFS=$'\t' read -r name execs rate cov ft added nfind files <<<"$line"
  row "$name" "$execs" "$rate" "$cov" "$ft" "$added" "$nfind${files:+ $files}" | tee -a "$summary"
  [ -n "$LEDGER" ] && printf '%s\t%s\t%s\t%s\t%s\n' "$(date -u +%Y-%m-%d)" "$commit" "${FUZZ_MACHINE:-vm-2core}" "$BUDGET" \
    "$line" >>"$LEDGER"
done
echo "fuzz_run: logs in $OUT; summary in $summary${LEDGER:+; ledger $LEDGER (scripts/fuzz_totals.sh)}" >&2
exit $found_any
