"""--quantization fp8 through LLM(quantization="fp8") and the CLI's generate: the same greedy tokens from
both (one engine, one quantizer), different weights than bf16 (the fixture's logits move), and a bad
value refused naming the flag. The numerics are checked in tests/model/test_quantize_fp8.c."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from deepinfer import LLM, SamplingParams, DeepInferError  # noqa: E402

TINY = os.path.join(ROOT, "tests", "data", "models", "dsv3-tiny")
PROMPT = [5, 9, 11, 200, 31, 77, 4, 18]


def test_llm_quantization_fp8_matches_cli():
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    q = LLM(TINY, num_kv_blocks=64, threads=2, quantization="fp8")
    out = q.generate({"prompt_token_ids": PROMPT}, sp)[0].outputs[0]
    q.close()
    b = LLM(TINY, num_kv_blocks=64, threads=2)
    ref = b.generate({"prompt_token_ids": PROMPT}, sp)[0].outputs[0]
    b.close()
    assert len(out.token_ids) == 12
    # the quantized weights are not the bf16 ones: some logprob differs
    assert [lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids)] != \
        [lp[t].logprob for lp, t in zip(ref.logprobs, ref.token_ids)]
    cli = os.environ.get("DEEPINFER_CLI")
    if cli:
        r = subprocess.run([cli, "generate", "--model", TINY, "--prompt-ids", ",".join(map(str, PROMPT)),
                            "--max-tokens", "12", "--temperature", "0", "--ignore-eos", "--quantization", "fp8",
                            "--output-format", "json"], capture_output=True, text=True, check=True)
        assert json.loads(r.stdout)["ids"] == out.token_ids


def test_quantization_bad_value():
    with pytest.raises(DeepInferError, match="--quantization"):
        LLM(TINY, num_kv_blocks=16, threads=2, quantization="int8")
    cli = os.environ.get("DEEPINFER_CLI")
    if cli:
        r = subprocess.run([cli, "generate", "--model", TINY, "--prompt-ids", "5,9", "--quantization", "awq"],
                           capture_output=True, text=True)
        assert r.returncode != 0 and "--quantization" in r.stderr
