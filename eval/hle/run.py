#!/usr/bin/env python3
"""Humanity's Last Exam: free-form and multiple-choice questions, judged by an LLM judge.

The dataset: HLE's Parquet (cais/hle test split: `id`, `question`, `image`, `answer`, `answer_type`;
JSONL / CSV with those columns work too, names matched without regard to case). Questions with an image
(a non-empty `image`) are skipped and counted (`skipped.image` in the results): the engine reads text
only. Each question goes as the user turn after HLE's own system prompt, which asks for
"Explanation: ... / Exact Answer: ... / Confidence: ..%" ("Answer:" for multipleChoice questions);
`--system-role user` puts that text in a user turn first instead, for models without a system role.
The judge is HLE's (its judge prompt; EVAL_JUDGE_URL, EVAL_JUDGE_MODEL, EVAL_JUDGE_API_KEY must be
set: there is no rule judge for free-form answers). Besides accuracy, the results hold HLE's RMS
calibration error (in %) of the confidence the judge read from each reply (100 when none).

    EVAL_JUDGE_URL=... EVAL_JUDGE_MODEL=... EVAL_JUDGE_API_KEY=... bash eval/hle/run.sh --data hle_test.parquet
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import datafiles  # noqa: E402
import judged_eval  # noqa: E402

NAME = "hle"
# HLE's system prompts (hle_eval/run_model_predictions.py), verbatim.
SYSTEM_EXACT_ANSWER = ("Your response should be in the following format:\nExplanation: {your explanation for your "
                       "final answer}\nExact Answer: {your succinct, final answer}\nConfidence: {your confidence score "
                       "between 0% and 100% for your answer}")
SYSTEM_MC = ("Your response should be in the following format:\nExplanation: {your explanation for your answer "
             "choice}\nAnswer: {your chosen answer}\nConfidence: {your confidence score between 0% and 100% for your "
             "answer}")
rule_judge = None  # free-form answers: the LLM judge only


def add_arguments(p):
    p.add_argument("--system-role", choices=("system", "user"), default="system",
                   help="the role HLE's format instructions are sent with (default: system)")


def load(path, rows, args):
    col = datafiles.columns(path, rows, ["question", "answer"], optional=["id", "answer_type", "image"])
    items, images = [], 0
    for i, r in enumerate(rows):
        if "image" in col and r[col["image"]]:
            images += 1
            continue
        q = str(r[col["question"]] or "").strip()
        a = str(r[col["answer"]] if r[col["answer"]] is not None else "").strip()
        if not q or not a:
            raise datafiles.DataError(f"{path}: row {i + 1}: empty {'question' if not q else 'answer'}")
        mc = "answer_type" in col and str(r[col["answer_type"]]).strip().lower() == "multiplechoice"
        system = SYSTEM_MC if mc else SYSTEM_EXACT_ANSWER
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": q}] if args.system_role == "system" \
            else [{"role": "user", "content": system + "\n\n" + q}]
        items.append({"id": r[col["id"]] if "id" in col else i, "_index": i, "question": q, "gold": a,
                      "answer_type": "multipleChoice" if mc else "exactMatch", "prompt": msgs})
    return items, {"image": images}


def confidence_of(sample):
    c = (sample.get("judge") or {}).get("confidence")
    try:
        c = float(c)
    except (TypeError, ValueError):
        return 1.0
    return min(100.0, max(0.0, c)) / 100.0


def calibration_error(conf, correct, beta=100):
    """HLE's RMS calibration error: items sorted by confidence, cut into bins of `beta` (the last bin
    takes the remainder), sqrt(sum over bins of |bin| / N * (mean confidence - accuracy)^2). HLE's
    script leaves the last bin out of the sum and needs N >= beta; here every bin counts, and fewer
    than beta items make one bin."""
    pairs = sorted(zip(conf, correct), key=lambda p: p[0])
    n = len(pairs)
    if n == 0:
        return None
    nb = max(1, n // beta)
    total = 0.0
    for b in range(nb):
        part = pairs[b * beta:(b + 1) * beta if b < nb - 1 else n]
        diff = sum(p[0] for p in part) / len(part) - sum(p[1] for p in part) / len(part)
        total += len(part) / n * diff * diff
    return math.sqrt(total)


def extra_metrics(items):
    conf, ok = [], []
    for it in items:
        for s in it["samples"]:
            s["confidence"] = confidence_of(s)
            conf.append(s["confidence"])
            ok.append(1.0 if s["correct"] else 0.0)
    ce = calibration_error(conf, ok)
    return {"calibration_error": 100.0 * ce if ce is not None else None}


if __name__ == "__main__":
    judged_eval.main(sys.modules[__name__])
