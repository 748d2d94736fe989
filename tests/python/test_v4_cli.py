"""DeepSeek-V4 from the command line and the Python package (tests/data/models/dsv4-tiny, no tokenizer):
`generate --prompt-ids` / LLM.generate reproduce the fixture's golden greedy continuation (prompt p1,
whole-prompt prefill then 1-token decode, the chunking the goldens allow), n = 2 seeded samples, `score`,
scoring through the engine's prompt logprobs, and the named refusals (text prompt without a tokenizer,
dummy weights, speculative decoding, CUDA)."""
import json
import math
import os
import struct
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("DEEPINFER_CLI")
V4 = os.path.join(ROOT, "tests", "data", "models", "dsv4-tiny")

pytestmark = pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI not set")

P1 = [467, 80, 398, 489, 279, 134, 431, 484, 277, 429, 323, 288, 125, 28, 315, 322, 124, 314, 436, 293, 343, 366, 217,
      442, 139, 277, 495, 487, 341, 382, 73, 215, 410, 376, 73, 438, 290, 397, 404, 11]
P1_GREEDY = [63, 356, 325, 260, 284, 24, 425, 504]  # golden.safetensors p1.greedy (transformers 5.17)


def run(*args, env=None):
    return subprocess.run([CLI] + list(args), capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **env) if env else None)


def test_generate_greedy_matches_golden():
    r = run("generate", "--model", V4, "--prompt-ids", ",".join(map(str, P1)), "--max-tokens", "8", "--temperature", "0",
            "--ignore-eos", "--output-format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ids"] == P1_GREEDY and out["finish_reason"] == "length"


def test_generate_two_seeded_samples():
    args = ["generate", "--model", V4, "--prompt-ids", "5,6,7,8,9", "--max-tokens", "6", "--temperature", "1",
            "--seed", "11", "--n", "2", "--ignore-eos", "--output-format", "json"]
    a, b = run(*args), run(*args)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout  # seeded: the same two samples again
    assert a.stdout.strip()


def test_score_writes_logits(tmp_path):
    out = tmp_path / "s.safetensors"
    r = run("score", "--model", V4, "--ids", "1,2,3,4", "--out", str(out))
    assert r.returncode == 0, r.stderr
    data = out.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    assert header["logits"]["shape"] == [4, 512]


@pytest.mark.parametrize("extra,needle", [
    (["--prompt", "hello"], "needs a tokenizer"),
    (["--prompt-ids", "1,2", "--load-format", "dummy"], "DeepSeek-V4"),
    (["--prompt-ids", "1,2", "--accelerator", "rocm"], "DeepSeek-V4"),
    (["--prompt-ids", "1,2", "--speculative-tokens", "2"], "deepseek_v4"),
])
def test_refusals_are_named(extra, needle):
    r = run("generate", "--model", V4, *extra)
    assert r.returncode != 0
    assert needle in r.stderr


def test_cuda_switched_off_is_named():
    # V4 runs on CUDA by default; DEEPINFER_CUDA_V4=0 refuses accelerator cuda by name
    r = run("generate", "--model", V4, "--prompt-ids", "1,2", "--accelerator", "cuda", env={"DEEPINFER_CUDA_V4": "0"})
    assert r.returncode != 0
    assert "DEEPINFER_CUDA_V4=0" in r.stderr


def test_python_generate_and_engine_scoring():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from deepinfer import LLM, SamplingParams  # noqa: E402
    llm = LLM(V4, threads=2)
    try:
        outs = llm.generate([{"prompt_token_ids": P1}] * 2, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
        assert [list(o.outputs[0].token_ids) for o in outs] == [P1_GREEDY, P1_GREEDY]
        # the golden continuation is greedy: the engine's prompt logprobs say so (rank 1 everywhere)
        (lp, greedy), = llm._score_sequences([(P1 + P1_GREEDY, len(P1))])
        assert greedy and math.isfinite(lp) and lp < 0
    finally:
        llm.close()


def test_python_prefix_cache_counts_v4_hits():
    """Two prompts sharing 260 tokens: the second takes 256 from the prefix cache (num_cached_tokens),
    with the same greedy output as without prefix caching; with swa_bounded_replay the hit recomputes
    the last sliding_window - 1 = 127 of them (129 counted)."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from deepinfer import LLM, SamplingParams  # noqa: E402
    shared = [(i * 37 + 11) % 512 for i in range(260)]
    prompts = [{"prompt_token_ids": shared + [5, 6, 7]}, {"prompt_token_ids": shared + [9, 10]}]
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    got = {}
    for name, kw in (("exact", {}), ("off", {"enable_prefix_caching": False}), ("bounded", {"swa_bounded_replay": True})):
        llm = LLM(V4, threads=2, max_num_seqs=1, **kw)
        try:
            outs = llm.generate(prompts, sp)
            got[name] = ([list(o.outputs[0].token_ids) for o in outs], [o.num_cached_tokens for o in outs])
        finally:
            llm.close()
    assert got["exact"][1] == [0, 256] and got["off"][1] == [0, 0] and got["bounded"][1] == [0, 129]
    assert got["exact"][0] == got["off"][0]  # exact caching: the same tokens as computing everything
    assert got["bounded"][0][0] == got["exact"][0][0]  # no hit: exact


def test_cli_swa_bounded_replay_flag():
    r = run("generate", "--model", V4, "--prompt-ids", ",".join(str(i % 500) for i in range(200)), "--n", "2",
            "--max-tokens", "3", "--temperature", "0", "--ignore-eos", "--swa-bounded-replay", "--output-format", "json")
    assert r.returncode == 0, r.stderr
