"""The AIME / GPQA / HLE drivers (eval/aime, eval/gpqa, eval/hle) and their judges.

- Dataset readers on sample files made here in each format (JSONL, CSV, Parquet through pyarrow; the
  two public AIME layouts), GPQA's seeded choice order (a permutation, the gold letter following the
  correct text, the same on a rerun), HLE's image rows skipped and counted.
- The rule judges on tricky replies (several boxed values, leading zeros, nested braces, reasoning
  that must be dropped, a capital letter inside prose).
- pass@k against a brute-force count over all k-subsets of the samples.
- The LLM judge against a stand-in judge server started here on 127.0.0.1: the request it gets (HLE's
  prompt, response_format json_schema), JSON and plain yes/no verdicts, retries after 503s, and an
  unreachable judge (retried, then a clear error).
- `bash eval/aime/run.sh` end to end on the shipped model (results file, counts, verdicts rederived
  with the rule judge, --resume); the same driver against a stand-in OpenAI server through --base-url
  (known replies, so the accuracy is known); HLE end to end with the stand-in judge (calibration error
  recomputed); error paths with their exit status and message.
"""
import csv
import http.server
import itertools
import json
import math
import os
import socket
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVAL = os.path.join(ROOT, "eval")
sys.path.insert(0, EVAL)
sys.path.insert(0, os.path.join(ROOT, "python"))

import datafiles  # noqa: E402
import judged_eval  # noqa: E402
import llm_judge  # noqa: E402
import rule_judge  # noqa: E402

try:
    import pyarrow
    import pyarrow.parquet as pq
except ImportError:  # tests/python/requirements.txt pins it; a bare machine skips the Parquet cases
    pyarrow = None
need_pyarrow = pytest.mark.skipif(pyarrow is None, reason="pyarrow not installed (pip install -r eval/requirements.txt)")


