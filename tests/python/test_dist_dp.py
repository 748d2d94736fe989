"""Attention data parallel started by deepinfer itself (issue 21): `deepinfer serve --data-parallel-size 2`,
`deepinfer generate --data-parallel-size 2` and `LLM(data_parallel_size=2)` relaunch themselves under
mpirun (2 CPU ranks, with --enable-expert-parallel), place requests on both ranks and give the outputs
of one rank bit for bit (the CPU is batch-invariant): greedy, seeded and engine-seeded sampling, with
logprobs. SIGTERM stops every rank with exit code 0; a rank that dies ends the job with a message and
no hang; without mpirun on PATH the flag says so. Skipped without mpirun or an MPI build."""
import functools
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("DEEPINFER_CLI")
LIB = os.environ.get("DEEPINFER_LIB")
MODEL = os.path.join(ROOT, "tests", "data", "models", "dsv3-tiny")
MPIRUN = shutil.which("mpirun")


def _mpi_built():
    return bool(CLI) and "libmpi" in subprocess.run(["ldd", CLI], capture_output=True, text=True).stdout


pytestmark = [pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI not set"),
              pytest.mark.skipif(not MPIRUN, reason="mpirun not found (Debian: openmpi-bin libopenmpi-dev)"),
              pytest.mark.skipif(not _mpi_built(), reason="deepinfer built without MPI (libopenmpi-dev missing)")]

# the relaunch sets OpenMPI's run-as-root switches itself; the ranks' leak checks are off (Open MPI's own)
ENV = dict(os.environ, ASAN_OPTIONS="detect_leaks=0", PYTHONPATH=os.path.join(ROOT, "python"))
ENV.pop("DEEPINFER_DIST_TEST_FAIL", None)
ENV.pop("OMPI_ALLOW_RUN_AS_ROOT", None)
ENV.pop("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", None)
if LIB:
    ENV["DEEPINFER_LIB"] = LIB


def prompts():
    return [[1 + (i * 131 + j * 37) % 900 for j in range(3 + (i * 11) % 29)] for i in range(6)]


def sampling(i):
    """greedy, seeded, engine-seeded (drawn from the engine's seed) in turn; logprobs on every other,
    prompt logprobs on two (so both ranks return them)"""
    return dict(max_tokens=4 + i % 5, temperature=0.0 if i % 3 == 0 else 0.8, seed=100 + i if i % 3 == 1 else None,
                ignore_eos=True, logprobs=1 if i % 2 == 0 else None, prompt_logprobs=2 if i in (1, 4) else None)


LLM_SCRIPT = """
import json, sys
from deepinfer import LLM, SamplingParams
n = int(sys.argv[2])
llm = LLM(sys.argv[1], threads=1, seed=7, data_parallel_size=n, enable_expert_parallel=n > 1)
ps = json.loads(sys.argv[3])
outs = llm.generate([{"prompt_token_ids": p} for p in ps], [SamplingParams(**s) for s in json.loads(sys.argv[4])])
print(json.dumps({"ids": [o.outputs[0].token_ids for o in outs], "lp": [o.outputs[0].cumulative_logprob for o in outs],
                  "plp": [repr(o.prompt_logprobs) for o in outs], "here": llm.get_stats()["generated_tokens"],
                  "finish": [o.outputs[0].finish_reason for o in outs],
                  "error": [getattr(o.outputs[0], "error", None) for o in outs]}))
"""


def run_llm(n, env=None):
    sps = [sampling(i) for i in range(6)]
    return subprocess.run([sys.executable, "-c", LLM_SCRIPT, MODEL, str(n), json.dumps(prompts()), json.dumps(sps)],
                          capture_output=True, text=True, timeout=120, env=env or ENV)


@functools.lru_cache(maxsize=None)
def run_llm_one_rank():
    """the one-rank reference, run once for the tests that compare with it"""
    return run_llm(1)


def test_llm_data_parallel_equals_one_rank():
    one, two = run_llm_one_rank(), run_llm(2)
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    a, b = json.loads(one.stdout), json.loads(two.stdout)
    assert a["ids"] == b["ids"] and a["lp"] == b["lp"] and a["plp"] == b["plp"]
    assert a["plp"][1] != "None" and a["lp"][0] is not None
    total = sum(len(x) for x in a["ids"])
    assert a["here"] == total and b["here"] == total  # the stats add every rank's engine (placement: both ranks)
    assert two.stdout.count("\n") == 1  # rank 1's stdout is silenced
    assert "expert parallel over 2 ranks" in two.stderr


