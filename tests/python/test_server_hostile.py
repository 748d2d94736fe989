"""`deepinfer serve` under hostile clients (issue 24), on the shipped model over loopback: idle
connections beside active streams, many large bodies at once (the server's peak RSS), one request
with n = 1024 beside short chats, malformed / invalid-UTF-8 / huge / deep inputs (each answered with
a valid JSON error and logged with its status), slow clients timed out, the API key on every route
but /health and /metrics, and the abort counter after disconnects. Bounded in count and time (about
40 s on 2 cores); the open-file limit is raised here for the idle connections."""
import http.client
import json
import os
import re
import resource
import socket
import subprocess
import tempfile
import threading
import time

import pytest

import test_server

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "default")
CLI = os.environ.get("DEEPINFER_CLI", os.path.join(ROOT, "build", "deepinfer"))
BODY_MB = 31

pytestmark = pytest.mark.skipif(not os.path.exists(CLI), reason="deepinfer CLI not built (set DEEPINFER_CLI)")


class Server(test_server.Server):
    """test_server's process handle (text, stop, kill) over the shipped model."""

    def __init__(self, *extra):
        self.log = tempfile.NamedTemporaryFile(prefix="di-hostile-", suffix=".log", delete=False)
        cmd = [CLI, "serve", MODEL, "--port", "0", "--threads", "2", "--seed", "1", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline and self.port is None:
            m = re.search(r"listening on http://[^ ]+:(\d+)", self.text())
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None:
                raise RuntimeError("server exited:\n" + self.text())
            else:
                time.sleep(0.05)
        if self.port is None:
            self.kill()
            raise RuntimeError("server did not start:\n" + self.text())

    def peak_rss_mb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) / 1024

    def rss_mb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) / 1024

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        try:
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def metric(self, name, labels=""):
        raw = self.request("GET", "/metrics")[2].decode()
        m = re.search(r"^%s\{[^}]*%s[^}]*\} (\S+)$" % (re.escape(name), re.escape(labels)), raw, re.M)
        return float(m.group(1)) if m else None


@pytest.fixture(scope="module")
def server():
    s = Server()
    try:
        yield s
        assert s.stop() == 0, s.text()[-3000:]
    finally:
        s.kill()


def read_all(sock):
    """What the server sends until it closes (a reset after its answer ends it too)."""
    got = b""
    while True:
        try:
            b = sock.recv(65536)
        except ConnectionResetError:
            break
        if not b:
            break
        got += b
    return got


def json_error(raw):
    """The body must be a JSON error object (valid UTF-8 JSON)."""
    body = json.loads(raw.decode("utf-8"))
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"], body
    return body["error"]