def load_bench(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(EVAL, name, "run.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


AIME, GPQA, HLE = load_bench("aime"), load_bench("gpqa"), load_bench("hle")


class Args:
    shuffle_seed = 0
    system_role = "system"


AIME_ROWS = [{"id": "2024-I-1", "problem": "What is 1+1?", "answer": "002"},
             {"id": "2024-I-2", "problem": "What is 2+3?", "answer": "5"},
             {"id": "2024-I-3", "problem": "Compute 6 times 7.", "answer": "42"}]


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def write_parquet(path, rows):
    pq.write_table(pyarrow.Table.from_pylist(rows), path)


# ---- readers ---------------------------------------------------------------------------------------
def test_aime_layouts_jsonl_and_csv(tmp_path):
    hf = tmp_path / "aime.jsonl"
    write_jsonl(hf, AIME_ROWS)
    mj = tmp_path / "aime.csv"  # Maxwell-Jia/AIME_2024's capitalised names, integer answers
    write_csv(mj, [{"ID": r["id"], "Problem": r["problem"], "Answer": int(r["answer"])} for r in AIME_ROWS])
    for p in (hf, mj):
        items, skipped = AIME.load(str(p), datafiles.read_rows(str(p)), Args)
        assert [it["id"] for it in items] == [r["id"] for r in AIME_ROWS]
        assert [it["gold"] for it in items] == ["2", "5", "42"]
        assert items[0]["prompt"][0]["content"].startswith("What is 1+1?\nPlease reason step by step")
        assert skipped == {}


@need_pyarrow
def test_aime_parquet_maxwell_layout(tmp_path):
    p = tmp_path / "aime.parquet"
    write_parquet(p, [{"ID": r["id"], "Problem": r["problem"], "Answer": int(r["answer"])} for r in AIME_ROWS])
    items, _ = AIME.load(str(p), datafiles.read_rows(str(p)), Args)
    assert [it["gold"] for it in items] == ["2", "5", "42"]
    assert items[2]["question"] == "Compute 6 times 7."


def gpqa_rows(n):
    return [{"Record ID": f"rec{i}", "Question": f"Question {i}?", "Correct Answer": f"right {i}",
             "Incorrect Answer 1": f"wrong a{i}", "Incorrect Answer 2": f"wrong b{i}", "Incorrect Answer 3": f"wrong c{i}"}
            for i in range(n)]


def test_gpqa_choices_shuffled_by_seed(tmp_path):
    p = tmp_path / "gpqa.csv"
    write_csv(p, gpqa_rows(12))
    rows = datafiles.read_rows(str(p))
    items = GPQA.load(str(p), rows, Args)[0]
    again = GPQA.load(str(p), rows, Args)[0]
    other = type("A", (), {"shuffle_seed": 7})
    moved = GPQA.load(str(p), rows, other)[0]
    golds = []
    for i, it in enumerate(items):
        text = it["prompt"][0]["content"]
        shown = {L: text.split(f"\n{L}) ")[1].split("\n")[0] for L in "ABCD"}
        assert sorted(shown.values()) == sorted([f"right {i}", f"wrong a{i}", f"wrong b{i}", f"wrong c{i}"])
        assert shown[it["gold_letter"]] == f"right {i}"
        golds.append(it["gold_letter"])
    assert [it["prompt"] for it in again] == [it["prompt"] for it in items]  # same seed, same order
    assert [it["prompt"] for it in moved] != [it["prompt"] for it in items]
    assert len(set(golds)) > 1  # not always the same position


@need_pyarrow
def test_hle_parquet_skips_images(tmp_path):
    p = tmp_path / "hle.parquet"
    write_parquet(p, [
        {"id": "h1", "question": "Name the capital of France.", "image": "", "answer": "Paris", "answer_type": "exactMatch"},
        {"id": "h2", "question": "What is shown?", "image": "data:image/png;base64,AAAA", "answer": "a cat",
         "answer_type": "exactMatch"},
        {"id": "h3", "question": "Pick one.\nA. x\nB. y", "image": "", "answer": "B", "answer_type": "multipleChoice"}])
    items, skipped = HLE.load(str(p), datafiles.read_rows(str(p)), Args)
    assert skipped == {"image": 1}
    assert [it["id"] for it in items] == ["h1", "h3"]
    assert items[0]["prompt"][0] == {"role": "system", "content": HLE.SYSTEM_EXACT_ANSWER}
    assert items[1]["prompt"][0]["content"] == HLE.SYSTEM_MC
    assert "Confidence:" in HLE.SYSTEM_MC and "Explanation:" in HLE.SYSTEM_EXACT_ANSWER


def test_reader_errors(tmp_path):
    with pytest.raises(datafiles.DataError, match="no such file"):
        datafiles.read_rows(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "x", "answer": 1}\nnot json\n')
    with pytest.raises(datafiles.DataError, match=r"bad.jsonl:2: not JSON"):
        datafiles.read_rows(str(bad))
    cols = tmp_path / "cols.csv"
    write_csv(cols, [{"question": "q", "solution": "s"}])
    with pytest.raises(datafiles.DataError, match=r"missing column\(s\) problem, answer .*the file has: question, solution"):
        AIME.load(str(cols), datafiles.read_rows(str(cols)), Args)
    with pytest.raises(datafiles.DataError, match="unknown file type"):
        datafiles.read_rows(str(tmp_path / "x.xlsx"))


# ---- rule judges -----------------------------------------------------------------------------------
@pytest.mark.parametrize("reply,expected", [
    ("First \\boxed{12}, then corrected: \\boxed{034}", 34),             # the last box, leading zero
    ("<think>maybe \\boxed{7}</think>So the answer is \\boxed{ 007 }.", 7),
    ("reasoning only...</think>\\boxed{\\text{210}}", 210),             # template opened <think> itself
    ("\\boxed{\\frac{1}{2}}", None),                                     # nested braces read whole: not an integer
    ("\\boxed{12} or \\boxed{12 or 13}", None),
    ("We get x = 5.\nFinal answer: 045", 45),
    ("The answer is $1,024$.", 1024),
    ("\\boxed{n = 17}", 17),
    ("I think it is 12, maybe 13", None),                               # no box, no answer line
    ("<think>\\boxed{5}", None),                                         # unclosed reasoning is dropped
])
def test_aime_rule_judge(reply, expected):
    assert rule_judge.extract_integer(reply) == expected


@pytest.mark.parametrize("reply,expected", [
    ("A careful look at B and C shows...\nAnswer: C", "C"),
    ("The answer is (B).", "B"),
    ("A quick estimate suggests the rate doubles. Answer: D", "D"),
    ("A good first step is to balance the equation.", None),           # a letter inside prose
    ("Answer: A\nWait, re-checking... the answer is B", "B"),          # the last statement wins
    ("\\boxed{A}", "A"),
    ("(C).", "C"),
    ("<think>Answer: A</think>Answer: D", "D"),
    ("The answer is Avogadro's number.", None),
])
def test_gpqa_rule_judge(reply, expected):
    assert rule_judge.extract_letter(reply) == expected


def test_pass_at_k_against_enumeration():
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
                brute = sum(1 for s in subsets if any(s)) / len(subsets)
                assert judged_eval.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
    assert judged_eval.ks_for(6) == [1, 2, 4, 6] and judged_eval.ks_for(1) == [1]


def test_calibration_error():
    # one bin: |mean confidence - accuracy|; two bins of 100 weighted equally
    assert HLE.calibration_error([0.9, 0.7], [1.0, 0.0]) == pytest.approx(0.3)
    conf = [0.2] * 100 + [1.0] * 100
    ok = [0.0] * 100 + [1.0] * 50 + [0.0] * 50
    assert HLE.calibration_error(conf, ok) == pytest.approx(math.sqrt(0.5 * 0.04 + 0.5 * 0.25))


# ---- stand-in servers ------------------------------------------------------------------------------
class StandIn(http.server.ThreadingHTTPServer):
    """A loopback OpenAI-compatible server: `reply(body) -> (status, content or dict)`; `fail_first`
    answers 503 to that many calls first. Records every request body."""
    daemon_threads = True

    def __init__(self, reply, fail_first=0):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.reply, self.fail_first, self.bodies = reply, fail_first, []
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self):
        self.shutdown()
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        srv.bodies.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
        if srv.fail_first > 0:
            srv.fail_first -= 1
            status, content = 503, "busy"
        else:
            status, content = srv.reply(body)
        out = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                       "finish_reason": "stop"}], "usage": {"completion_tokens": 3}}
                         if status == 200 else {"error": content}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def fair_judge(body):
    """Says yes when the [response] contains the [correct_answer] (confidence: the reply's own)."""
    p = body["messages"][0]["content"]
    response = p.split("[response]: ")[1].split("\n\nYour judgement")[0]
    answer = p.split("[correct_answer]: ")[1].split("\n\nreasoning:")[0]
    conf = response.split("Confidence: ")[1].split("%")[0] if "Confidence: " in response else "100"
    return 200, json.dumps({"extracted_final_answer": response, "reasoning": "stand-in",
                            "correct": "yes" if answer in response else "no", "confidence": int(conf)})


