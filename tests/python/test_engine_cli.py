"""`deepinfer generate` end to end: json and streamed text output, text/chat/id prompts, stop strings,
structured outputs, engine flags, and the errors (bad flags: exit 2; a failing model or request: 1)."""
import json
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("DEEPINFER_CLI")
DUMMY = os.path.join(ROOT, "tests", "data", "models", "engine-dummy")
TINY = os.path.join(ROOT, "tests", "data", "models", "dsv3-tiny")

pytestmark = pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI not set")


def gen(*args, model=DUMMY, dummy=True, check=True):
    cmd = [CLI, "generate", "--model", model, "--threads", "1"] + (["--load-format", "dummy"] if dummy else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def gen_json(*args, **kw):
    r = gen(*args, "--output-format", "json", **kw)
    return json.loads(r.stdout)


def test_json_and_text_modes_agree():
    a = gen_json("--prompt", "Hello world", "--max-tokens", "12", "--temperature", "0", "--ignore-eos")
    assert a["finish_reason"] == "length" and len(a["ids"]) == 12 and a["text"]
    r = gen("--prompt", "Hello world", "--max-tokens", "12", "--temperature", "0", "--ignore-eos")
    assert r.stdout == a["text"] + "\n"  # streamed text, then a newline
    assert "loading" in r.stderr  # progress lines in text mode; json mode keeps stderr quiet
    b = gen_json("--prompt-ids", "0,5,6,7", "--max-tokens", "5", "--temperature", "0", "--ignore-eos")
    assert len(b["ids"]) == 5


def test_seed_and_sampling_flags():
    base = ["--prompt", "abc", "--max-tokens", "10", "--temperature", "1", "--top-p", "0.9", "--top-k", "40",
            "--min-p", "0.01", "--ignore-eos", "--repetition-penalty", "1.1"]
    a = gen_json(*base, "--seed", "7")["ids"]
    assert a == gen_json(*base, "--seed", "7")["ids"]
    assert a != gen_json(*base, "--seed", "8")["ids"]


def test_stop_string_and_token():
    full = gen_json("--prompt", "x", "--max-tokens", "20", "--temperature", "0", "--ignore-eos")
    stop = full["text"][3:6]
    cut = gen_json("--prompt", "x", "--max-tokens", "20", "--temperature", "0", "--ignore-eos", "--stop", stop,
                   "--stop", "never-appears")
    assert cut["finish_reason"] == "stop" and cut["text"] == full["text"][:full["text"].index(stop)]
    tok = full["ids"][4]
    st = gen_json("--prompt", "x", "--max-tokens", "20", "--temperature", "0", "--ignore-eos", "--stop-token-id",
                  str(tok))
    assert st["finish_reason"] == "stop" and st["ids"] == full["ids"][:full["ids"].index(tok) + 1]


def test_chat_and_engine_flags():
    r = gen_json("--prompt", "Hi", "--chat", "--max-tokens", "6", "--temperature", "0", "--ignore-eos",
                 "--max-num-seqs", "4", "--max-num-batched-tokens", "16", "--no-enable-prefix-caching",
                 "--num-kv-blocks", "8", "--max-model-len", "512")
    assert len(r["ids"]) == 6
    b = gen_json("--prompt", "Hi", "--chat", "--max-tokens", "6", "--temperature", "0", "--ignore-eos",
                 "--batch-invariant")  # the CPU backend always is: the same tokens
    assert b["ids"] == r["ids"]


def test_structured(tmp_path):
    r = gen_json("--prompt", "Answer", "--max-tokens", "20", "--seed", "1", "--regex", "(yes|no) [0-9]{2}")
    assert r["finish_reason"] == "stop" and re.fullmatch(r"(yes|no) [0-9]{2}", r["text"])
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "A" [0-9] "!"\n')
    r = gen_json("--prompt", "x", "--max-tokens", "10", "--seed", "2", "--grammar", str(g))
    assert r["finish_reason"] == "stop" and re.fullmatch(r"A[0-9]!", r["text"])
    s = tmp_path / "s.json"
    s.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                             "additionalProperties": False}))
    r = gen_json("--prompt", "x", "--max-tokens", "30", "--seed", "3", "--json-schema", str(s))
    if r["finish_reason"] == "stop":
        assert isinstance(json.loads(r["text"])["ok"], bool)
    r = gen_json("--prompt", "x", "--max-tokens", "30", "--seed", "3", "--json")
    assert r["text"].startswith("{")


