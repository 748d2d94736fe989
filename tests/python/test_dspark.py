"""DSpark through Python and the CLI: LLM(speculative_config={"method": "dspark", ...}) and
`deepinfer generate --speculative-config` give plain decoding's greedy output with the shipped drafter,
the stats carry the method and the calibration bins, and bad configs are refused."""
import json
import os
import subprocess

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer._lib import DeepInferError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "default")
PROMPTS = ["The history of the city", "Once upon a time", "The sea is"]


def test_llm_greedy_equal_and_stats():
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = LLM(MODEL, threads=2, num_kv_blocks=64)
    ref = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, sp)]
    plain.close()
    spec = LLM(MODEL, threads=2, num_kv_blocks=64,
               speculative_config={"method": "dspark", "num_speculative_tokens": 4, "schedule": "fixed"})
    got = [o.outputs[0].token_ids for o in spec.generate(PROMPTS, sp)]
    st = spec.get_speculative_stats()
    assert got == ref
    assert st["method"] == "dspark" and st["num_speculative_tokens"] == 4
    assert st["accepted_tokens"] > 0 and len(st["calibration"]["count"]) == 10
    assert sum(st["calibration"]["accepted"]) == st["accepted_tokens"]
    assert 0 <= st["calibration"]["ece"] <= 1
    spec.close()


def test_bad_configs():
    with pytest.raises(ValueError):
        LLM(MODEL, threads=1, num_kv_blocks=16, speculative_config={"method": "medusa"})
    with pytest.raises(DeepInferError, match="acceptance"):
        LLM(MODEL, threads=1, num_kv_blocks=16, speculative_config={"method": "dspark", "acceptance": "sometimes"})
    with pytest.raises(DeepInferError, match="no DSpark drafter"):
        LLM(MODEL, threads=1, num_kv_blocks=16, speculative_config={"method": "dspark", "model": "/nonexistent"})


def test_cli():
    cli = os.environ.get("DEEPINFER_CLI")
    if not cli:
        pytest.skip("DEEPINFER_CLI not set")
    base = [cli, "generate", "--model", MODEL, "--prompt", "The history of the city", "--max-tokens", "48",
            "--temperature", "0", "--ignore-eos", "--threads", "2", "--output-format", "json"]
    ref = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)
    r = subprocess.run(base + ["--speculative-config", '{"method": "dspark", "schedule": "fixed"}', "--stats"],
                       capture_output=True, text=True, check=True)
    assert json.loads(r.stdout) == ref
    assert "speculative (DSpark, k=5)" in r.stderr
    r = subprocess.run(base + ["--speculative-config", '{"method": "dspark", "k": 1}'], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown key" in r.stderr
