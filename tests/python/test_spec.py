"""Speculative decoding with the MTP layer from Python and the CLI, on models/default: with
speculative_config the outputs (greedy and seeded sampling, text, finish reasons, stop strings)
equal those without it, drafts are accepted, blocks are all returned; CLI flags and bad configs."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from deepinfer import LLM, SamplingParams, DeepInferError  # noqa: E402

MODEL = os.path.join(ROOT, "models", "default")
PROMPTS = ["The history of the city", "Once upon a time", "Water is", "The king said that",
           "In the morning, the children", "A small town"]


@pytest.fixture(scope="module")
def pair():
    plain = LLM(MODEL, threads=2, num_kv_blocks=64)
    spec = LLM(MODEL, threads=2, num_kv_blocks=64,
               speculative_config={"method": "mtp", "num_speculative_tokens": 5, "min_confidence": 0.1})
    yield plain, spec
    plain.close()
    spec.close()


def outs(res):
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in res]


def test_identical_outputs(pair):
    plain, spec = pair
    for sp in [SamplingParams(temperature=0, max_tokens=40),
               SamplingParams(temperature=0, max_tokens=30, stop=[","]),
               SamplingParams(temperature=0.8, top_p=0.9, max_tokens=30, seed=5, repetition_penalty=1.1),
               SamplingParams(temperature=0, max_tokens=3)]:
        a = outs(plain.generate(PROMPTS, sp))
        b = outs(spec.generate(PROMPTS, sp))
        assert a == b
        for p in PROMPTS[:2]:  # alone == batched
            assert outs(spec.generate(p, sp)) == [a[PROMPTS.index(p)]]
    st = spec.get_speculative_stats()
    assert st["num_speculative_tokens"] == 5
    assert st["drafted_tokens"] > 20 and st["accepted_tokens"] > 10
    assert sum(st["drafted_per_position"]) == st["drafted_tokens"]
    assert st["mean_accepted_length"] > 1.0
    assert plain.get_speculative_stats()["num_speculative_tokens"] == 0
    spec.check()
    assert spec.get_stats()["kv_blocks_used"] == 0


def test_bad_configs():
    with pytest.raises(ValueError):
        LLM(MODEL, threads=1, num_kv_blocks=16, speculative_config={"method": "eagle", "num_speculative_tokens": 2})
    with pytest.raises(ValueError):
        LLM(MODEL, threads=1, num_kv_blocks=16, speculative_config={"method": "mtp"})
    with pytest.raises(DeepInferError, match=r"\[0, 5\]"):
        LLM(MODEL, threads=1, num_kv_blocks=16, speculative_config={"method": "mtp", "num_speculative_tokens": 9})
    tiny = os.path.join(ROOT, "tests", "data", "models", "dsv3-tiny")
    with pytest.raises(DeepInferError, match="MTP layer"):
        LLM(tiny, threads=1, num_kv_blocks=16, speculative_config={"method": "mtp", "num_speculative_tokens": 2})


def test_cli():
    cli = os.environ.get("DEEPINFER_CLI")
    if not cli:
        pytest.skip("DEEPINFER_CLI not set")
    base = [cli, "generate", "--model", MODEL, "--prompt", "The history of the city", "--max-tokens", "48",
            "--temperature", "0", "--ignore-eos", "--threads", "2", "--output-format", "json"]
    ref = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)
    for extra in [["--speculative-tokens", "5"], ["--speculative-tokens", "2", "--speculative-min-confidence", "0"],
                  ["--speculative-config", '{"method":"mtp","num_speculative_tokens":3}']]:
        r = subprocess.run(base + extra + ["--stats"], capture_output=True, text=True, check=True)
        assert json.loads(r.stdout) == ref
        assert "speculative (MTP" in r.stderr and "accepted" in r.stderr
    r = subprocess.run(base + ["--speculative-config", '{"method":"mtp"}'], capture_output=True, text=True)
    assert r.returncode == 2 and "num_speculative_tokens" in r.stderr
    r = subprocess.run(base + ["--speculative-tokens", "6"], capture_output=True, text=True)
    assert r.returncode == 2
