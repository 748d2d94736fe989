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