@pytest.fixture
def judge_env(monkeypatch):
    def set_url(url):
        monkeypatch.setenv("EVAL_JUDGE_URL", url)
        monkeypatch.setenv("EVAL_JUDGE_MODEL", "stand-in-judge")
        monkeypatch.setenv("EVAL_JUDGE_API_KEY", "k123")
        monkeypatch.setenv("EVAL_JUDGE_BACKOFF", "0.01")
        monkeypatch.setenv("EVAL_JUDGE_RPS", "0")
    return set_url


def test_llm_judge_request_and_verdicts(judge_env):
    srv = StandIn(fair_judge)
    try:
        judge_env(srv.url)
        j = llm_judge.LLMJudge()
        assert j.judge("What is 1+1?", "It is 2.", "2")[0] is True
        assert j.judge("What is 1+1?", "It is 3.", "2")[0] is False
        b = srv.bodies[0]
        assert b["path"] == "/v1/chat/completions" and b["model"] == "stand-in-judge" and b["auth"] == "Bearer k123"
        assert b["response_format"]["type"] == "json_schema"
        assert b["response_format"]["json_schema"]["schema"]["properties"]["correct"]["enum"] == ["yes", "no"]
        assert b["messages"][0]["content"] == llm_judge.JUDGE_PROMPT.format(
            question="What is 1+1?", response="It is 2.", correct_answer="2")
    finally:
        srv.stop()


