#!/usr/bin/env bash
# scripts/fuzz_bg.sh SECONDS JOBS OUTDIR: background fuzzing on the device host while the GPU tests of
# a device batch run (they use 1-2 of its 16 cores). Run from a directory holding fuzzpack.tar.xz
# (scripts/fuzz_pack.sh) and plan.tsv (scripts/fuzz_plan.sh: per target the executions still needed
# for the 10M aim and the exec/s per core to expect), both next to this script.
#
# Why separate processes rather than libFuzzer's -fork=N: each worker is a plain libFuzzer run with its
# own output dir and -artifact_prefix, so its executions are libFuzzer's own final stat
# (stat::number_of_executed_units, or the last "#N" line if it was killed before printing it) and the
# target's ledger line is the exact sum; a worker's time can be split between targets (a target that
# needs 90 s of one core gets 90 s, the rest of that core goes to the next target); and one worker's
# crash stops only that worker. -fork would share new coverage between jobs, but it reports one merged
# count, restarts jobs on crashes with its own bookkeeping, and cannot be split by time this way.
#
# Schedule: the JOBS x (SECONDS - reserve) core-seconds are handed out to the targets in ascending order
# of the core-seconds each still needs (need = executions left / rate), each getting what it needs plus
# 10% while the budget lasts (the first it does not cover gets the rest), so as many targets as
# possible reach the aim. The timeline is cut into JOBS slots; a slot runs its segments one after the
# other (segments shorter than 20 s are folded into a neighbour). The reserve (10% of SECONDS, 10-40 s)
# is for writing the results, so the script ends by SECONDS.
#
# OUTDIR gets four files (the device returns only a few files per call). Written as each segment ends,
# so a SIGINT/SIGTERM from the caller loses only the segments still running, which are themselves
# interrupted and report their count:
#   runs.tsv            ledger lines (fuzz/runs.tsv format), one per target, executions summed over its
#                       segments; the seconds column is the core-seconds spent; corpus+ is the raw number
#                       of new inputs (the merge against the corpus is done back home)
#   segments.tsv        one line per segment: slot target seconds executions exec/s cov ft new findings
#   summary.md          the table of the run and its schedule
# and at the end (or on a signal; a few seconds):
#   results.tar.xz      fuzz/corpus/<target>/<sha1> (the new inputs), findings/<target>/crash-<target>-<sha>
#                       (crash-*/leak-*/timeout-*/oom-* inputs), logs/<slot>-<n>-<target>.tail (the last
#                       30 lines of each segment's libFuzzer log)
set -uo pipefail
# Started in the background by a non-interactive shell, this script gets SIGINT ignored, and a signal
# ignored at a shell's entry can be neither trapped nor reset, nor does libFuzzer take it back: the
# caller's SIGINT then reached nobody (device batch 3, session 13). So start again with SIGINT and
# SIGTERM at their defaults (env --default-signal, coreutils 8.31; perl otherwise).
if [ -z "${FUZZ_BG_SIGNALS_RESET:-}" ] &&
   (( 0x$(awk '/^SigIgn:/ {print $2}' /proc/$$/status 2>/dev/null || echo 0) & 0x4002 )); then
  export FUZZ_BG_SIGNALS_RESET=1
  if env --default-signal=INT true 2>/dev/null; then exec env --default-signal=INT,TERM bash "$0" "$@"; fi
  if command -v perl >/dev/null; then exec perl -e '$SIG{INT} = $SIG{TERM} = "DEFAULT"; exec @ARGV or die' bash "$0" "$@"; fi
  echo "fuzz_bg: SIGINT is ignored here and cannot be reset: stop this run with SIGTERM" >&2
fi
# the workers likewise (bash ignores SIGINT in background children of a non-interactive shell)
if env --default-signal=INT true 2>/dev/null; then reset_signals=(env --default-signal=INT,TERM); else reset_signals=(); fi
secs=$1 jobs=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
reserve=$(( secs / 10 )); [ "$reserve" -lt 10 ] && reserve=10; [ "$reserve" -gt 40 ] && reserve=40
fuzz_secs=$(( secs - reserve ))
[ "$fuzz_secs" -ge 10 ] || { echo "fuzz_bg: SECONDS too small" >&2; exit 2; }
dir=$(mktemp -d /tmp/fuzzbg.XXXXXX)
xz -dc "$here/fuzzpack.tar.xz" | tar xf - -C "$dir" || { echo "fuzz_bg: cannot unpack" >&2; exit 2; }
root="$dir/fuzzpack"
res="$dir/res"   # what goes into results.tar.xz
mkdir -p "$res/findings" "$res/logs"
start=$(date +%s)
export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DI_SOURCE_DIR="$root"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-malloc_context_size=8}"
commit=$(cat "$root/COMMIT")
machine="${FUZZ_MACHINE:-device host ($(nproc) cores)}"
day=$(date -u +%Y-%m-%d)
: >"$out/segments.tsv"

