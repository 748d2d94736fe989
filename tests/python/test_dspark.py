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


def test_startup_profile():
    """"profile": "startup": the step-time profile measured before the first request (the schedule then
    decides from it); greedy output stays plain decoding's"""
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(MODEL, threads=2, num_kv_blocks=64, max_num_seqs=4)
    ref = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, sp)]
    plain.close()
    spec = LLM(MODEL, threads=2, num_kv_blocks=64, max_num_seqs=4,
               speculative_config={"method": "dspark", "profile": "startup"})
    assert [o.outputs[0].token_ids for o in spec.generate(PROMPTS, sp)] == ref
    spec.close()
    with pytest.raises(DeepInferError, match="profile"):
        LLM(MODEL, threads=1, num_kv_blocks=16, speculative_config={"method": "dspark", "profile": "sometimes"})


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


def test_serve_metrics():
    """deepinfer serve --speculative-config: completions work and /metrics carries the spec_decode
    counters and the confidence calibration bins (server on 127.0.0.1, a kernel-chosen port)."""
    import http.client
    import re
    import signal
    import tempfile
    import time
    cli = os.environ.get("DEEPINFER_CLI")
    if not cli:
        pytest.skip("DEEPINFER_CLI not set")
    log = tempfile.NamedTemporaryFile(prefix="di-dspark-serve-", suffix=".log", delete=False)
    proc = subprocess.Popen([cli, "serve", MODEL, "--port", "0", "--threads", "2", "--num-kv-blocks", "128",
                             "--speculative-config", '{"method": "dspark", "schedule": "fixed"}'],
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        port, deadline = None, time.time() + 60
        while port is None and time.time() < deadline and proc.poll() is None:
            m = re.search(r"listening on http://[^ ]+:(\d+)", open(log.name, errors="replace").read())
            port = int(m.group(1)) if m else None
            time.sleep(0.05)
        assert port, open(log.name, errors="replace").read()

        def get(method, path, body=None):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request(method, path, body=json.dumps(body) if body else None, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            c.close()
            return r.status, data.decode()

        status, body = get("POST", "/v1/completions", {"prompt": "The history of the city", "max_tokens": 32,
                                                       "temperature": 0, "ignore_eos": True})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 32
        status, text = get("GET", "/metrics")
        assert status == 200
        drafted = float(re.search(r"^deepinfer_spec_decode_num_draft_tokens_total\{[^}]*\} (\S+)$", text, re.M).group(1))
        bins = re.findall(r'^deepinfer_spec_decode_confidence_drafts_total\{[^}]*bin="[0-9.]+"\} (\S+)$', text, re.M)
        assert drafted > 0 and len(bins) == 10 and 0 < sum(float(b) for b in bins) <= drafted
        assert re.search(r"^deepinfer_spec_decode_confidence_ece\{[^}]*\} [0-9.e+-]+$", text, re.M)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        os.unlink(log.name)
