#!/usr/bin/env bash
# GPQA (the CSV's four choices shuffled by a seed), judged by rule or by an LLM judge: see eval/gpqa/run.py --help.
#   bash eval/gpqa/run.sh --data gpqa_diamond.csv [--model DIR | --base-url URL] [--samples N] [--output FILE]
# PYTHON: the interpreter that has eval/requirements.txt (default python3)
exec "${PYTHON:-python3}" "$(dirname "$0")/run.py" "$@"
