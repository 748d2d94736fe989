#!/usr/bin/env bash
# AIME with DeepSeek-R1's prompt, judged by rule or by an LLM judge: see eval/aime/run.py --help.
#   bash eval/aime/run.sh --data aime_2024.jsonl [--model DIR | --base-url URL] [--samples N] [--output FILE]
# PYTHON: the interpreter that has eval/requirements.txt (default python3)
exec "${PYTHON:-python3}" "$(dirname "$0")/run.py" "$@"
