#!/usr/bin/env python3
"""lm-evaluation-harness's `local-completions` against `deepinfer serve`, compared with the in-process
driver (eval/multiple_choice.py's LLM.loglikelihood): every choice's log-likelihood must agree.

Not run by CI (lm-eval and its dependencies, datasets/pyarrow/scikit-learn/..., are a large install);
run it by hand and record the result in docs/PERFORMANCE.md:

    python3 -m pip install "lm-eval[api]==0.4.13"
    HF_DATASETS_OFFLINE=1 PYTHONPATH=python python3 eval/lmeval_server_check.py [--model models/default]
        [--tasks eval/tasks/multiple_choice.jsonl] [--tolerance 1e-4]

The task is a local YAML (dataset_path json, data_files = the task file: nothing is downloaded).
lm-eval runs once per tokenized_requests in (true, false) with the model's own tokenizer
(tokenizer_backend=huggingface) and add_bos_token=True, so its sequences are [BOS] + context +
continuation as the in-process driver scores them: with token ids the server scores them as sent;
with strings it is sent their text (the BOS token's text first), which the server encodes without a
second BOS. A third run takes lm-eval's default backend, which finds /tokenizer_info and tokenizes
through the server ("remote"); lm-eval then sends no BOS, so its scores are those of the sequences
without it and are only reported.

Generation: `local-chat-completions` (with apply_chat_template) on the chat items of
eval/tasks/generation.jsonl (greedy, 32 tokens) must write exactly what eval/generation.py's LLM.chat
writes in-process. Exit status 0 when the checked runs agree.
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "eval"))

TASK_YAML = """task: deepinfer_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
target_delimiter: " "
metric_list:
  - metric: acc
"""


CHAT_YAML = """task: deepinfer_chat
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["<｜end▁of▁sentence｜>"]
  max_gen_toks: 32
  temperature: 0
  do_sample: false
metric_list:
  - metric: exact_match
"""


def start_server(cli, model):
    log = tempfile.NamedTemporaryFile(prefix="di-lmeval-", suffix=".log", delete=False)
    proc = subprocess.Popen([cli, "serve", model, "--port", "0", "--threads", "2", "--served-model-name", "default",
                             "--disable-log-requests"], stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.time() + 120
    while time.time() < deadline:
        text = open(log.name, encoding="utf-8", errors="replace").read()
        m = re.search(r"listening on http://[^ ]+:(\d+)", text)
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            raise RuntimeError("server exited:\n" + text)
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def lmeval_loglikelihoods(port, model, task_dir, backend_args):
    import lm_eval
    from lm_eval.tasks import TaskManager
    args = f"base_url=http://127.0.0.1:{port}/v1/completions,model=default,num_concurrent=1,max_retries=1," + backend_args
    if "tokenizer_backend=huggingface" in backend_args:
        args += f",tokenizer={model}"
    out = lm_eval.simple_evaluate(model="local-completions", model_args=args, tasks=["deepinfer_mc"],
                                  task_manager=TaskManager(include_path=task_dir), log_samples=True, batch_size=1)
    samples = sorted(out["samples"]["deepinfer_mc"], key=lambda s: s["doc_id"])
    lls = [[float(r[0][0]) for r in s["resps"]] for s in samples]
    return lls, out["results"]["deepinfer_mc"]["acc,none"]


def lmeval_chat_answers(port, task_dir):
    import lm_eval
    from lm_eval.tasks import TaskManager
    args = f"base_url=http://127.0.0.1:{port}/v1/chat/completions,model=default,num_concurrent=1,max_retries=1"
    out = lm_eval.simple_evaluate(model="local-chat-completions", model_args=args, tasks=["deepinfer_chat"],
                                  task_manager=TaskManager(include_path=task_dir), log_samples=True,
                                  apply_chat_template=True)
    samples = sorted(out["samples"]["deepinfer_chat"], key=lambda s: s["doc_id"])
    return [s["resps"][0][0] for s in samples]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    p.add_argument("--tasks", default=os.path.join(ROOT, "eval", "tasks", "multiple_choice.jsonl"))
    p.add_argument("--cli", default=os.path.join(ROOT, "build", "deepinfer"))
    p.add_argument("--tolerance", type=float, default=1e-4)
    a = p.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from deepinfer import LLM
    items = [json.loads(line) for line in open(a.tasks, encoding="utf-8") if line.strip()]
    llm = LLM(a.model)
    flat = llm.loglikelihood([(it["context"], " " + c) for it in items for c in it["choices"]])
    llm.close()
    want, k = [], 0
    for it in items:
        want.append([lp for lp, _ in flat[k:k + len(it["choices"])]])
        k += len(it["choices"])
    chats = [json.loads(line) for line in open(os.path.join(ROOT, "eval", "tasks", "generation.jsonl"), encoding="utf-8")
             if '"messages"' in line]
    from deepinfer import SamplingParams
    llm = LLM(a.model)
    chat_want = [o.outputs[0].text for o in llm.chat([c["messages"] for c in chats],
                                                      [SamplingParams(temperature=0, max_tokens=32) for _ in chats])]
    llm.close()
    acc_want = sum(max(range(len(w)), key=lambda i: (w[i], -i)) == it["gold"] for w, it in zip(want, items)) / len(items)
    proc, port = start_server(a.cli, a.model)
    report, ok = {"in_process_acc": acc_want, "n_items": len(items), "runs": {}}, True
    try:
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "deepinfer_mc.yaml"), "w", encoding="utf-8") as f:
                f.write(TASK_YAML.format(data=os.path.abspath(a.tasks)))
            runs = [("tokenized_requests=true", "tokenizer_backend=huggingface,add_bos_token=True,tokenized_requests=True", True),
                    ("tokenized_requests=false", "tokenizer_backend=huggingface,add_bos_token=True,tokenized_requests=False", True),
                    ("remote tokenizer (no BOS), tokenized_requests=true", "tokenized_requests=True", False)]
            for name, backend, checked in runs:
                got, acc = lmeval_loglikelihoods(port, a.model, d, backend)
                diff = max(abs(g - w) for gs, ws in zip(got, want) for g, w in zip(gs, ws))
                report["runs"][name] = {"acc": acc, "max_abs_diff_vs_in_process": diff, "checked": checked}
                if checked and (diff > a.tolerance or len(got) != len(want)):
                    ok = False
            data = os.path.join(d, "chat.jsonl")
            with open(data, "w", encoding="utf-8") as f:
                for c in chats:
                    f.write(json.dumps({"question": c["messages"][-1]["content"], "answer": c["answer"]}) + "\n")
            with open(os.path.join(d, "deepinfer_chat.yaml"), "w", encoding="utf-8") as f:
                f.write(CHAT_YAML.format(data=data))
            got = lmeval_chat_answers(port, d)
            same = sum(g == w for g, w in zip(got, chat_want))
            report["runs"]["local-chat-completions (generation)"] = {"items": len(chats), "identical_answers": same,
                                                                      "checked": True, "lm_eval": got,
                                                                      "in_process": chat_want}
            if same != len(chats) or len(got) != len(chats):
                ok = False
    finally:
        proc.terminate()
        proc.wait(30)
    report["ok"] = ok
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
