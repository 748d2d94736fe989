"""Expert parallel on CPU ranks (issue 21): `mpirun --oversubscribe -np 2|4 deepinfer score|generate
--enable-expert-parallel` on every fixture gives logits bit-identical to one rank (the safetensors
files compared byte for byte) and the same greedy ids; EPLB on (replicas, rebalanced every step) equals
EPLB off; a rank that kills itself or stalls ends the job with an error within the (short) timeout.
Skipped with the reason when mpirun is missing (Debian: openmpi-bin libopenmpi-dev) or the CLI was
built without MPI. Under CI (root) OpenMPI's run-as-root switches are set here."""
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("DEEPINFER_CLI")
MODELS = os.path.join(ROOT, "tests", "data", "models")
FIXTURES = ["dsv2-lite-tiny", "dsv2-tiny", "dsv2-yarn-tied", "dsv3-fp8-16x12", "dsv3-halfsplit", "dsv3-odd", "dsv3-tiny", "dsv3-tiny-fp8", "dsv4-tiny"]
IDS = ",".join(str(i) for i in range(1, 160, 7))  # 23 tokens, inside every fixture's vocabulary
MPIRUN = shutil.which("mpirun")


def _mpi_built():
    if not CLI:
        return False
    r = subprocess.run(["ldd", CLI], capture_output=True, text=True)
    return "libmpi" in r.stdout


pytestmark = [pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI not set"),
              pytest.mark.skipif(not MPIRUN, reason="mpirun not found (Debian: openmpi-bin libopenmpi-dev)"),
              pytest.mark.skipif(not _mpi_built(), reason="deepinfer built without MPI (libopenmpi-dev missing)")]

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
           ASAN_OPTIONS="detect_leaks=0")
ENV.pop("DEEPINFER_DIST_TEST_FAIL", None)


def run(np_, *args, env=None, timeout=120):
    cmd = ([MPIRUN, "--oversubscribe", "-np", str(np_)] if np_ else []) + [CLI] + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or ENV)


def score_bytes(np_, model, *extra):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "l.safetensors")
        r = run(np_, "score", "--model", os.path.join(MODELS, model), "--ids", IDS, "--out", out, "--threads", "1", *extra)
        assert r.returncode == 0, r.stderr
        with open(out, "rb") as f:
            return f.read(), r.stderr


EPLB = ["--enable-eplb", "--eplb-config", '{"num_redundant_experts": 4, "window_size": 2, "step_interval": 1}']


@pytest.mark.parametrize("model", FIXTURES)
def test_score_bit_identical(model):
    one, _ = score_bytes(0, model)
    for np_ in (2, 4):
        many, err = score_bytes(np_, model, "--enable-expert-parallel")
        assert f"expert parallel over {np_} ranks" in err, err  # the exchange ran
        assert many == one, f"{model}: logits at {np_} ranks differ from one rank"


def generate_ids(np_, model, *extra, tokens=10):
    r = run(np_, "generate", "--model", os.path.join(MODELS, model), "--prompt-ids", IDS, "--max-tokens", str(tokens),
            "--temperature", "0", "--ignore-eos", "--output-format", "json", "--threads", "1", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ids"], r.stderr


@pytest.mark.parametrize("model", ["dsv2-lite-tiny", "dsv3-tiny", "dsv3-tiny-fp8", "dsv4-tiny"])
def test_generate_same_ids_and_eplb(model):
    one, _ = generate_ids(0, model)
    two, _ = generate_ids(2, model, "--enable-expert-parallel")
    four, err = generate_ids(4, model, "--enable-expert-parallel", *EPLB)
    assert two == one and four == one
    assert "EPLB every 1 steps" in err and "rebalances" in err, err


def test_sampled_generate_with_seed():
    args = ["--temperature", "0.9", "--seed", "5"]
    m = os.path.join(MODELS, "dsv3-tiny")
    base = ["generate", "--model", m, "--prompt-ids", "1,2,3", "--max-tokens", "8", "--ignore-eos", "--output-format",
            "json", "--threads", "1"] + args
    one = run(0, *base)
    many = run(2, *base, "--enable-expert-parallel", *EPLB)
    assert one.returncode == 0 and many.returncode == 0, many.stderr
    assert json.loads(one.stdout)["ids"] == json.loads(many.stdout)["ids"]


def test_rank_zero_alone_prints():
    r = run(2, "generate", "--model", os.path.join(MODELS, "dsv3-tiny"), "--prompt-ids", "1,2", "--max-tokens", "3",
            "--temperature", "0", "--output-format", "json", "--threads", "1", "--enable-expert-parallel")
    assert r.returncode == 0, r.stderr
    assert len([ln for ln in r.stdout.splitlines() if ln.startswith("{")]) == 1, r.stdout


@pytest.mark.parametrize("mode", ["kill", "stall"])
def test_failed_rank_ends_the_job(mode):
    env = dict(ENV, DEEPINFER_DIST_TEST_FAIL=f"1:2:{mode}")
    t0 = time.monotonic()
    r = run(2, "score", "--model", os.path.join(MODELS, "dsv3-tiny"), "--ids", IDS, "--out", os.devnull,
            "--threads", "1", "--enable-expert-parallel", "--dist-timeout", "3", env=env, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode != 0
    assert took < 30, took
    if mode == "stall":  # the survivor's own words: the collective, the rank, the timeout
        assert "timed out after 3 s on rank 0 of 2" in r.stderr and "ending the job" in r.stderr, r.stderr
    else:
        assert "ending the job" in r.stderr, r.stderr


def test_bad_flags_named():
    m = os.path.join(MODELS, "dsv3-tiny")
    r = run(0, "score", "--model", m, "--ids", "1", "--out", os.devnull, "--enable-expert-parallel", "--enable-eplb",
            "--eplb-config", '{"num_redundant": 1}')
    assert r.returncode == 2 and 'unknown key "num_redundant"' in r.stderr
    r = run(0, "score", "--model", m, "--ids", "1", "--out", os.devnull, "--enable-eplb")
    assert r.returncode == 2 and "--enable-eplb needs --enable-expert-parallel" in r.stderr
    r = run(0, "score", "--model", m, "--ids", "1", "--out", os.devnull, "--dist-timeout", "0")
    assert r.returncode == 2 and "--dist-timeout" in r.stderr
    r = run(0, "score", "--model", m, "--ids", "1", "--out", os.devnull, "--data-parallel-size", "2")
    assert r.returncode == 2 and "--data-parallel-size: for serve and generate" in r.stderr  # score runs no engine
    # 16 experts + 2 redundant on 4 ranks: not a multiple
    r = run(4, "score", "--model", m, "--ids", "1,2", "--out", os.devnull, "--threads", "1", "--enable-expert-parallel",
            "--enable-eplb", "--eplb-config", '{"num_redundant_experts": 2}')
    assert r.returncode != 0 and "not a multiple of the 4 ranks" in r.stderr, r.stderr
