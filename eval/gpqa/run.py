#!/usr/bin/env python3
"""GPQA: four-way multiple choice, the model's letter judged against the correct choice.

The dataset: GPQA's CSV (gpqa_diamond.csv, gpqa_main.csv, ...: `Question`, `Correct Answer`,
`Incorrect Answer 1..3`, `Record ID` naming the items; names matched without regard to case), or the same
columns in JSONL / Parquet. The four choices of each question are put in an order drawn from
random.Random("<--shuffle-seed>:<item id>"), the same on every run and machine. The prompt is
simple-evals' (what DeepSeek reports GPQA-Diamond with): "Answer the following multiple choice question.
The last line of your response should be of the following format: 'Answer: $LETTER' ...". Judged by rule
(the chosen letter: "Answer: C", "the answer is (C)", \\boxed{C}, a reply that is just the letter; never
a capital letter inside prose) or by the LLM judge.

    bash eval/gpqa/run.sh --data gpqa_diamond.csv [--samples 4] [--shuffle-seed 0] [--output gpqa.json]
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import datafiles  # noqa: E402
import judged_eval  # noqa: E402
import rule_judge as rules  # noqa: E402

NAME = "gpqa"
LETTERS = "ABCD"
PROMPT = """Answer the following multiple choice question. The last line of your response should be of the following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by step before answering.

{question}

A) {A}
B) {B}
C) {C}
D) {D}"""


def add_arguments(p):
    p.add_argument("--shuffle-seed", type=int, default=0, help="seed of the choice order (default 0)")


def load(path, rows, args):
    wanted = ["Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"]
    col = datafiles.columns(path, rows, wanted, optional=["Record ID"])
    items = []
    for i, r in enumerate(rows):
        texts = [str(r[col[w]] if r[col[w]] is not None else "").strip() for w in wanted]
        if not all(texts):
            empty = [w for w, t in zip(wanted, texts) if not t]
            raise datafiles.DataError(f"{path}: row {i + 1}: empty {', '.join(empty)}")
        item_id = r[col["Record ID"]] if "Record ID" in col and r[col["Record ID"]] else i
        choices = texts[1:]  # correct first, then the three wrong ones
        order = list(range(4))
        random.Random(f"{args.shuffle_seed}:{item_id}").shuffle(order)
        shown = [choices[j] for j in order]
        gold = LETTERS[order.index(0)]
        prompt = PROMPT.format(question=texts[0], **dict(zip(LETTERS, shown)))
        items.append({"id": item_id, "_index": i, "question": prompt, "gold": f"{gold}) {choices[0]}",
                      "gold_letter": gold, "prompt": [{"role": "user", "content": prompt}]})
    return items, {}


def rule_judge(item, response):
    got = rules.extract_letter(response, LETTERS)
    return got, got == item["gold_letter"]


if __name__ == "__main__":
    judged_eval.main(sys.modules[__name__])