# the schedule: lines "slot target seconds"
awk -F'\t' -v jobs="$jobs" -v T="$fuzz_secs" -v bin="$root/bin" '
  !/^#/ && NF >= 3 && $2 > 0 && $3 > 0 {
    if (system("test -x " bin "/fuzz_" $1) != 0) next
    n++; t[n] = $1; need[n] = $2 / $3 * 1.1
  }
  END {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (need[j] < need[i]) {
      x = need[i]; need[i] = need[j]; need[j] = x; x = t[i]; t[i] = t[j]; t[j] = x }
    B = jobs * T; left = B
    for (i = 1; i <= n; i++) { a[i] = need[i] <= left ? need[i] : left; left -= a[i] }
    if (left > 0 && n > 0) for (i = 1; i <= n; i++) a[i] += left / n   # everyone reached: share evenly
    # fold allocations under 20 s into the largest one
    big = 1; for (i = 1; i <= n; i++) if (a[i] > a[big]) big = i
    for (i = 1; i <= n; i++) if (i != big && a[i] < 20) { a[big] += a[i]; a[i] = 0 }
    # cut the timeline into slots of T seconds
    slot = 0; room = T
    for (i = 1; i <= n; i++) {
      r = int(a[i] + 0.5)
      while (r > 0 && slot < jobs) {
        s = r < room ? r : room
        if (T >= 100 && room - s < 20 && room - s > 0) s = room   # no tail under 20 s in a slot
        print slot, t[i], s
        r -= s; room -= s
        if (r < 20 && T >= 100) r = 0   # no leftover under 20 s (in slots of 100 s or more)
        if (room <= 0) { slot++; room = T }
      }
    }
  }' "$here/plan.tsv" >"$dir/schedule.txt"
echo "fuzz_bg: commit $commit, $jobs workers, ${fuzz_secs} s of fuzzing (+${reserve} s to write results); schedule:" >&2
sed 's/^/  /' "$dir/schedule.txt" >&2
if [ -n "${FUZZ_BG_DRY:-}" ]; then rm -rf "$dir"; exit 0; fi   # only the schedule

# the ledger and the summary from segments.tsv (rewritten after every segment, under a lock)
aggregate() {
  awk -F'\t' -v day="$day" -v commit="$commit" -v machine="$machine" -v outd="$out" -v resd="$res" -v tmpd="$dir" '
    { t = $2; seen[t] = 1; s[t] += $3; ex[t] += $4; if ($6 + 0 > cov[t]) cov[t] = $6; if ($7 + 0 > ft[t]) ft[t] = $7
      nw[t] += $8; nf[t] += $9; nseg[t]++ }
    END {
      for (t in seen) {
        files = ""
        cmd = "ls " resd "/findings/" t " 2>/dev/null"
        while ((cmd | getline f) > 0) files = files (files == "" ? "" : " ") "fuzz/corpus/" t "/" f
        close(cmd)
        printf "%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\t+%d\t%d\t%s\n", day, commit, machine, s[t], t, ex[t],
          (s[t] > 0 ? ex[t] / s[t] : 0), cov[t], ft[t], nw[t], nf[t], files > (tmpd "/runs.tsv.tmp")
        printf "| %s | %d | %d | %d | %d | %s | %s | %d | %d |\n", t, nseg[t], s[t], ex[t], (s[t] > 0 ? ex[t] / s[t] : 0),
          cov[t], ft[t], nw[t], nf[t] > (tmpd "/summary.tmp")
      }
    }' "$out/segments.tsv"
  touch "$dir/runs.tsv.tmp" "$dir/summary.tmp"
  sort -t $'\t' -k5,5 "$dir/runs.tsv.tmp" >"$out/runs.tsv"; rm -f "$dir/runs.tsv.tmp"
  { echo "# Background fuzz run: commit $commit, $machine, $jobs workers, $fuzz_secs s each (started $(date -u -d "@$start" +%H:%M:%S) UTC)"
    echo
    echo "| target | segments | core-seconds | executions | exec/s per core | cov (max) | ft (max) | new inputs | findings |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    sort "$dir/summary.tmp"; rm -f "$dir/summary.tmp"
    echo; echo "Executions are libFuzzer's own final stat per segment (stat::number_of_executed_units; the last #N line if interrupted), summed."
    echo; echo "Schedule (slot, target, seconds planned):"; echo; sed 's/^/    /' "$dir/schedule.txt"
  } >"$out/summary.md"
}

