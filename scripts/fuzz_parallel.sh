#!/usr/bin/env bash
# scripts/fuzz_parallel.sh PACK JOBS SECONDS OUTDIR: the long fuzz run on a many-core machine (the
# device host's 16 cores), from a pack made here by scripts/fuzz_pack.sh: runs every target of the
# pack for SECONDS, JOBS at a time (one core each; more targets than JOBS wait for a free one), each
# through fuzz_target.sh (its corpus, merge of new coverage, findings kept as crash-* inputs), and
# writes into OUTDIR:
#   summary.md      the run's table (target, executions, exec/s, cov, ft, corpus+, findings)
#   runs.tsv        the ledger lines of the run (append them to fuzz/runs.tsv here)
#   corpus-new.tar.xz  the corpus files the run added, crash-* included, as fuzz/corpus/<target>/...
#   logs/<target>.log  libFuzzer's output
# Back here: `tar xJf OUTDIR/corpus-new.tar.xz && cat OUTDIR/runs.tsv >> fuzz/runs.tsv`, then the
# replay tests, then commit. Exit status 1 when a target had a finding.
# One line on the device: scripts/fuzz_parallel.sh fuzzpack.tar.xz 16 1500 "$OUT"
# (FUZZ_TARGETS="engine tokenizer" runs only those; FUZZ_MACHINE names the machine in the ledger.)
set -uo pipefail
pack=$1 jobs=$2 secs=$3 out=$4
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
dir=$(mktemp -d)
tar xJf "$pack" -C "$dir" || { echo "fuzz_parallel: cannot unpack $pack" >&2; exit 2; }
root="$dir/fuzzpack"
export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DI_SOURCE_DIR="$root"
cp -r "$root/fuzz/corpus" "$dir/corpus-before"
commit=$(cat "$root/COMMIT")
machine="${FUZZ_MACHINE:-$(nproc)-core $(uname -n)}"
echo "fuzz_parallel: $(ls "$root/bin" | wc -l) targets, $jobs at a time, $secs s each, commit $commit ($(date -u +%H:%M:%S))" >&2
ls "$root/bin" | { if [ -n "${FUZZ_TARGETS:-}" ]; then grep -xE "fuzz_($(tr ' ' '|' <<<"$FUZZ_TARGETS"))"; else cat; fi; } | xargs -P "$jobs" -I{} sh -c \
  'cd "$1" && scripts/fuzz_target.sh "bin/$2" "fuzz/corpus/${2#fuzz_}" "work/${2#fuzz_}" "$3" >"$4/line.${2#fuzz_}"; \
   cp "work/${2#fuzz_}/log" "$4/logs/${2#fuzz_}.log" 2>/dev/null; echo "fuzz_parallel: $2 done ($(date -u +%H:%M:%S))" >&2' \
  _ "$root" {} "$secs" "$out"
found=0
{
  echo "| target | executions | exec/s | cov | ft | corpus + | findings |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | --- |"
} >"$out/summary.md"
: >"$out/runs.tsv"
for f in "$out"/line.*; do
  IFS=$'\t' read -r t execs rate cov ft added nfind files <"$f"
  [ "${nfind:-0}" != 0 ] && found=1
  echo "| $t | $execs | $rate | $cov | $ft | $added | $nfind${files:+ $files} |" >>"$out/summary.md"
  printf '%s\t%s\t%s\t%s\t%s\n' "$(date -u +%Y-%m-%d)" "$commit" "$machine" "$secs" "$(cat "$f")" >>"$out/runs.tsv"
  rm -f "$f"
done
# the corpus files that are new (merged coverage and findings), as paths fuzz/corpus/<target>/<file>
(cd "$root" && find fuzz/corpus -type f | while read -r p; do [ -e "$dir/corpus-before/${p#fuzz/corpus/}" ] || echo "$p"; done) \
  >"$dir/new.txt"
tar cJf "$out/corpus-new.tar.xz" -C "$root" -T "$dir/new.txt"
echo "fuzz_parallel: $(wc -l <"$dir/new.txt") new corpus files; $out/summary.md:" >&2
cat "$out/summary.md"
rm -rf "$dir"
exit $found