def stream_ttft(port, results, i, tag):
    """One streamed chat: seconds to its first content event."""
    body = json.dumps({"messages": [{"role": "user", "content": "Hello %s %d" % (tag, i)}], "max_tokens": 8, "stream": True,
                       "temperature": 0, "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    t0 = time.time()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    got, ttft = b"", None
    while True:
        b = sock.recv(65536)
        if not b:
            break
        got += b
        if ttft is None and b'"content":"' in got.split(b'"role":"assistant"', 1)[-1]:
            ttft = time.time() - t0
    sock.close()
    assert got.startswith(b"HTTP/1.1 200 ") and b"data: [DONE]" in got, got[:300]
    results[i] = ttft if ttft is not None else time.time() - t0


def streams_ttft_p99(port, tag, n=32):
    """TTFT p99 of n concurrent streams (prompts unique to `tag`: no prefix-cache hits from an earlier run)."""
    results = [None] * n
    threads = [threading.Thread(target=stream_ttft, args=(port, results, i, tag)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(r is not None for r in results)
    results.sort()
    return results[min(n - 1, int(0.99 * n))]


def test_idle_connections_beside_streams(server):
    want = 2000 + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < want:
        pytest.skip("open-file limit too low for 2000 idle connections")
    streams_ttft_p99(server.port, "warm-up", 8)
    base = streams_ttft_p99(server.port, "alone")
    idle = []
    try:
        for i in range(2000):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            if i % 2:
                s.sendall(b"P")  # a request started and never finished (slowloris)
            idle.append(s)
        time.sleep(0.5)
        t0 = time.time()
        status = server.request("GET", "/health", timeout=5)[0]
        health_s = time.time() - t0
        assert status == 200 and health_s < 1.0, health_s
        loaded = streams_ttft_p99(server.port, "beside")
        t0 = time.time()
        assert server.request("GET", "/health", timeout=5)[0] == 200 and time.time() - t0 < 1.0
        assert server.metric("deepinfer_open_connections", "") is None  # unlabelled: read below
        raw = server.request("GET", "/metrics")[2].decode()
        assert int(re.search(r"^deepinfer_open_connections (\d+)$", raw, re.M).group(1)) >= 2000
    finally:
        for s in idle:
            s.close()
    print("TTFT p99 of 32 streams: %.3f s alone, %.3f s beside 2000 idle connections; /health %.3f s"
          % (base, loaded, health_s))
    # 2x, plus 0.1 s for the noise of a shared 2-core machine
    assert loaded <= 2 * base + 0.1, (base, loaded)


def post_raw(port, path, head_extra, body, out, i, chunked=False):
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        if chunked:
            sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n%s\r\n" % (path, head_extra))
            step = 1 << 20
            try:
                for k in range(0, len(body), step):
                    part = body[k:k + step]
                    sock.sendall(b"%x\r\n" % len(part) + part + b"\r\n")
                sock.sendall(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
        else:
            sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n" % (path, len(body), head_extra))
            try:
                sock.sendall(body)
            except (BrokenPipeError, ConnectionResetError):
                pass
        out[i] = read_all(sock)
        sock.close()
    except OSError as e:
        out[i] = repr(e).encode()


def test_parallel_large_bodies_bounded_memory(server):
    mb = 1 << 20
    text = b'{"prompt": "' + b"a" * (BODY_MB * mb - 20) + b'"}'  # a text prompt
    ids = b'{"tokens": [' + b"1," * ((BODY_MB * mb - 20) // 2) + b'1]}'  # a list of token ids
    string_tokens = b'{"tokens": "' + b"7" * (BODY_MB * mb - 20) + b'"}'  # a body parsed whole: /detokenize
    cases = []
    for i in range(20):
        k = i % 4
        cases.append([(b"/v1/completions", text, False), (b"/v1/completions", text, True),
                      (b"/detokenize", ids, False), (b"/detokenize", string_tokens, False)][k])
    rss0 = server.rss_mb()
    out = [None] * len(cases)
    threads = [threading.Thread(target=post_raw, args=(server.port, p, b"Connection: close\r\n", b, out, i, ch))
               for i, (p, b, ch) in enumerate(cases)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    took = time.time() - t0
    peak = server.peak_rss_mb()
    for (path, body, chunked), got in zip(cases, out):
        assert got and got.startswith(b"HTTP/1.1 4"), (path, chunked, got[:200])
        status = int(got[9:12])
        err = json_error(got.split(b"\r\n\r\n", 1)[1])
        if body is ids:
            assert status == 413 and "more than 1048576 values" in err["message"], err
        elif body is text:
            assert status == 413 and "max_model_len" in err["message"], err
        else:
            assert status == 400 and "tokens" in err["message"], err
    print("20 parallel %d MB bodies: %.1f s, RSS %.0f MB before, peak %.0f MB" % (BODY_MB, took, rss0, peak))
    # only /detokenize's string bodies are taken whole (5 x 31 MB, twice: the body and its parsed
    # string); the others are refused at the head or within a few MB: peak under 5 x 2 x 31 MB + 200 MB
    assert peak - rss0 < 5 * 2 * BODY_MB + 200, (rss0, peak)
    assert server.request("GET", "/health")[0] == 200


def test_big_n_beside_short_chats(server):
    def chat(i, out):
        t0 = time.time()
        st, h, raw = server.request("POST", "/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": "hi %d" % i}], "max_tokens": 8,
                                     "temperature": 0, "ignore_eos": True}, timeout=120)
        out[i] = (st, time.time() - t0)

    alone = [None] * 8
    for i in range(8):
        chat(i, alone)
    base = max(t for _, t in alone)
    big = {}

    def big_request():
        t0 = time.time()
        st, h, raw = server.request("POST", "/v1/completions",
                                    {"prompt": "Once upon a time", "n": 1024, "max_tokens": 6, "temperature": 1.0,
                                     "ignore_eos": True}, timeout=300)
        big["status"], big["s"] = st, time.time() - t0
        big["n"] = len(json.loads(raw)["choices"]) if st == 200 else raw[:200]

    bt = threading.Thread(target=big_request)
    bt.start()
    time.sleep(1.0)  # the big request is running
    beside = [None] * 8
    ts = [threading.Thread(target=chat, args=(i, beside)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    bt.join(300)
    worst = max(t for _, t in beside)
    print("8-token chats: %.2f s alone (worst), %.2f s beside n=1024 (worst); the n=1024 request %.1f s"
          % (base, worst, big.get("s", -1)))
    assert all(st == 200 for st, _ in beside) and big["status"] == 200 and big["n"] == 1024
    # admitted at once (a quarter of the batch stays open to other requests): a chat takes its own
    # few steps, each slower beside 768 running samples, not the n = 1024 request's whole time
    assert worst < big["s"] / 2, "the chats waited for the n = 1024 request (%.2f s of %.2f s)" % (worst, big["s"])


def test_malformed_inputs_answered_and_logged(server):
    deep = b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    def post(path, body):
        return b"POST %s HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (path, len(body)) + body

    cases = [
        (post(b"/v1/completions", b"{not json"), 400, "byte"),
        (post(b"/v1/completions", b'{"prompt": "\xff\xfe\xc0\xaf"}'), 400, "UTF-8"),
        (post(b"/v1/completions", deep), 400, "nested deeper"),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n", 413, "larger"),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
         "Content-Length and Transfer-Encoding"),
        (b"POST /v1/completions HTTP/1.1\r\n\r\n", 411, "Content-Length"),
        (b"GET /v1/\xff\xfe/x HTTP/1.1\r\n\r\n", 404, "no such endpoint"),
        (post(b"/v1/completions", b"[]"), 400, "object"),
        (post(b"/v1/completions", b'{"prompt": "x", "n": 100000}'), 400, "n"),
        (post(b"/tokenize", b'{"prompt": 12345}'), 400, "prompt"),
    ]
    for req, status, needle in cases:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(req.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nHost: x\r\nConnection: close\r\n", 1))
            out = read_all(sock)
        assert out.startswith(b"HTTP/1.1 %d " % status), (req[:60], out[:300])
        err = json_error(out.split(b"\r\n\r\n", 1)[1])
        assert needle in err["message"] or needle == err["param"], (req[:60], err)
    time.sleep(0.2)
    log = server.text()
    for _, status, _ in cases:
        assert re.search(r"rejected %d: " % status, log), status
    assert "nested deeper than 64 levels" in log and "not valid UTF-8" in log
    # protocol errors libmicrohttpd answers itself: the right status, its fixed HTML page (0.9.75 has
    # no hook to replace it: docs/server.md), each logged with its status and reason
    own = [(b"GET / HTTP/2.0\r\n\r\n", 505, "version is not supported"),
           (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (70 << 10) + b"\r\n\r\n", 431, "header was too big"),
           (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n{}\r\n0\r\n\r\n",
            400, "chunked encoding was syntactically incorrect"),
           (b"GET / HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n", 400, "request was syntactically incorrect")]
    for req, status, title in own:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            try:
                sock.sendall(req)
            except (BrokenPipeError, ConnectionResetError):
                pass
            out = read_all(sock)
        assert out.startswith(b"HTTP/1.1 %d " % status), (req[:40], out[:200])
        time.sleep(0.2)
        assert re.search(r"rejected %d by libmicrohttpd \(its HTML body, not JSON\): .*%s" % (status, title),
                         server.text(), re.I), (status, server.text()[-1500:])
    # a request line it cannot split is closed without an answer: the close is logged
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GARBAGE\r\n\r\n")
        assert read_all(sock) == b""
    time.sleep(0.3)
    assert re.search(r"connection closed unanswered: 400: a request line libmicrohttpd cannot parse \(11 bytes\)",
                     server.text()), server.text()[-1500:]
    # a connection that sent nothing is no rejection (the kernel counts the client's FIN as a byte)
    before = server.text().count("connection closed unanswered")
    socket.create_connection(("127.0.0.1", server.port), timeout=30).close()
    time.sleep(0.3)
    assert server.text().count("connection closed unanswered") == before, server.text()[-500:]


def test_slow_clients_api_key_and_abort_counter():
    s = Server("--api-key", "k3y", "--keep-alive-timeout", "2", "--request-timeout", "3")
    try:
        # a slow client (head never finished) is closed after the keep-alive timeout
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        t0 = time.time()
        assert sock.recv(100) == b"" and 1.5 < time.time() - t0 < 8
        sock.close()
        time.sleep(0.2)
        assert re.search(r"connection closed unanswered: 408: no complete request head within 2 s", s.text()), s.text()
        # a body trickled slower than --request-timeout allows is cut off
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=15)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\nContent-Length: 100\r\n\r\n{")
        t0 = time.time()
        got = b""
        try:
            for _ in range(10):
                time.sleep(1.0)
                sock.sendall(b" ")
        except OSError:
            pass
        try:
            got = sock.recv(100)
        except OSError:
            pass
        assert got == b"" and time.time() - t0 < 12
        sock.close()
        assert re.search(r'"POST /v1/completions" rejected 408: timed out reading the request body', s.text()), s.text()
        # the key guards every route but /health, /ping and /metrics
        for method, path, body in [("POST", "/tokenize", {"prompt": "x"}), ("POST", "/detokenize", {"tokens": [1]}),
                                   ("GET", "/v1/models", None), ("GET", "/version", None),
                                   ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})]:
            st, h, raw = s.request(method, path, body)
            assert st == 401 and json_error(raw)["code"] == "invalid_api_key", (path, st)
            st, h, raw = s.request(method, path, body, headers={"Authorization": "Bearer k3y"})
            assert st == 200, (path, st, raw[:200])
        for path in ["/health", "/ping", "/metrics"]:
            assert s.request("GET", path)[0] == 200, path
        # streams cut by their clients: counted as aborts
        before = s.metric("deepinfer_request_success_total", 'finished_reason="abort"')
        body = json.dumps({"prompt": "abort me", "max_tokens": 1000, "ignore_eos": True, "stream": True}).encode()
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            got = b""
            while got.count(b"data: ") < 3:
                got += sock.recv(4096)
            sock.close()
        deadline = time.time() + 10
        while time.time() < deadline and s.metric("deepinfer_request_success_total", 'finished_reason="abort"') < before + 3:
            time.sleep(0.1)
        assert s.metric("deepinfer_request_success_total", 'finished_reason="abort"') >= before + 3
        raw = s.request("GET", "/metrics")[2].decode()
        for name in ["deepinfer_prefix_cache_queries_total", "deepinfer_prefix_cache_hits_total",
                     "deepinfer_kv_cache_usage_perc", "deepinfer_kv_cache_blocks_used", "deepinfer_kv_cache_blocks_total",
                     "deepinfer_time_to_first_token_seconds_bucket", "deepinfer_inter_token_latency_seconds_bucket",
                     "deepinfer_spec_decode_num_drafts_total", "deepinfer_spec_decode_num_accepted_tokens_total"]:
            assert re.search(r"^%s\{" % name, raw, re.M), name
        assert "k3y" not in s.text()
        assert s.stop() == 0, s.text()[-2000:]
    finally:
        s.kill()