def test_errors():
    r = gen("--prompt", "x", "--bogus", check=False)
    assert r.returncode == 2 and "unknown option" in r.stderr
    r = gen("--prompt", "x", "--prompt-ids", "1,2", check=False)
    assert r.returncode == 2
    r = gen("--prompt", "x", "--max-tokens", "abc", check=False)
    assert r.returncode == 2 and "--max-tokens" in r.stderr
    r = gen("--prompt", "x", model="/nonexistent/model", dummy=False, check=False)
    assert r.returncode == 1 and "config.json" in r.stderr
    # no tokenizer: a text prompt fails, ids work and give empty text
    r = gen("--prompt", "x", model=TINY, dummy=False, check=False)
    assert r.returncode == 1 and "tokenizer" in r.stderr
    ok = gen_json("--prompt-ids", "1,2,3", "--max-tokens", "3", "--ignore-eos", model=TINY, dummy=False)
    assert ok["text"] == "" and len(ok["ids"]) == 3
    # a prompt longer than the context: the request's own error, exit 1, json still printed
    r = gen("--prompt-ids", ",".join(["5"] * 600), "--max-model-len", "512", "--output-format", "json", check=False)
    assert r.returncode == 1 and json.loads(r.stdout)["finish_reason"] == "error"
    r = subprocess.run([CLI, "generate", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--json-schema" in r.stdout


# ---- issue 15: the sampling flags take the server's ranges and words; no-tokenizer folders --------
@pytest.mark.parametrize("flag,value,words", [
    ("--temperature", "-1", "must be in [0, 1e+06], got -1"),
    ("--top-p", "0", "must be in [1e-09, 1], got 0"),
    ("--top-p", "1.5", "must be in [1e-09, 1], got 1.5"),
    ("--top-k", "-2", "must be in [-1, 2147483647], got -2"),
    ("--top-k", "2.5", "must be an integer"),
    ("--min-p", "2", "must be in [0, 1], got 2"),
    ("--presence-penalty", "3", "must be in [-2, 2], got 3"),
    ("--frequency-penalty", "-2.5", "must be in [-2, 2], got -2.5"),
    ("--repetition-penalty", "0", "must be in [1e-06, 1e+06], got 0"),
    ("--n", "0", "must be in [1, 1024], got 0"),
    ("--min-tokens", "-1", "must be in [0, 2147483647], got -1"),
    ("--temperature", "warm", "is not a number"),
])
def test_sampling_flag_ranges(flag, value, words):
    r = gen("--prompt", "x", flag, value, check=False)
    assert r.returncode == 2, r.stderr
    assert f"deepinfer generate: {flag}: " in r.stderr and words in r.stderr, r.stderr
    assert "loading" not in r.stderr  # refused before the model loads


def test_min_tokens_against_max_tokens():
    r = gen("--prompt", "x", "--min-tokens", "9", "--max-tokens", "4", check=False)
    assert r.returncode == 2 and "--min-tokens: must be at most --max-tokens (4), got 9" in r.stderr
    ok = gen_json("--prompt", "x", "--min-tokens", "4", "--max-tokens", "4", "--temperature", "0")
    assert len(ok["ids"]) == 4 and ok["finish_reason"] == "length"  # EOS banned until min_tokens


def test_help_documents_limits():
    r = subprocess.run([CLI, "generate", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "--max-tokens N (128; 0: no limit, until a stop or the context" in r.stdout
    assert "--gpu-memory-utilization" in r.stdout and "--min-tokens" in r.stdout


def test_no_tokenizer_folder_prints_ids():
    # text output of a folder without tokenizer.json: the generated ids, comma-separated
    r = gen("--prompt-ids", "1,2,3", "--max-tokens", "4", "--ignore-eos", "--temperature", "0", model=TINY, dummy=False)
    ids = gen_json("--prompt-ids", "1,2,3", "--max-tokens", "4", "--ignore-eos", "--temperature", "0", model=TINY,
                   dummy=False)["ids"]
    assert r.stdout.strip() == ",".join(map(str, ids)) and len(ids) == 4
    r = gen("--prompt", "hello", model=TINY, dummy=False, check=False)
    assert r.returncode == 1 and "needs a tokenizer" in r.stderr and TINY in r.stderr
    assert "loading" not in r.stderr  # said before the weights load
    assert r.stderr.count("\n") == 1  # one clear error


def test_errors_name_their_file(tmp_path):
    bad = tmp_path / "person.json"
    bad.write_text('{"type": "object", "properties": {')
    r = gen("--prompt", "x", "--json-schema", str(bad), check=False)
    assert r.returncode == 1 and f"--json-schema {bad}: structured output: " in r.stderr, r.stderr
    assert ": :" not in r.stderr and ":  " not in r.stderr
    r = gen("--prompt", "x", "--grammar", str(tmp_path / "missing.gbnf"), check=False)
    assert r.returncode == 1 and "missing.gbnf" in r.stderr


def test_kv_summary_logged():
    r = gen("--prompt", "x", "--max-tokens", "2")
    assert re.search(r"KV cache: \d+ blocks of 64 tokens \([\d.]+ GiB\): the fixed host default", r.stderr), r.stderr
    r = gen("--prompt", "x", "--max-tokens", "2", "--num-kv-blocks", "40")
    assert "KV cache: 40 blocks" in r.stderr and "num_kv_blocks given" in r.stderr
    r = gen("--prompt", "x", "--gpu-memory-utilization", "1.5", check=False)
    assert r.returncode == 2 and "--gpu-memory-utilization: must be in (0, 1]" in r.stderr


def test_offline_example_without_tokenizer():
    import sys
    env = dict(os.environ)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "offline_inference.py"), "--model", TINY,
                        "--max-tokens", "3"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "no tokenizer.json" in r.stdout and "Generated ids:" in r.stdout
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "offline_inference.py"), "--model",
                        "/nonexistent/model"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "offline_inference: " in r.stderr
