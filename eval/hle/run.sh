#!/usr/bin/env bash
# Humanity's Last Exam (text questions; image ones skipped and counted), judged by an LLM judge
# (EVAL_JUDGE_URL, EVAL_JUDGE_MODEL, EVAL_JUDGE_API_KEY): see eval/hle/run.py --help.
#   bash eval/hle/run.sh --data hle_test.parquet [--model DIR | --base-url URL] [--output FILE]
# PYTHON: the interpreter that has eval/requirements.txt (default python3)
exec "${PYTHON:-python3}" "$(dirname "$0")/run.py" "$@"