# one segment: BIN's run for S seconds; its line into segments.tsv, its findings and log tail into res/
segment() {   # slot n target seconds
  local slot=$1 n=$2 t=$3 s=$4 w="$dir/work/$1-$2-$3"
  mkdir -p "$w/new" "$w/art"
  [ -e "$dir/stop" ] && return 1
  local left=$(( start + fuzz_secs - $(date +%s) ))
  [ "$s" -gt "$left" ] && s=$left
  [ "$s" -ge 5 ] || return 1
  local t0; t0=$(date +%s)
  "${reset_signals[@]}" "$root/bin/fuzz_$t" -max_total_time="$s" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$w/art/" "$w/new" "$root/fuzz/corpus/$t" >"$w/log" 2>&1 &
  local pid=$!
  echo "$pid" >"$w/pid"
  wait "$pid"
  while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done   # a trapped signal ends wait early
  local used=$(( $(date +%s) - t0 ))
  grep -q 'libFuzzer: run interrupted' "$w/log" && touch "$dir/stop"   # a signal reached the worker, if not us
  local ex rate cov ft
  ex=$(awk '/stat::number_of_executed_units/ {print $2}' "$w/log" | tail -1)
  [ -n "$ex" ] || ex=$(grep -oE '^#[0-9]+' "$w/log" | tail -1 | tr -d '#')
  [ -n "$ex" ] || ex=0
  rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$w/log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$w/log" | tail -1 | awk '{print $2}')
  ft=$(grep -oE 'ft: [0-9]+' "$w/log" | tail -1 | awk '{print $2}')
  local nf=0 a
  for a in "$w"/art/*; do
    [ -f "$a" ] || continue
    local kind="${a##*/}"; kind="${kind%%-*}"
    [ "$kind" = slow ] && continue
    mkdir -p "$res/findings/$t"
    cp "$a" "$res/findings/$t/crash-$t-$(sha1sum "$a" | cut -c1-16)"
    nf=$((nf + 1))
    touch "$dir/found.$slot"
  done
  tail -n 30 "$w/log" >"$res/logs/$slot-$n-$t.tail"
  (
    flock 9
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$slot" "$t" "$used" "$ex" "${rate:-?}" "${cov:-0}" "${ft:-0}" \
      "$(ls "$w/new" | wc -l)" "$nf" >>"$out/segments.tsv"
    aggregate
  ) 9>"$dir/lock"
}

results_tar() {   # one tar: the new inputs renamed to fuzz/corpus/<target>/, findings, log tails
  (cd "$dir/work" 2>/dev/null && find . -path './*/new/*' -type f | sed 's,^\./,,') >"$dir/newlist"
  cp "$out/segments.tsv" "$res/"
  tar cf - -C "$dir/work" -T "$dir/newlist" \
      --transform 's,^[0-9]*-[0-9]*-\([a-z0-9_]*\)/new/,fuzz/corpus/\1/,' \
      -C "$res" findings logs segments.tsv | xz -3 -T2 >"$out/results.tar.xz"
}

finish() {
  trap '' INT TERM
  touch "$dir/stop"
  [ -n "${wd:-}" ] && kill "$wd" 2>/dev/null
  # interrupt running workers: libFuzzer prints its final stats on SIGINT
  for p in "$dir"/work/*/pid; do [ -f "$p" ] && kill -INT "$(cat "$p")" 2>/dev/null; done
  wait
  (flock 9; aggregate) 9>"$dir/lock"
  results_tar
  local total; total=$(awk -F'\t' '{s += $4} END {print s + 0}' "$out/segments.tsv")
  echo "fuzz_bg: done at $(date -u +%H:%M:%S), $total executions in all; $(du -sh "$out" | cut -f1) in $out" >&2
  cat "$out/summary.md" >&2
  rm -rf "$dir"
}
trap 'echo "fuzz_bg: signal, finishing" >&2; finish; exit 130' INT TERM

slots=()
for ((slot = 0; slot < jobs; slot++)); do
  awk -v s="$slot" '$1 == s {print $2, $3}' "$dir/schedule.txt" >"$dir/slot.$slot"
  [ -s "$dir/slot.$slot" ] || continue
  # a trap (not an ignored signal, which libFuzzer would inherit) that only marks the stop: the slot
  # outlives a signal to the process group long enough to record its interrupted worker's count
  ( trap 'touch "$dir/stop"' INT TERM; n=0
    while read -r t s; do
      # a finding ends a libFuzzer run: the rest of the segment's time goes to a fresh run of the target
      end=$(( $(date +%s) + s )); runs=0
      while [ "$runs" -lt 4 ] && [ ! -e "$dir/stop" ] && [ $(( end - $(date +%s) )) -ge 10 ]; do
        t0=$(date +%s)
        segment "$slot" "$n" "$t" $(( end - $(date +%s) )) || break      # not run (stopped, past the deadline)
        n=$((n + 1)); runs=$((runs + 1))   # at most 4 runs: a seed that crashes at once would loop
        [ -e "$dir/found.$slot" ] || [ $(( $(date +%s) - t0 )) -ge 5 ] || break   # ended early, no finding
        rm -f "$dir/found.$slot"
      done
    done <"$dir/slot.$slot" ) &
  slots+=($!)
done
# a watchdog: past SECONDS - reserve + 5, interrupt whatever still runs
( sleep $(( fuzz_secs + 5 )) & sp=$!; trap 'kill $sp 2>/dev/null; exit 0' TERM; wait $sp; for p in "$dir"/work/*/pid; do [ -f "$p" ] && kill -INT "$(cat "$p")" 2>/dev/null; done ) &
wd=$!
wait "${slots[@]}" 2>/dev/null
kill "$wd" 2>/dev/null
finish
found=$(awk -F'\t' '{s += $9} END {print s + 0}' "$out/segments.tsv")
[ "$found" = 0 ]
