#!/usr/bin/env python3
"""AIME: the model solves each problem; its integer answer is judged against the reference.

The dataset: JSONL, Parquet or CSV with `problem` and `answer` columns, names matched without regard to
case (HuggingFaceH4/aime_2024's problem / answer, Maxwell-Jia/AIME_2024's Problem / Answer); an `id`
column names the items (else the row number). The prompt is DeepSeek-R1's: the problem, then "Please
reason step by step, and put your final answer within \\boxed{}.", as the user turn of the model's chat
template. Judged by rule (the integer in the last \\boxed{}, else the last answer line, leading zeros
ignored) or by the LLM judge (HLE's judge prompt).

    bash eval/aime/run.sh --data aime_2024.parquet [--samples 16] [--output aime.json] [--base-url URL]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import datafiles  # noqa: E402
import judged_eval  # noqa: E402
import rule_judge as rules  # noqa: E402

NAME = "aime"
PROMPT = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def load(path, rows, args):
    col = datafiles.columns(path, rows, ["problem", "answer"], optional=["id"])
    items = []
    for i, r in enumerate(rows):
        problem = str(r[col["problem"]] or "").strip()
        if not problem:
            raise datafiles.DataError(f"{path}: row {i + 1}: empty problem")
        try:
            gold = rules.parse_gold_integer(r[col["answer"]])
        except ValueError as e:
            raise datafiles.DataError(f"{path}: row {i + 1}: {e}") from None
        items.append({"id": r[col["id"]] if "id" in col else i, "_index": i, "question": problem, "gold": str(gold),
                      "prompt": [{"role": "user", "content": PROMPT.format(problem=problem)}]})
    return items, {}


def rule_judge(item, response):
    got = rules.extract_integer(response)
    return got, got is not None and got == int(item["gold"])


if __name__ == "__main__":
    judged_eval.main(sys.modules[__name__])
