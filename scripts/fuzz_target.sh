#!/usr/bin/env bash
# scripts/fuzz_target.sh BIN CORPUS WORK SECONDS: one libFuzzer target's run, as scripts/fuzz_run.sh
# (one target after another) and scripts/fuzz_parallel.sh (several at once) both do it: runs BIN for
# SECONDS from CORPUS (new inputs into WORK/new), merges what adds coverage into CORPUS (libFuzzer
# -merge=1: the corpus grows by the minimal set of new entries), copies every finding (crash, leak,
# timeout, out-of-memory) into CORPUS as crash-<target>-<sha1> (the replay tests run it from then on),
# and prints one tab-separated line: target, executions, exec/s, cov, ft, corpus entries added, number
# of findings, the findings' files. Exit status 1 when there was a finding.
# Environment: FUZZ_TIMEOUT (seconds one input may take, default 20); ASAN_OPTIONS defaults to
# malloc_context_size=8 (allocation stacks of 8 frames instead of 30: recording them was ~9% of the
# slow targets' time, and 8 frames still name the caller in a report); FUZZ_FLAGS: more libFuzzer flags.
set -uo pipefail
bin=$1 corpus=$2 work=$3 budget=$4
t="${bin##*/fuzz_}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-malloc_context_size=8}"
rm -rf "$work"
mkdir -p "$corpus" "$work/new" "$work/artifacts"
# shellcheck disable=SC2086
timeout -k 10 $((budget + 300)) "$bin" -max_total_time="$budget" -timeout="${FUZZ_TIMEOUT:-20}" -rss_limit_mb=2048 \
  -print_final_stats=1 ${FUZZ_FLAGS:-} -artifact_prefix="$work/artifacts/" "$work/new" "$corpus" >"$work/log" 2>&1
execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$work/log")
rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$work/log")
cov=$(grep -oE 'cov: [0-9]+' "$work/log" | tail -1 | awk '{print $2}')
ft=$(grep -oE 'ft: [0-9]+' "$work/log" | tail -1 | awk '{print $2}')
before=$(ls "$corpus" | wc -l)
if [ -n "$(ls "$work/new")" ]; then
  "$bin" -merge=1 -timeout="${FUZZ_TIMEOUT:-20}" -rss_limit_mb=2048 "$corpus" "$work/new" >"$work/merge.log" 2>&1 ||
    echo "fuzz_target: $t: merge failed (see $work/merge.log)" >&2
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
printf '%s\t%s\t%s\t%s\t%s\t+%s\t%s\t%s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$added" "${#findings[@]}" \
  "${findings[*]:-}"
if [ ${#findings[@]} -gt 0 ]; then
  grep -m1 -A12 -E '==ERROR|runtime error|ERROR: libFuzzer' "$work/log" | sed "s/^/  $t: /" >&2
  exit 1
fi
exit 0
