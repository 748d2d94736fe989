"""`deepinfer perplexity` against an independent computation: the NLL of the same window from the
logits `deepinfer score` writes, computed here in float64 (must agree to 1e-4), and a plausibility
bound for English text on the shipped model."""
import json
import math
import os
import struct
import subprocess
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("DEEPINFER_CLI")
MODEL = os.path.join(ROOT, "models", "default")
TEXT = os.path.join(ROOT, "tests", "data", "eval", "sample.txt")
pytestmark = pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI not set")


def read_logits(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        t = hdr["logits"]
        rows, vocab = t["shape"]
        f.seek(8 + n + t["data_offsets"][0])
        data = struct.unpack(f"<{rows * vocab}f", f.read(rows * vocab * 4))
    return [data[i * vocab:(i + 1) * vocab] for i in range(rows)]


def test_perplexity_matches_score():
    ctx = 32
    r = subprocess.run([CLI, "perplexity", "--model", MODEL, "--file", TEXT, "--ctx", str(ctx), "--max-windows", "1"],
                       capture_output=True, text=True, check=True)
    res = json.loads(r.stdout)
    assert res["windows"] == 1 and res["tokens_scored"] == ctx // 2 - 1
    ids = json.loads(subprocess.run([CLI, "tokenize", "--tokenizer", MODEL], input=open(TEXT, "rb").read(),
                                    capture_output=True, check=True).stdout)
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    window = [cfg["bos_token_id"]] + ids[:ctx - 1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "l.safetensors")
        subprocess.run([CLI, "score", "--model", MODEL, "--ids", ",".join(map(str, window)), "--out", out],
                       capture_output=True, check=True)
        logits = read_logits(out)
    nll = 0.0
    for t in range(ctx // 2, ctx - 1):
        row = logits[t]
        m = max(row)
        nll += math.log(sum(math.exp(x - m) for x in row)) + m - row[window[t + 1]]
    nll /= ctx // 2 - 1
    assert abs(nll - res["nll"]) < 1e-4, (nll, res["nll"])


def test_perplexity_plausible_and_errors():
    r = subprocess.run([CLI, "perplexity", "--model", MODEL, "--file", TEXT, "--ctx", "64"],
                       capture_output=True, text=True, check=True)
    res = json.loads(r.stdout)
    assert res["windows"] >= 1 and 1.0 < res["ppl"] < 200.0, res  # KJV-like English on a model trained on it
    bad = subprocess.run([CLI, "perplexity", "--model", MODEL, "--file", TEXT, "--ctx", "100000"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "exceeds the model's context" in bad.stderr
    missing = subprocess.run([CLI, "perplexity", "--model", MODEL], capture_output=True, text=True)
    assert missing.returncode == 2
