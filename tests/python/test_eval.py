"""The eval/ drivers and the scoring API under them, on the shipped model (CPU).

- LLM.loglikelihood against a log-softmax computed here in float64 from `deepinfer score` logits,
  with the token split rebuilt here from `deepinfer tokenize` (within 1e-4), and its greedy flag
  against the argmax; LLM.encode against Hugging Face `tokenizers`.
- deepinfer.scoring's rules on a toy encoder (whitespace move, split fallback, windows).
- Each driver on the sample tasks with --limit: the JSON structure, the metrics recomputed from the
  items, the chosen answers against LLM.loglikelihood called here, the answer matching rules
  reimplemented here, and task-file errors that name the line.
- The engine still generates the same text after a loglikelihood call, which runs through it as
  score-only requests: continuations of one context take the context from the prefix cache.
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from deepinfer import LLM, SamplingParams, scoring  # noqa: E402
from cli_score import score_logits  # noqa: E402

CLI = os.environ.get("DEEPINFER_CLI")
MODEL = os.path.join(ROOT, "models", "default")
TASKS = os.path.join(ROOT, "eval", "tasks")
need_cli = pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI not set")


@pytest.fixture(scope="module")
def llm():
    m = LLM(MODEL, threads=2, num_kv_blocks=64)
    yield m
    m.close()


def run_driver(name, *args):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    return subprocess.run([sys.executable, os.path.join(ROOT, "eval", name + ".py"), "--threads", "2", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def run_json(name, *args):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        r = run_driver(name, *args, "--output", out)
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout)
        with open(out) as f:
            full = json.load(f)
    assert {k: v for k, v in full.items() if k not in ("items", "time_s")} == \
        {k: v for k, v in summary.items() if k != "time_s"}
    return full


def read_jsonl(path, limit):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()][:limit]


def stderr_of(xs):
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


# ---- reference computations from the CLI ----------------------------------------------------------
def cli_tokenize(text):
    r = subprocess.run([CLI, "tokenize", "--tokenizer", MODEL], input=text.encode(), capture_output=True, check=True)
    return json.loads(r.stdout)


def cli_logits(ids):
    return score_logits(CLI, MODEL, ids)


def ref_loglik(ids, start):
    """(sum of log-softmax over the continuation, greedy) in float64 from `deepinfer score`."""
    logits = cli_logits(ids)
    total, greedy = 0.0, True
    for t in range(start, len(ids)):
        row = logits[t - 1]
        m = max(row)
        total += row[ids[t]] - m - math.log(sum(math.exp(x - m) for x in row))
        greedy &= row.index(m) == ids[t]
    return total, greedy


def ref_pair(context, continuation):
    """The token split of scoring.encode_pair rebuilt from the CLI tokenizer (BOS first: the shipped
    tokenizer's add_bos_token is true, BOS id 0)."""
    n_space = len(context) - len(context.rstrip())
    if n_space:
        context, continuation = context[:-n_space], context[-n_space:] + continuation
    ctx = cli_tokenize(context) if context else []
    whole = cli_tokenize(context + continuation)
    cont = whole[len(ctx):] if whole[:len(ctx)] == ctx and len(whole) > len(ctx) else cli_tokenize(continuation)
    return [0] + ctx + cont, 1 + len(ctx)


# ---- the API --------------------------------------------------------------------------------------
@need_cli
def test_loglikelihood_matches_score_logits(llm):
    reqs = [("In the beginning God created the heaven and the", " earth."),
            ("NAME\n       cp - copy files and ", "directories"),  # trailing space moves
            ("The GNU General Public", " License"),
            ("", "Hello world"),
            ("import os\nimport", " sys")]
    got = llm.loglikelihood(reqs)
    assert len(got) == len(reqs)
    n_greedy = 0
    for (ctx, cont), (lp, greedy) in zip(reqs, got):
        ids, start = ref_pair(ctx, cont)
        ref, ref_greedy = ref_loglik(ids, start)
        assert abs(lp - ref) < 1e-4 * max(1.0, abs(ref)), (ctx, cont, lp, ref)
        assert greedy == ref_greedy, (ctx, cont)
        n_greedy += greedy
    assert n_greedy >= 1  # " License" after "The GNU General Public" is the model's greedy choice


@need_cli
def test_loglikelihood_rolling_matches_score_logits(llm):
    text = "The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures."
    ids = cli_tokenize(text)
    assert llm.encode(text) == ids
    ref, _ = ref_loglik([0] + ids, 1)
    [whole] = llm.loglikelihood_rolling([text])
    assert abs(whole - ref) < 1e-4 * abs(ref)
    # short windows: every token still scored once, with less context, so a different (finite) sum
    [short] = llm.loglikelihood_rolling([text], max_length=4)
    assert math.isfinite(short) and abs(short - whole) > 1e-3
    with pytest.raises(ValueError, match="max_length"):
        llm.loglikelihood_rolling([text], max_length=2048)


def test_encode_matches_hf_tokenizers(llm):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    for text in ["Hello world", "  two  spaces\n\ttab", "In the beginning", "naïve café ☃"]:
        assert llm.encode(text) == tok.encode(text, add_special_tokens=False).ids
    assert llm.encode("Hi", add_special_tokens=True)[0] == 0


def test_engine_survives_loglikelihood(llm):
    sp = SamplingParams(temperature=0, max_tokens=12)
    before = llm.generate(["The Debian"], sp)[0].outputs[0].text
    llm.loglikelihood([("a", " b")])
    after = llm.generate(["The Debian"], sp)[0].outputs[0].text
    assert before == after and before
    llm.check()


def test_loglikelihood_shares_the_context(llm):
    context = "In the beginning God created the heaven and the earth. " * 12  # > 2 KV blocks of 64 tokens
    choices = [" And the earth was without form.", " Then came the flood.", " It was good.", " 42"]
    before = llm.get_stats()
    got = llm.loglikelihood([(context, c) for c in choices])
    after = llm.get_stats()
    hit = after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
    n_ctx = len(llm.encode(context))
    assert hit >= 3 * (n_ctx // 64) * 64, (hit, n_ctx)  # the last three find the first's full blocks
    for (lp, _), c in zip(got, choices):  # the same numbers as each request alone, cache or not
        [(alone, _)] = llm.loglikelihood([(context, c)])
        assert abs(lp - alone) < 1e-5 * max(1.0, abs(alone)), (c, lp, alone)
    llm.check()


def test_loglikelihood_errors(llm):
    with pytest.raises(ValueError, match="continuation is empty"):
        llm.loglikelihood([("context", "")])
    with pytest.raises(ValueError, match="does not fit"):
        llm.loglikelihood([("a", " b" * 3000)])
    long_ctx = llm.loglikelihood([(" x" * 3000, " y")])  # the context is cut on the left
    assert math.isfinite(long_ctx[0][0])
    closed = LLM(MODEL, threads=1, num_kv_blocks=8)
    closed.close()
    with pytest.raises(RuntimeError, match="after close"):
        closed.loglikelihood([("a", " b")])


# ---- scoring rules on a toy encoder ---------------------------------------------------------------
def toy_encode(text):
    """One id per character, except that "ab" is one token (so a boundary between a and b merges)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("ab", i):
            out.append(1000)
            i += 2
        else:
            out.append(ord(text[i]))
            i += 1
    return out


def test_encode_pair_rules():
    ids, start = scoring.encode_pair(toy_encode, "xy ", "z", [7])
    assert ids == [7, ord("x"), ord("y"), ord(" "), ord("z")] and start == 3  # the space moved to the continuation
    # "a" + "b" merge into one token: the split fails, the continuation is encoded alone
    ids, start = scoring.encode_pair(toy_encode, "ca", "bd", [])
    assert ids == [ord("c"), ord("a"), ord("b"), ord("d")] and start == 2
    ids, start = scoring.encode_pair(toy_encode, "", "ab", [7])
    assert ids == [7, 1000] and start == 1
    with pytest.raises(ValueError):
        scoring.encode_pair(toy_encode, "x", "", [7])
    assert scoring.truncate_left(list(range(10)), 7, 5) == ([5, 6, 7, 8, 9], 2)
    with pytest.raises(ValueError):
        scoring.truncate_left(list(range(10)), 3, 5)


def test_rolling_windows_cover_each_token_once():
    for n in (1, 5, 7, 8, 9, 23):
        toks = list(range(100, 100 + n))
        wins = scoring.rolling_windows(toks, 0, 4)
        predicted = []
        for ids, start in wins:
            assert 1 <= start < len(ids) <= 5
            predicted += ids[start:]
            # a window's sequence is contiguous text (after the prefix token in the first)
            seq = ids[1:] if ids[0] == 0 else ids
            assert seq == list(range(seq[0], seq[0] + len(seq)))
        assert predicted == toks
        assert wins[0][0][0] == 0
        if len(wins) > 1:  # later windows are filled to max_length fed tokens
            assert all(len(ids) == 5 for ids, _ in wins[1:])


# ---- the drivers ----------------------------------------------------------------------------------
def test_multiple_choice_fewshot(llm):
    """--num-fewshot 2: each item's context is built here again from the recorded example lines (as
    lm-evaluation-harness joins them) and its log-likelihoods recomputed; examples never include the item."""
    path = os.path.join(TASKS, "multiple_choice.jsonl")
    res = run_json("multiple_choice", "--tasks", path, "--limit", "5", "--num-fewshot", "2", "--fewshot-seed", "7")
    assert res["num_fewshot"] == 2 and res["n"] == 5
    src = read_jsonl(path, None)
    for it in res["items"]:
        shots = it["fewshot"]
        assert len(shots) == 2 and it["line"] not in shots
        ex = [src[n - 1] for n in shots]  # line numbers are 1-based
        ctx = "\n\n".join([e["context"] + " " + e["choices"][e["gold"]] for e in ex] + [src[it["line"] - 1]["context"]])
        lls = llm.loglikelihood([(ctx, " " + c) for c in src[it["line"] - 1]["choices"]])
        assert all(abs(a - b) < 1e-5 * max(1.0, abs(b)) for a, (b, _) in zip(it["logprobs"], lls))
    again = run_json("multiple_choice", "--tasks", path, "--limit", "5", "--num-fewshot", "2", "--fewshot-seed", "7")
    assert [it["fewshot"] for it in again["items"]] == [it["fewshot"] for it in res["items"]]  # seeded
    r = run_driver("multiple_choice", "--tasks", path, "--num-fewshot", "1000")
    assert r.returncode == 2 and "--num-fewshot 1000" in r.stderr


def test_multiple_choice_driver(llm):
    limit = 8
    res = run_json("multiple_choice", "--tasks", os.path.join(TASKS, "multiple_choice.jsonl"), "--limit", str(limit))
    assert res["driver"] == "multiple_choice" and res["n"] == limit and len(res["items"]) == limit
    assert set(res["metrics"]) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    lines = read_jsonl(os.path.join(TASKS, "multiple_choice.jsonl"), limit)
    accs, norms = [], []
    for it, src in zip(res["items"], lines):
        delim = src.get("target_delimiter", " ")
        lls = llm.loglikelihood([(src["context"], delim + c) for c in src["choices"]])
        lps = [lp for lp, _ in lls]
        assert all(abs(a - b) < 1e-5 for a, b in zip(it["logprobs"], lps))
        assert it["is_greedy"] == [g for _, g in lls]
        assert it["pred"] == max(range(len(lps)), key=lambda i: (lps[i], -i))
        normed = [lp / len(c.encode()) for lp, c in zip(lps, src["choices"])]
        assert it["pred_norm"] == max(range(len(lps)), key=lambda i: (normed[i], -i))
        assert it["gold"] == src["gold"] and it["id"] == src["id"]
        accs.append(float(it["pred"] == src["gold"]))
        norms.append(float(it["pred_norm"] == src["gold"]))
    m = res["metrics"]
    assert m["acc"] == pytest.approx(sum(accs) / limit) and m["acc_norm"] == pytest.approx(sum(norms) / limit)
    assert m["acc_stderr"] == pytest.approx(stderr_of(accs)) and m["acc_norm_stderr"] == pytest.approx(stderr_of(norms))
    assert m["acc"] >= 0.5  # chance is 0.25; the sample suits the shipped model


def judge(src, output):
    a = src["answer"]
    if src["match"] == "exact":
        return output.strip() == a.strip()
    if src["match"] == "contains":
        return a in output
    m = re.search(src["pattern"], output)
    return bool(m) and (m.group(1) if m.re.groups else m.group(0)).strip() == a.strip()


def test_generation_driver(llm):
    path = os.path.join(TASKS, "generation.jsonl")
    res = run_json("generation", "--tasks", path, "--max-tokens", "16")
    lines = read_jsonl(path, None)
    assert res["n"] == len(lines) and res["config"]["max_tokens"] == 16
    kinds = {src["match"] for src in lines}
    assert kinds == {"exact", "contains", "regex"} and any("messages" in s for s in lines)
    correct = []
    for it, src in zip(res["items"], lines):
        assert it["correct"] == judge(src, it["output"]), it
        assert it["n_tokens"] <= src.get("max_tokens", 16)
        for s in src.get("stop", []):
            assert s not in it["output"]
        correct.append(float(it["correct"]))
    assert res["metrics"]["accuracy"] == pytest.approx(sum(correct) / len(correct))
    assert res["metrics"]["accuracy_stderr"] == pytest.approx(stderr_of(correct))
    assert 0 < res["metrics"]["accuracy"] < 1
    # greedy: the same text as LLM.generate with temperature 0
    for it, src in list(zip(res["items"], lines))[:3]:
        sp = SamplingParams(temperature=0, max_tokens=src.get("max_tokens", 16), stop=src.get("stop"))
        assert llm.generate([src["prompt"]], sp)[0].outputs[0].text == it["output"]


def test_perplexity_driver(llm):
    path = os.path.join(TASKS, "perplexity.jsonl")
    res = run_json("perplexity", "--tasks", path, "--limit", "3")
    docs = read_jsonl(path, 3)
    assert res["n"] == 3
    lls = llm.loglikelihood_rolling([d["text"] for d in docs])
    for it, d, ll in zip(res["items"], docs, lls):
        assert it["id"] == d["id"] and abs(it["logprob"] - ll) < 1e-4 * abs(ll)
        assert it["n_tokens"] == len(llm.encode(d["text"])) and it["n_bytes"] == len(d["text"].encode())
        assert it["n_words"] == len(d["text"].split())
    m = res["metrics"]
    LL, T, B, W = sum(lls), m["tokens"], m["bytes"], m["words"]
    assert T == sum(it["n_tokens"] for it in res["items"])
    assert m["token_perplexity"] == pytest.approx(math.exp(-LL / T), rel=1e-5)
    assert m["bits_per_byte"] == pytest.approx(-LL / B / math.log(2), rel=1e-5)
    assert m["word_perplexity"] == pytest.approx(math.exp(-LL / W), rel=1e-5)
    assert 1 < m["token_perplexity"] < 200  # in-domain text on the shipped model
    # a plain text file is one document; short windows still score every token
    res2 = run_json("perplexity", "--tasks", os.path.join(ROOT, "tests", "data", "eval", "sample.txt"),
                    "--max-length", "64")
    assert res2["n"] == 1 and res2["config"]["max_length"] == 64 and res2["metrics"]["tokens"] > 64


@pytest.mark.parametrize("driver,line,needle", [
    ("multiple_choice", {"context": "a", "choices": ["b", "c"], "gold": 2}, ":2: \"gold\" 2 is not an index"),
    ("multiple_choice", {"context": "a", "choices": ["b"], "gold": 0}, ":2: \"choices\" must be a list of at least two"),
    ("multiple_choice", {"choices": ["b", "c"], "gold": 0}, ":2: missing \"context\""),
    ("generation", {"prompt": "a", "answer": "b", "match": "fuzzy"}, ":2: \"match\" must be one of"),
    ("generation", {"prompt": "a", "answer": "b", "match": "regex"}, ":2: regex matching needs a \"pattern\""),
    ("generation", {"prompt": "a", "answer": "b", "match": "regex", "pattern": "("}, ":2: bad pattern"),
    ("generation", {"prompt": "a", "messages": [], "answer": "b"}, ":2: give exactly one of"),
    ("perplexity", {"text": 3}, ":2: \"text\" has the wrong type"),
])
def test_task_file_errors(driver, line, needle):
    good = {"multiple_choice": {"context": "a", "choices": ["b", "c"], "gold": 0},
            "generation": {"prompt": "a", "answer": "b"}, "perplexity": {"text": "a b c"}}[driver]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps(good) + "\n" + json.dumps(line) + "\n")
        r = run_driver(driver, "--tasks", path)
        assert r.returncode == 2 and needle in r.stderr, r.stderr
        with open(path, "w") as f:
            f.write("{not json\n")
        r = run_driver(driver, "--tasks", path)
        assert r.returncode == 2 and ":1: not JSON" in r.stderr
    r = run_driver(driver, "--tasks", "/nonexistent/tasks.jsonl")
    assert r.returncode == 2 and "/nonexistent/tasks.jsonl" in r.stderr
