#!/usr/bin/env bash
# Speculative decoding (MTP drafts) against plain decoding on one backend, with `deepinfer generate`:
# for each draft length K (0 = off) two runs of greedy generation of N tokens; prints generation tok/s,
# engine steps and acceptance, and fails if any run's token ids differ from plain decoding's
# (speculative decoding is lossless).
#   bench/bench_spec.sh [BIN] [MODEL_DIR]   (defaults: build/deepinfer, models/default)
# Environment: DEEPINFER_ACCELERATOR (cpu | cuda), KS ("0 1 3 5"), CONF (min draft confidence, 0.3),
# N (256 new tokens), PROMPT, ARGS (extra generate arguments, e.g. "--threads 2").
set -uo pipefail
BIN="${1:-build/deepinfer}"
MODEL="${2:-models/default}"
N="${N:-256}"
PROMPT="${PROMPT:-The history of the city}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
printf "%-4s %-4s %12s %7s %9s %9s %s\n" K run "tok/s" steps drafted accepted "mean accepted length"
for k in ${KS:-0 1 3 5}; do
  for run in 1 2; do
    # shellcheck disable=SC2086
    if ! "$BIN" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens "$N" --temperature 0 --ignore-eos \
        --stats --output-format json --speculative-tokens "$k" --speculative-min-confidence "${CONF:-0.3}" \
        ${ARGS:-} >"$tmp/out.json" 2>"$tmp/err.txt"; then
      echo "K=$k run $run: generate failed:"; cat "$tmp/err.txt"; fail=1; continue
    fi
    ids=$(grep -o '"ids":\[[^]]*\]' "$tmp/out.json")
    [ "$k" = 0 ] && [ "$run" = 1 ] && echo "$ids" >"$tmp/ref"
    same=same
    if [ -f "$tmp/ref" ] && [ "$ids" != "$(cat "$tmp/ref")" ]; then same="DIFFERENT ids"; fail=1; fi
    tps=$(grep -o '[0-9.]* tok/s generation' "$tmp/err.txt" | cut -d' ' -f1)
    steps=$(grep -o '[0-9]* steps' "$tmp/err.txt" | cut -d' ' -f1)
    spec=$(grep -o '[0-9]* drafted, [0-9]* accepted ([0-9.]*%), mean accepted length [0-9.]*' "$tmp/err.txt")
    drafted=$(echo "$spec" | awk '{print $1}')
    accepted=$(echo "$spec" | awk '{print $3 $5}' | tr -d ',')
    mal=$(echo "$spec" | awk '{print $NF}')
    printf "%-4s %-4s %12s %7s %9s %9s %s  %s\n" "$k" "$run" "$tps" "$steps" "${drafted:--}" "${accepted:--}" "${mal:--}" "$same"
  done
done
[ $fail = 0 ] && echo "bench_spec: every run's ids equal plain decoding's" || echo "bench_spec: FAIL"
exit $fail
