#!/usr/bin/env bash
# scripts/fuzz_bg_ingest.sh OUTDIR...: brings the results of scripts/fuzz_bg.sh runs home: for each
# OUTDIR (runs.tsv, results.tar.xz), merges each target's new inputs into fuzz/corpus/<target>/ with
# libFuzzer's -merge=1 using build-fuzz/fuzz_<target> (the corpus grows by the minimal set that adds
# coverage, as scripts/fuzz_target.sh does), copies the findings (findings/<target>/crash-*) into the
# corpus, where the replay tests run them, and appends the run's ledger lines to fuzz/runs.tsv with the
# corpus+ column set to what the merge added. Prints one line per target. Run the replay tests and
# commit afterwards. Exit status 1 when a run had a finding (fix it before committing).
set -uo pipefail
cd "$(dirname "$0")/.."
found=0
for out in "$@"; do
  [ -f "$out/runs.tsv" ] || { echo "fuzz_bg_ingest: $out has no runs.tsv" >&2; continue; }
  tmp=$(mktemp -d)
  [ -f "$out/results.tar.xz" ] && xz -dc "$out/results.tar.xz" | tar xf - -C "$tmp"
  declare -A added=()
  for d in "$tmp"/fuzz/corpus/*/; do
    [ -d "$d" ] || continue
    t=$(basename "$d")
    bin=build-fuzz/fuzz_$t
    [ -x "$bin" ] || { echo "fuzz_bg_ingest: no $bin (./build.sh fuzz): $t not merged" >&2; continue; }
    before=$(ls "fuzz/corpus/$t" | wc -l)
    DI_SOURCE_DIR=$PWD "$bin" -merge=1 -timeout=20 -rss_limit_mb=2048 "fuzz/corpus/$t" "$d" >"$tmp/merge-$t.log" 2>&1 ||
      echo "fuzz_bg_ingest: $t: merge failed (see $tmp/merge-$t.log)" >&2
    added[$t]=$(( $(ls "fuzz/corpus/$t" | wc -l) - before ))
  done
  for f in "$tmp"/findings/*/*; do
    [ -f "$f" ] || continue
    t=$(basename "$(dirname "$f")")
    cp "$f" "fuzz/corpus/$t/"
    echo "fuzz_bg_ingest: FINDING $t: fuzz/corpus/$t/$(basename "$f")" >&2
    found=1
  done
  while IFS=$'\t' read -r day commit machine secs t ex rate cov ft plus nf files; do
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t+%s\t%s\t%s\n' "$day" "$commit" "$machine" "$secs" "$t" "$ex" "$rate" \
      "$cov" "$ft" "${added[$t]:-0}" "$nf" "$files" >>fuzz/runs.tsv
    echo "fuzz_bg_ingest: $t: $ex executions in $secs core-s, corpus +${added[$t]:-0} (of ${plus#+} new inputs), $nf findings"
  done <"$out/runs.tsv"
  unset added
  rm -rf "$tmp"
done
exit $found
