"""bench/run_sweep.sh at tiny sizes on the shipped model (CPU), and the pieces under it.

- The sweep end to end against `deepinfer serve` (one server, its KV pool sized by the rule in
  bench/sweep.py), with a second `deepinfer serve` started here as the --compare engine and a
  llama-batched-bench table as a third: decode.csv / prefill.csv rows per engine and point, their
  numbers consistent (ignore_eos: every request yields output_len tokens; tok/s = tokens / wall),
  sweep.json with machine, commit, settings and the server command, and two PNGs that decode as images.
- The in-process mode gives the same CSV shape; --replot draws the PNGs from its sweep.json.
- llama-batched-bench's table parsed to known values; the frontier against a brute-force check.
"""
import csv
import json
import os
import random
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import llama_batched_bench  # noqa: E402
import sweep_plot  # noqa: E402

CLI = os.environ.get("DEEPINFER_CLI")
need_cli = pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI not set (ctest sets it)")
try:
    import matplotlib.image as mpimg
except ImportError:  # pinned in tests/python/requirements.txt
    mpimg = None
need_mpl = pytest.mark.skipif(mpimg is None, reason="matplotlib not installed (pip install -r bench/requirements.txt)")

LLAMA_TABLE = """main: n_kv_max = 4096, n_batch = 2048, n_ubatch = 512, flash_attn = 0, n_threads = 2

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    16 |      8 |    1 |     24 |    0.020 |   800.00 |    0.020 |   400.00 |    0.040 |   600.00 |
|    16 |      8 |    4 |     96 |    0.060 |  1066.67 |    0.050 |   640.00 |    0.110 |   872.73 |
|    16 |     16 |    4 |    128 |    0.061 |  1049.18 |    0.100 |   640.00 |    0.161 |   795.03 |

llama_perf_context_print:        load time =     100.00 ms
"""


def test_llama_batched_bench_parse():
    dec, pre = llama_batched_bench.parse(LLAMA_TABLE)
    assert [(r["concurrency"], r["output_tok_s"], r["per_user_tok_s"]) for r in dec] == \
        [(1, 400.0, 400.0), (4, 640.0, 160.0), (4, 640.0, 160.0)]
    assert [(r["prompt_len"], r["batch"], r["prefill_tok_s"], r["mean_ttft_ms"]) for r in pre] == \
        [(16, 1, 800.0, 20.0), (16, 4, 1066.67, 60.0)]  # one prefill point per (PP, B)
    jl = '{"n_kv_max": 4096, "pp": 32, "tg": 4, "pl": 2, "n_kv": 72, "t_pp": 0.5, "speed_pp": 128.0, "t_tg": 0.25, "speed_tg": 32.0}'
    dec, pre = llama_batched_bench.parse(jl)
    assert dec[0]["per_user_tok_s"] == 16.0 and pre[0]["prefill_tok_s"] == 128.0


def test_frontier_against_brute_force():
    rng = random.Random(5)
    for _ in range(200):
        pts = [(rng.randint(1, 6), rng.randint(1, 6)) for _ in range(rng.randint(1, 8))]
        for better in ("high", "low"):
            s = 1 if better == "high" else -1
            want = {i for i, (x, y) in enumerate(pts)
                    if not any(s * ox >= s * x and oy >= y and (ox, oy) != (x, y) for ox, oy in pts)}
            got = sweep_plot.frontier(pts, better)
            assert set(got) == want and [pts[i][0] for i in got] == sorted(pts[i][0] for i in got)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def sweep(tmp_path, *extra):
    build = os.path.dirname(CLI)
    env = dict(os.environ, DEEPINFER_LIB=os.environ.get("DEEPINFER_LIB", os.path.join(build, "libdeepinfer.so")))
    for k in ("MODEL", "ACCEL", "LOAD", "CONCURRENCY", "PROMPT_LEN", "OUTPUT_LEN", "PROMPT_LENS", "COMPARE"):
        env.pop(k, None)
    env["PYTHON"] = sys.executable  # sweep.py under this interpreter (it has matplotlib)
    env["PARETO_OUT"] = str(tmp_path / "env-out")  # the old variable; the --out flag below wins
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "run_sweep.sh"), build, "--concurrency", "1,2",
                        "--prompt-len", "16", "--output-len", "6", "--prompt-lens", "24,40", "--prefill-batches", "1,2",
                        "--rounds", "1", "--threads", "1", "--client-procs", "2", "--out", str(tmp_path / "out"), *extra],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp_path / "out", r