def test_worker_out_of_memory_fails_its_request_only():
    # rank 1's first request fails as out of memory: that request ends with an error, the others (on
    # both ranks) are as on one rank, and the job goes on to the end
    one, two = run_llm_one_rank(), run_llm(2, env=dict(ENV, DEEPINFER_DIST_TEST_FAIL="1:1:oom"))
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    a, b = json.loads(one.stdout), json.loads(two.stdout)
    failed = [i for i, f in enumerate(b["finish"]) if f == "error"]
    assert len(failed) == 1, b
    assert "rank 1 could not take the request" in b["error"][failed[0]] and "out of memory" in b["error"][failed[0]]
    for i in range(6):
        if i not in failed:
            assert a["ids"][i] == b["ids"][i], i


def test_speculative_decoding_refused_under_data_parallel():
    r = generate("--data-parallel-size", "2", "--enable-expert-parallel", "--speculative-config",
                 '{"method": "mtp", "num_speculative_tokens": 2}')
    assert r.returncode != 0 and "does not work with --data-parallel-size > 1" in r.stderr, r.stderr
    assert "ending the job" not in r.stderr or "speculative" in r.stderr


def generate(*extra, env=None):
    r = subprocess.run([CLI, "generate", "--model", MODEL, "--prompt-ids", "5,6,7,8", "--max-tokens", "6", "--n", "3",
                        "--temperature", "0.8", "--seed", "3", "--threads", "1", "--output-format", "json", *extra],
                       capture_output=True, text=True, timeout=120, env=env or ENV)
    return r


def test_generate_data_parallel_equals_one_rank():
    one, two = generate(), generate("--data-parallel-size", "2", "--enable-expert-parallel")
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    assert one.stdout == two.stdout and one.stdout.strip()


class Server:
    def __init__(self, *extra, env=None):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([CLI, "serve", MODEL, "--port", "0", "--threads", "1", "--seed", "7",
                                      "--data-parallel-size", "2", "--enable-expert-parallel", *extra],
                                     stdout=subprocess.DEVNULL, stderr=self.log, env=env or ENV)
        self.port = None
        end = time.time() + 60
        while time.time() < end and self.proc.poll() is None and self.port is None:
            m = re.search(r"listening on http://[^ ]+:(\d+)", self.text())
            self.port = int(m.group(1)) if m else None
            time.sleep(0.05)
        assert self.port, self.text()

    def text(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def complete(self, prompt, **kw):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        body = dict(prompt=prompt, **{k: v for k, v in kw.items() if v is not None})
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"{}")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


def one_rank_reference():
    r = run_llm_one_rank()
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ids"]


def test_serve_data_parallel_equals_one_rank_and_stops_cleanly():
    ref = one_rank_reference()
    s = Server()
    try:
        got = [None] * 6

        def one(i):
            sp = sampling(i)
            got[i] = s.complete(prompts()[i], max_tokens=sp["max_tokens"], temperature=sp["temperature"],
                                seed=sp["seed"] if sp["seed"] is not None else 1000 + i, ignore_eos=True)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for i, (status, body) in enumerate(got):
            assert status == 200, body
            if sampling(i)["seed"] is not None or sampling(i)["temperature"] == 0:  # seeded / greedy: as one rank
                assert body["choices"][0]["token_ids"] == ref[i], i
        rc = s.stop()
        assert rc == 0, s.text()
        assert "shutting down" in s.text() and "ending the job" not in s.text()
    finally:
        s.stop(signal.SIGKILL)


def test_serve_rank_death_ends_the_job():
    env = dict(ENV, DEEPINFER_DIST_TEST_FAIL="1:8:kill")  # rank 1 dies at its 8th expert exchange
    s = Server("--dist-timeout", "5", env=env)
    try:
        t0 = time.time()

        def one(i):
            try:
                s.complete(prompts()[i], max_tokens=8, temperature=0)
            except (OSError, http.client.HTTPException, ValueError):
                pass  # the server went away mid-request

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]  # both ranks get requests
        for t in threads:
            t.start()
        rc = s.proc.wait(timeout=30)
        for t in threads:
            t.join(30)
        assert rc != 0 and time.time() - t0 < 30
        assert "rank 1: DEEPINFER_DIST_TEST_FAIL: killing itself" in s.text(), s.text()
        assert re.search(r"rank 1 .* exited on signal 9", s.text()), s.text()  # mpirun's word to the survivors
    finally:
        s.stop(signal.SIGKILL)


def test_no_mpirun_is_a_clear_error():
    env = dict(ENV, PATH="/nonexistent")
    r = generate("--data-parallel-size", "2", env=env)
    assert r.returncode == 1 and "mpirun, which is not on PATH" in r.stderr, r.stderr
    r = run_llm(2, env=env)
    assert r.returncode != 0 and "mpirun, which is not on PATH" in r.stderr, r.stderr
    r = generate("--data-parallel-size", "0")
    assert r.returncode == 2 and "--data-parallel-size" in r.stderr
