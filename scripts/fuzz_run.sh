#!/usr/bin/env bash
# ./build.sh fuzz-run [SECONDS]: runs every libFuzzer target in build-fuzz/ for SECONDS (default 60)
# from its corpus fuzz/corpus/<target>/, then merges what it found into that corpus (libFuzzer
# -merge=1: only new inputs that add coverage are kept, so the corpus grows minimally), and prints per
# target the executions, exec/s, coverage (edges, features) and findings. Every finding (a crash,
# leak, timeout or out-of-memory input) is copied into the corpus as crash-<target>-<sha1>, where the
# corpus-replay tests (tests/*/test_*fuzz_corpus.c and the other replays listed in docs/fuzzing.md)
# run it from then on; the script exits 1 when there was one.
# Environment: FUZZ_TARGETS="grammar engine" runs only those; FUZZ_BUILD (default build-fuzz);
# FUZZ_TIMEOUT (seconds one input may take, default 20); FUZZ_OUT (work dir, default
# build-fuzz/fuzz-run: logs, the new inputs before the merge, artifacts).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET="${1:-60}"
BUILD="${FUZZ_BUILD:-build-fuzz}"
OUT="${FUZZ_OUT:-$BUILD/fuzz-run}"
export DI_SOURCE_DIR="$PWD"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
if ! ls "$BUILD"/fuzz_* >/dev/null 2>&1; then echo "fuzz_run: no targets in $BUILD (./build.sh fuzz)" >&2; exit 2; fi
mkdir -p "$OUT"
summary="$OUT/summary.txt"
printf '%-14s %12s %8s %7s %8s %9s %s\n' target executions exec/s cov ft corpus+ findings | tee "$summary"
found_any=0
for bin in "$BUILD"/fuzz_*; do
  [ -x "$bin" ] || continue
  t="${bin##*/fuzz_}"
  if [ -n "${FUZZ_TARGETS:-}" ] && ! grep -qw -- "$t" <<<"$FUZZ_TARGETS"; then continue; fi
  corpus="fuzz/corpus/$t"
  work="$OUT/$t"
  rm -rf "$work"
  mkdir -p "$corpus" "$work/new" "$work/artifacts"
  timeout -k 10 $((BUDGET + 300)) "$bin" -max_total_time="$BUDGET" -timeout="${FUZZ_TIMEOUT:-20}" -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/new" "$corpus" >"$work/log" 2>&1
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$work/log")
  rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$work/log")
  cov=$(grep -oE 'cov: [0-9]+' "$work/log" | tail -1 | awk '{print $2}')
  ft=$(grep -oE 'ft: [0-9]+' "$work/log" | tail -1 | awk '{print $2}')
  before=$(ls "$corpus" | wc -l)
  if [ -n "$(ls "$work/new")" ]; then
    "$bin" -merge=1 -timeout="${FUZZ_TIMEOUT:-20}" -rss_limit_mb=2048 "$corpus" "$work/new" >"$work/merge.log" 2>&1 ||
      echo "fuzz_run: $t: merge failed (see $work/merge.log)" >&2
  fi
  added=$(( $(ls "$corpus" | wc -l) - before ))
  findings=()
  for a in "$work"/artifacts/*; do
    [ -f "$a" ] || continue
    kind="${a##*/}"; kind="${kind%%-*}"          # crash, leak, timeout, oom, slow
    [ "$kind" = slow ] && continue             # slow units are reported by libFuzzer, not kept
    dest="$corpus/crash-$t-$(sha1sum "$a" | cut -c1-16)"
    cp "$a" "$dest"
    findings+=("$kind:$dest")
  done
  printf '%-14s %12s %8s %7s %8s %9s %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "+$added" \
    "${#findings[@]}${findings:+ ${findings[*]}}" | tee -a "$summary"
  if [ ${#findings[@]} -gt 0 ]; then
    found_any=1
    grep -m1 -A12 -E '==ERROR|runtime error|ERROR: libFuzzer' "$work/log" | sed "s/^/  $t: /" >&2
  fi
done
echo "fuzz_run: logs in $OUT; summary in $summary" >&2
exit $found_any