@pytest.mark.parametrize("content,ok", [("yes", True), ("No, they differ.", False), ("**Yes**", True),
                                        ("extracted_final_answer: 4\ncorrect: no\nconfidence: 90", False),
                                        ('{"correct": "yes", "confidence": 50}', True)])
def test_plain_verdicts(content, ok):
    assert llm_judge.parse_verdict(content)[0] is ok


def test_unclear_verdict_is_an_error():
    with pytest.raises(llm_judge.JudgeError, match="neither yes nor no"):
        llm_judge.parse_verdict("The answers look similar.")


def test_llm_judge_retries_then_succeeds(judge_env):
    srv = StandIn(lambda body: (200, "yes"), fail_first=2)
    try:
        judge_env(srv.url)
        assert llm_judge.LLMJudge().judge("q", "r", "a")[0] is True
        assert len(srv.bodies) == 3
    finally:
        srv.stop()


def closed_port():
    """A loopback port nothing listens on (bound once, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_llm_judge_unreachable(judge_env):
    port = closed_port()
    judge_env(f"http://127.0.0.1:{port}/v1")
    j = llm_judge.LLMJudge(retries=2)
    with pytest.raises(llm_judge.JudgeError, match=rf"127.0.0.1:{port}/v1/chat/completions unreachable after 3 attempts"):
        j.judge("q", "r", "a")
    assert j.http.calls == 3


# ---- the drivers end to end ------------------------------------------------------------------------
def run_sh(bench, *args, env_extra=None, judge_vars=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVAL_")}
    env.update({"PYTHONPATH": os.path.join(ROOT, "python"), "DEEPINFER_PROGRESS": "1",
                "PYTHON": sys.executable, **(env_extra or {})})  # the drivers under this interpreter
    return subprocess.run(["bash", os.path.join(EVAL, bench, "run.sh"), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_aime_end_to_end_on_the_shipped_model(tmp_path):
    data = tmp_path / "aime.jsonl"
    write_jsonl(data, AIME_ROWS)
    out = tmp_path / "aime.json"
    common = ["--model", os.path.join(ROOT, "models", "default"), "--threads", "2", "--max-tokens", "24",
              "--samples", "2", "--output", str(out)]
    r = run_sh("aime", "--data", str(data), "--limit", "2", *common)
    assert r.returncode == 0, r.stderr
    assert "not set: using the rule judge" in r.stderr and "aime [" in r.stderr  # the notice, the progress bar
    first = json.loads(out.read_text())
    assert first["n_items"] == 2 and len(first["items"]) == 2
    r = run_sh("aime", "--resume", *common, env_extra={"EVAL_DATA": str(data)})  # the data through EVAL_DATA
    assert r.returncode == 0, r.stderr
    assert "--resume: 2 item(s) already in" in r.stderr
    res = json.loads(out.read_text())
    assert res["benchmark"] == "aime" and res["n_items"] == 3 and res["n_rows"] == 3 and res["n_samples"] == 2
    assert res["items"][:2] == first["items"]  # kept, not asked again
    assert res["judge"] == {"kind": "rule"} and res["model"]["kind"] == "in-process"
    p1 = []
    for it, row in zip(res["items"], AIME_ROWS):
        assert it["id"] == row["id"] and it["gold"] == str(int(row["answer"]))
        assert it["prompt"] == [{"role": "user", "content": AIME.PROMPT.format(problem=row["problem"])}]
        assert len(it["samples"]) == 2
        for s in it["samples"]:
            assert isinstance(s["response"], str) and s["completion_tokens"] >= 1
            assert s["extracted"] == rule_judge.extract_integer(s["response"])
            assert s["correct"] == (s["extracted"] == int(row["answer"]))
            assert s["verdict"] == ("correct" if s["correct"] else "wrong")
        p1.append(sum(s["correct"] for s in it["samples"]) / 2)
    assert res["accuracy"] == pytest.approx(sum(p1) / 3)
    assert "| aime | 3 | 2 | rule |" in r.stdout


def test_aime_through_base_url_and_llm_judge(tmp_path):
    replies = {"What is 1+1?": "<think>\\boxed{3}</think>So \\boxed{002}", "What is 2+3?": "\\boxed{6}",
               "Compute 6 times 7.": "Final answer: 42"}

    def model(body):
        q = body["messages"][0]["content"].split("\n")[0]
        return 200, replies[q]
    srv, jsrv = StandIn(model), StandIn(fair_judge)
    try:
        data = tmp_path / "aime.csv"
        write_csv(data, AIME_ROWS)
        out = tmp_path / "r.json"
        r = run_sh("aime", "--data", str(data), "--base-url", srv.url, "--samples", "3", "--output", str(out))
        assert r.returncode == 0, r.stderr
        res = json.loads(out.read_text())
        assert [s["correct"] for it in res["items"] for s in it["samples"]] == [True] * 3 + [False] * 3 + [True] * 3
        assert res["accuracy"] == pytest.approx(2 / 3) and res["pass_at_k"] == {"1": pytest.approx(2 / 3),
                                                                                  "2": pytest.approx(2 / 3),
                                                                                  "3": pytest.approx(2 / 3)}
        assert len(srv.bodies) == 9 and srv.bodies[0]["path"] == "/v1/chat/completions"
        # the LLM judge is the default once the variables are set; it sees the reply without its reasoning
        env = {"EVAL_JUDGE_URL": jsrv.url, "EVAL_JUDGE_MODEL": "j", "EVAL_JUDGE_API_KEY": "k",
               "EVAL_JUDGE_BACKOFF": "0.01"}
        r = run_sh("aime", "--data", str(data), "--base-url", srv.url, "--output", str(out), env_extra=env)
        assert r.returncode == 0, r.stderr
        res = json.loads(out.read_text())
        assert res["judge"]["kind"] == "llm" and len(jsrv.bodies) == 3
        assert "[response]: So \\boxed{002}\n" in jsrv.bodies[0]["messages"][0]["content"]
        assert [it["samples"][0]["correct"] for it in res["items"]] == [True, False, True]
    finally:
        srv.stop()
        jsrv.stop()


@need_pyarrow
def test_hle_end_to_end_with_judge(tmp_path):
    replies = {"Name the capital of France.": "Explanation: known.\nExact Answer: Paris\nConfidence: 90%",
               "What is 2+2?": "Explanation: guess.\nExact Answer: 5\nConfidence: 60%"}
    srv = StandIn(lambda body: (200, replies[body["messages"][-1]["content"]]))
    jsrv = StandIn(fair_judge)
    try:
        data = tmp_path / "hle.parquet"
        write_parquet(data, [
            {"id": "h1", "question": "Name the capital of France.", "image": "", "answer": "Paris", "answer_type": "exactMatch"},
            {"id": "h2", "question": "What is shown?", "image": "data:image/png;base64,AAAA", "answer": "cat",
             "answer_type": "exactMatch"},
            {"id": "h3", "question": "What is 2+2?", "image": "", "answer": "4", "answer_type": "exactMatch"}])
        out = tmp_path / "hle.json"
        r = run_sh("hle", "--data", str(data), "--base-url", srv.url, "--output", str(out))
        assert r.returncode == 2 and "EVAL_JUDGE_URL, EVAL_JUDGE_MODEL, EVAL_JUDGE_API_KEY" in r.stderr
        env = {"EVAL_JUDGE_URL": jsrv.url, "EVAL_JUDGE_MODEL": "j", "EVAL_JUDGE_API_KEY": "k"}
        r = run_sh("hle", "--data", str(data), "--base-url", srv.url, "--output", str(out), env_extra=env)
        assert r.returncode == 0, r.stderr
        res = json.loads(out.read_text())
        assert res["skipped"] == {"image": 1} and res["n_items"] == 2 and res["accuracy"] == 0.5
        assert srv.bodies[0]["messages"][0] == {"role": "system", "content": HLE.SYSTEM_EXACT_ANSWER}
        # one bin: |mean confidence (0.9, 0.6) - accuracy (1, 0)| = 0.25
        assert res["calibration_error"] == pytest.approx(25.0)
    finally:
        srv.stop()
        jsrv.stop()


def test_driver_errors(tmp_path):
    r = run_sh("aime", "--data", str(tmp_path / "none.jsonl"))
    assert r.returncode == 2 and "none.jsonl: no such file" in r.stderr
    r = run_sh("aime")
    assert r.returncode == 2 and "--data FILE or EVAL_DATA" in r.stderr
    data = tmp_path / "g.csv"
    write_csv(data, [{"Question": "q", "Correct Answer": "x"}])
    r = run_sh("gpqa", "--data", str(data))
    assert r.returncode == 2 and "missing column(s) Incorrect Answer 1" in r.stderr
    r = run_sh("gpqa", "--data", str(data), "--judge", "llm")
    assert r.returncode == 2 and "set EVAL_JUDGE_URL, EVAL_JUDGE_MODEL, EVAL_JUDGE_API_KEY" in r.stderr
    # a judge that never answers: retried, then exit 1 naming it (nothing listens on the port)
    port = closed_port()
    write_csv(data, gpqa_rows(1))
    srv = StandIn(lambda body: (200, "Answer: A"))
    try:
        env = {"EVAL_JUDGE_URL": f"http://127.0.0.1:{port}", "EVAL_JUDGE_MODEL": "j", "EVAL_JUDGE_API_KEY": "k",
               "EVAL_JUDGE_BACKOFF": "0.01", "EVAL_JUDGE_RETRIES": "2"}
        r = run_sh("gpqa", "--data", str(data), "--base-url", srv.url, "--output", str(tmp_path / "o.json"),
                   env_extra=env)
        assert r.returncode == 1 and f"127.0.0.1:{port}/chat/completions unreachable after 3 attempts" in r.stderr
    finally:
        srv.stop()


def test_parsers_on_random_text():
    """The reply parsers never fail on arbitrary text other than by JudgeError (a fuzz-style check:
    random mixes of the characters and words they look for)."""
    import random
    rng = random.Random(26)
    alphabet = ["\\boxed{", "}", "{", "answer", "Answer:", " is ", "(", ")", "A", "B", "D", "x", "0", "42", "-",
                ",", "$", "\n", " ", "<think>", "</think>", "yes", "no", "correct:", '{"correct": "yes"}', '"', "é"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        v = rule_judge.extract_integer(text)
        assert v is None or isinstance(v, int)
        assert rule_judge.extract_letter(text) in (None, "A", "B", "C", "D")
        try:
            ok, fields = llm_judge.parse_verdict(text)
            assert isinstance(ok, bool) and isinstance(fields, dict)
        except llm_judge.JudgeError:
            pass