def check_rows(out, engines):
    dec = read_csv(out / "decode.csv")
    pre = read_csv(out / "prefill.csv")
    for e in engines:
        d = [r for r in dec if r["engine"] == e]
        assert [int(r["concurrency"]) for r in d] == [1, 2]
        for r in d:
            assert int(r["output_tokens"]) == int(r["concurrency"]) * 6  # ignore_eos, one round
            # wall_s has 6 decimals, tok/s 2: the ratio agrees to 2e-3 even for a 1 ms point
            assert float(r["output_tok_s"]) == pytest.approx(int(r["output_tokens"]) / float(r["wall_s"]), rel=2e-3)
            assert float(r["per_user_tok_s"]) > 0 and float(r["mean_ttft_ms"]) > 0
        p = [r for r in pre if r["engine"] == e]
        assert [(int(r["prompt_len"]), int(r["batch"])) for r in p] == [(24, 1), (24, 2), (40, 1), (40, 2)]
        for r in p:
            assert float(r["prefill_tok_s"]) == pytest.approx(int(r["prompt_tokens"]) / float(r["wall_s"]), rel=2e-3)
    return dec, pre


def check_pngs(out):
    for name in ("decode.png", "prefill.png"):
        with open(out / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(str(out / name))
        assert img.shape[0] > 300 and img.shape[1] > 400


@need_cli
@need_mpl
def test_sweep_against_the_server_with_compare_and_llama(tmp_path):
    llama = tmp_path / "llama.txt"
    llama.write_text(LLAMA_TABLE)
    log = open(tmp_path / "other.log", "w")
    other = subprocess.Popen([CLI, "serve", os.path.join(ROOT, "models", "default"), "--port", "0", "--threads", "1",
                              "--num-kv-blocks", "64", "--disable-log-requests"], stdout=subprocess.DEVNULL, stderr=log)
    try:
        url = None
        for _ in range(600):
            m = re.search(r"listening on (http://\S+)", (tmp_path / "other.log").read_text())
            if m:
                url = m.group(1)
                break
            assert other.poll() is None, (tmp_path / "other.log").read_text()
            subprocess.run(["sleep", "0.05"])
        assert url
        out, r = sweep(tmp_path, "--compare", f"other={url}", "--llama-batched-bench", str(llama))
    finally:
        other.terminate()
        other.wait(timeout=30)
        log.close()
    assert "sweep [" in r.stderr  # the progress bar
    dec, pre = check_rows(out, ["deepinfer", "other"])
    assert {r["engine"] for r in dec} == {"deepinfer", "other", "llama.cpp"}
    res = json.loads((out / "sweep.json").read_text())
    assert res["machine"]["cpus"] >= 1 and re.fullmatch(r"[0-9a-f]{40}", res["commit"])
    assert res["settings"]["concurrency"] == [1, 2] and res["settings"]["prompt_len"] == 16
    cmd = res["engines"]["deepinfer"]["command"]
    # KV sized for the largest point: max(2 x ceil(23/64), 2 x ceil(41/64)) = 2 blocks, +10 %, +16
    assert cmd[cmd.index("--num-kv-blocks") + 1] == "18" and cmd[cmd.index("--max-num-seqs") + 1] == "2"
    assert res["engines"]["deepinfer"]["startup_s"] > 0 and res["engines"]["other"]["base_url"] == url
    assert len(res["decode"]) == len(dec) and len(res["prefill"]) == len(pre)
    check_pngs(out)
    assert not (tmp_path / "env-out").exists()


@need_cli
def test_sweep_in_process_csv_only(tmp_path):
    out, _ = sweep(tmp_path, "--in-process", "--no-plots")
    check_rows(out, ["deepinfer"])
    assert json.loads((out / "sweep.json").read_text())["engines"]["deepinfer"]["kind"] == "in-process"
    assert not (out / "decode.png").exists()
    if mpimg is not None:  # the plots drawn afterwards from sweep.json (as for a device run without matplotlib)
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sweep.py"), "--replot", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        check_pngs(out)


def test_llama_parser_on_random_lines():
    """Arbitrary table-like lines: no exception, and every row it returns has positive numbers."""
    rng = random.Random(7)
    cells = ["|", " 16 ", " 0 ", " -1 ", " 0.0 ", " x ", " 1e3 ", " nan ", "|---|", "{", '"pp": 1', "}", "\n"]
    for _ in range(2000):
        text = "".join(rng.choice(cells) for _ in range(rng.randint(0, 40)))
        dec, pre = llama_batched_bench.parse(text)
        assert all(r["wall_s"] > 0 for r in dec + pre)
