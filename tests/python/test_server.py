"""`deepinfer serve`: the OpenAI-compatible HTTP server, end to end over loopback.

A server runs on 127.0.0.1 (a free port chosen by the kernel) on engine-dummy (random weights with the
default model's tokenizer and chat template). Checked: response shapes, completions from text and
token prompts, several prompts and n > 1, chat, streaming (chunks concatenate to the greedy text),
stop strings, logprobs, structured outputs, errors with their status codes, keep-alive, chunked
request bodies, concurrent requests, a client that disconnects mid-stream (its request is aborted),
the API key, and graceful shutdown on SIGTERM. The official `openai` client parses the responses
when it is installed. The server process is always killed at the end.
"""
import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DUMMY = os.path.join(ROOT, "tests", "data", "models", "engine-dummy")
CLI = os.environ.get("DEEPINFER_CLI", os.path.join(ROOT, "build", "deepinfer"))
NAME = "test-model"
MAX_LEN = 1024  # engine-dummy's max_position_embeddings

pytestmark = pytest.mark.skipif(not os.path.exists(CLI), reason="deepinfer CLI not built (set DEEPINFER_CLI)")


class Server:
    def __init__(self, *extra, model=DUMMY):
        self.log = tempfile.NamedTemporaryFile(prefix="di-serve-", suffix=".log", delete=False)
        cmd = [CLI, "serve", model, "--load-format", "dummy", "--seed", "1", "--port", "0", "--threads", "2",
               "--num-kv-blocks", "512", "--served-model-name", NAME, "--max-body-bytes", "65536",
               "--shutdown-timeout", "10", "--enable-auto-tool-choice", "--tool-call-parser", "deepseek_v3", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline:
            text = self.text()
            m = re.search(r"listening on http://[^ ]+:(\d+)", text)
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                raise RuntimeError("server exited:\n" + text)
            time.sleep(0.05)
        if self.port is None:
            self.kill()
            raise RuntimeError("server did not start:\n" + self.text())

    def text(self):
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, timeout=20):
        """SIGTERM, then the exit code (killed and None when it does not exit in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, conn=None):
        c = conn or self.conn()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        if conn is None:
            c.close()
        return r.status, dict(r.getheaders()), raw

    def post(self, path, body, **kw):
        status, headers, raw = self.request("POST", path, body, **kw)
        return status, json.loads(raw) if raw else None

    def stream(self, path, body):
        """The SSE events of a streamed request (JSON objects), and whether [DONE] ended it."""
        status, headers, raw = self.request("POST", path, body)
        assert status == 200, raw
        assert headers.get("Content-Type", "").startswith("text/event-stream")
        events, done = [], False
        for block in raw.decode().split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), block
            payload = block[6:]
            assert not done, "data after [DONE]"
            if payload == "[DONE]":
                done = True
            else:
                events.append(json.loads(payload))
        return events, done


@pytest.fixture(scope="module")
def server():
    s = Server()
    try:
        yield s
        rc = s.stop()  # graceful: exit code 0 (under ASan also: no leak)
        assert rc == 0, s.text()[-3000:]
    finally:
        s.kill()


def check_error(status, body, code, param=None):
    assert status == code, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], body
    if param is not None:
        assert err["param"] == param, body


def greedy(**kw):
    d = {"temperature": 0, "ignore_eos": True, "max_tokens": 12}
    d.update(kw)
    return d


def test_health_models_version(server):
    status, headers, raw = server.request("GET", "/health")
    assert status == 200
    status, body = server.post("/v1/models", {})  # wrong method
    check_error(status, body, 405)
    status, headers, raw = server.request("GET", "/v1/models")
    assert status == 200
    models = json.loads(raw)
    assert models["object"] == "list" and len(models["data"]) == 1
    m = models["data"][0]
    assert m["id"] == NAME and m["object"] == "model" and m["max_model_len"] == MAX_LEN
    assert isinstance(m["created"], int) and m["owned_by"]
    status, headers, raw = server.request("GET", "/v1/models/" + NAME)
    assert status == 200 and json.loads(raw)["id"] == NAME
    status, headers, raw = server.request("GET", "/v1/models/other")
    check_error(status, json.loads(raw), 404)
    status, headers, raw = server.request("GET", "/version")
    assert status == 200 and "version" in json.loads(raw)


def test_completion_shape_and_usage(server):
    status, body = server.post("/v1/completions", greedy(model=NAME, prompt="The quick brown fox", max_tokens=10))
    assert status == 200, body
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == NAME
    assert isinstance(body["created"], int)
    (c,) = body["choices"]
    assert c["index"] == 0 and c["finish_reason"] == "length" and c["logprobs"] is None and len(c["text"]) > 0
    u = body["usage"]
    assert u["completion_tokens"] == 10 and u["prompt_tokens"] > 1
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    # the model may be omitted; it is the same request
    status, again = server.post("/v1/completions", greedy(prompt="The quick brown fox", max_tokens=10))
    assert status == 200 and again["choices"][0]["text"] == c["text"]


def test_token_prompts_lists_and_n(server):
    status, one = server.post("/v1/completions", greedy(prompt=[0, 100, 200, 300]))
    assert status == 200 and one["usage"]["prompt_tokens"] == 4
    status, many = server.post("/v1/completions", greedy(prompt=[[0, 100, 200, 300], "Hello there"]))
    assert status == 200
    assert [c["index"] for c in many["choices"]] == [0, 1]
    assert many["choices"][0]["text"] == one["choices"][0]["text"]
    assert many["usage"]["completion_tokens"] == 24
    status, multi = server.post("/v1/completions", {"prompt": ["a", "b"], "n": 3, "max_tokens": 5, "temperature": 1.0,
                                                    "seed": 7, "ignore_eos": True})
    assert status == 200
    assert sorted(c["index"] for c in multi["choices"]) == list(range(6))
    assert multi["usage"]["completion_tokens"] == 30
    # seeded sampling is reproducible
    status, multi2 = server.post("/v1/completions", {"prompt": ["a", "b"], "n": 3, "max_tokens": 5, "temperature": 1.0,
                                                     "seed": 7, "ignore_eos": True})
    assert [c["text"] for c in multi2["choices"]] == [c["text"] for c in multi["choices"]]


def test_echo(server):
    status, plain = server.post("/v1/completions", greedy(prompt="Echo me", max_tokens=4))
    status, echoed = server.post("/v1/completions", greedy(prompt="Echo me", max_tokens=4, echo=True))
    assert status == 200 and echoed["choices"][0]["text"] == "Echo me" + plain["choices"][0]["text"]


def test_chat_shape(server):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    status, body = server.post("/v1/chat/completions", greedy(model=NAME, messages=msgs, max_completion_tokens=8))
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (c,) = body["choices"]
    assert c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str)
    assert c["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 8
    # content as parts is the same conversation
    parts = [msgs[0], {"role": "user", "content": [{"type": "text", "text": "Hi!"}]}]
    status, body2 = server.post("/v1/chat/completions", greedy(messages=parts, max_tokens=8))
    assert status == 200 and body2["choices"][0]["message"]["content"] == c["message"]["content"]
    # /tokenize renders the same prompt the chat endpoint uses
    status, tok = server.post("/tokenize", {"messages": msgs})
    assert status == 200 and tok["count"] == body["usage"]["prompt_tokens"] and tok["tokens"].count(0) == 1


def test_stream_equals_whole(server):
    for path, req in [("/v1/completions", greedy(prompt="Streaming test", max_tokens=16)),
                      ("/v1/chat/completions", greedy(messages=[{"role": "user", "content": "Stream?"}], max_tokens=16))]:
        status, whole = server.post(path, req)
        assert status == 200
        events, done = server.stream(path, dict(req, stream=True, stream_options={"include_usage": True}))
        assert done
        chat = path.endswith("chat/completions")
        usage = events[-1]
        assert usage["choices"] == [] and usage["usage"] == whole["usage"]
        text, finish = "", None
        for e in events[:-1]:
            assert e["object"] == ("chat.completion.chunk" if chat else "text_completion")
            assert e["id"] == events[0]["id"] and e["model"] == NAME and "usage" in e and e["usage"] is None
            (c,) = e["choices"]
            text += (c["delta"].get("content") or "") if chat else c["text"]
            if c["finish_reason"]:
                finish = c["finish_reason"]
        if chat:
            assert events[0]["choices"][0]["delta"]["role"] == "assistant"
            assert text == whole["choices"][0]["message"]["content"]
        else:
            assert text == whole["choices"][0]["text"]
        assert finish == "length"
    # without include_usage there is no usage chunk
    events, done = server.stream("/v1/completions", greedy(prompt="x", max_tokens=3, stream=True))
    assert done and all("usage" not in e for e in events) and all(e["choices"] for e in events)


def test_stream_n_and_prompts(server):
    req = {"prompt": ["one", "two"], "n": 2, "max_tokens": 6, "temperature": 1.0, "seed": 3, "ignore_eos": True}
    status, whole = server.post("/v1/completions", req)
    events, done = server.stream("/v1/completions", dict(req, stream=True))
    texts = {}
    for e in events:
        for c in e["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert done and texts == {c["index"]: c["text"] for c in whole["choices"]}


def test_stop_strings(server):
    status, full = server.post("/v1/completions", greedy(prompt="The quick brown fox", max_tokens=24))
    text = full["choices"][0]["text"]
    stop = text[4:7]
    status, cut = server.post("/v1/completions", greedy(prompt="The quick brown fox", max_tokens=24, stop=[stop, "never-in-output-\u263a"]))
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["text"] == text[:text.index(stop)]
    status, one = server.post("/v1/completions", greedy(prompt="The quick brown fox", max_tokens=24, stop=stop,
                                                        include_stop_str_in_output=True))
    assert one["choices"][0]["text"] == text[:text.index(stop) + len(stop)]
    events, done = server.stream("/v1/completions", greedy(prompt="The quick brown fox", max_tokens=24, stop=stop,
                                                           stream=True))
    assert "".join(e["choices"][0]["text"] for e in events) == text[:text.index(stop)]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_logprobs(server):
    status, body = server.post("/v1/completions", greedy(prompt="Log probs", max_tokens=5, logprobs=2))
    assert status == 200
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 5
    assert all(x <= 0 for x in lp["token_logprobs"])
    assert all(1 <= len(d) <= 3 for d in lp["top_logprobs"])
    # greedy: the chosen token is the most likely one
    for tok, l, d in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert abs(max(d.values()) - l) < 1e-4 and tok in d
    status, chat = server.post("/v1/chat/completions", greedy(messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                                              logprobs=True, top_logprobs=3))
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for e in content:
        assert set(e) >= {"token", "logprob", "bytes", "top_logprobs"} and len(e["top_logprobs"]) == 3
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] or "\ufffd" in e["token"]
    events, done = server.stream("/v1/chat/completions", greedy(messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                                                logprobs=True, stream=True))
    streamed = [x for e in events for c in e["choices"] if c.get("logprobs") for x in c["logprobs"]["content"]]
    assert [x["token"] for x in streamed] == [x["token"] for x in content]


def test_structured_outputs(server):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}
    req = {"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 60, "temperature": 0,
           "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}}
    status, body = server.post("/v1/chat/completions", req)
    assert status == 200, body
    c = body["choices"][0]
    if c["finish_reason"] == "stop":
        v = json.loads(c["message"]["content"])
        assert set(v) == {"ok", "n"} and isinstance(v["ok"], bool) and v["n"] in (1, 2, 3)
    else:
        assert c["message"]["content"].startswith("{")
    status, body = server.post("/v1/completions", {"prompt": "Pick:", "max_tokens": 10, "temperature": 0,
                                                   "structured_outputs": {"choice": ["red", "green", "blue"]}})
    assert status == 200 and body["choices"][0]["text"] in ("red", "green", "blue")
    status, body = server.post("/v1/completions", {"prompt": "Digits:", "max_tokens": 10, "temperature": 0,
                                                   "guided_regex": "[0-9]{3}"})
    assert status == 200 and re.fullmatch("[0-9]{3}", body["choices"][0]["text"])
    status, body = server.post("/v1/completions", {"prompt": "Obj:", "max_tokens": 40, "temperature": 0.7, "seed": 1,
                                                   "response_format": {"type": "json_object"}})
    assert status == 200 and body["choices"][0]["text"].lstrip().startswith("{")
    if body["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(body["choices"][0]["text"]), dict)
    # a regex that does not compile is the client's error
    status, body = server.post("/v1/completions", {"prompt": "x", "guided_regex": "(unclosed"})
    check_error(status, body, 400)
    status, body = server.post("/v1/completions", {"prompt": "x", "guided_regex": "a", "guided_json": {}})
    check_error(status, body, 400)
    # issue 23: Lark grammars, response_format strict, generation bounds, and their errors
    status, body = server.post("/v1/completions", {"prompt": "x", "max_tokens": 8, "temperature": 0,
                                                   "structured_outputs": {"grammar": 'start: "a"+ "b"',
                                                                          "grammar_syntax": "lark"}})
    assert status == 200 and re.fullmatch("a+b?", body["choices"][0]["text"]), body
    loose = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    status, body = server.post("/v1/completions", {
        "prompt": "x", "max_tokens": 30, "temperature": 0.9, "seed": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": loose, "strict": True}}})
    assert status == 200, body
    text = body["choices"][0]["text"]
    assert re.fullmatch(r'\{"n":-?[0-9]{1,16}\}', text) or body["choices"][0]["finish_reason"] == "length", text
    status, body = server.post("/v1/completions", {"prompt": "x", "max_tokens": 30, "temperature": 0.9, "seed": 2,
                                                   "structured_outputs": {"json": {"type": "integer"},
                                                                          "max_digits": 2}})
    assert status == 200 and re.fullmatch(r"-?[0-9]{1,2}", body["choices"][0]["text"]), body
    status, body = server.post("/v1/completions", {"prompt": "x", "max_tokens": 30, "temperature": 0.9, "seed": 2,
                                                   "structured_outputs": {"json": {"type": "string", "format": "email"},
                                                                          "max_string_length": 9}})
    text = body["choices"][0]["text"] if status == 200 else ""
    assert status == 200 and re.fullmatch(r'"[^"]{3,9}"', text) and "@" in text, body
    assert body["choices"][0]["finish_reason"] == "stop", body
    # XGrammar's separators [item, key] and max_whitespace
    obj = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
           "required": ["a", "b"], "additionalProperties": False}
    status, body = server.post("/v1/completions", {"prompt": "x", "max_tokens": 30, "temperature": 0.9, "seed": 3,
                                                   "structured_outputs": {"json": obj, "separators": [" ,  ", ":  "],
                                                                          "max_digits": 2}})
    assert status == 200, body
    text = body["choices"][0]["text"]
    assert re.fullmatch(r'\{"a":  -?[0-9]{1,2} ,  "b":  (true|false)\}', text) or (
        body["choices"][0]["finish_reason"] == "length" and text.startswith('{"a":  ')), text
    status, body = server.post("/v1/completions", {"prompt": "x", "max_tokens": 40, "temperature": 0.9, "seed": 3,
                                                   "structured_outputs": {"json": {"type": "array", "items": {
                                                       "type": "integer"}}, "max_whitespace": 1, "max_digits": 2}})
    assert status == 200, body
    text = body["choices"][0]["text"]
    assert re.fullmatch(r"\[\s?(-?[0-9]{1,2}\s?(,\s?-?[0-9]{1,2}\s?)*)?\]", text) or (
        body["choices"][0]["finish_reason"] == "length"), text
    assert re.search(r"\s", text), text  # this seed's sample writes some (checked: "[\n45,18,\n77, ...")
    # XGrammar's indent: a newline and the level's spaces, "," / ": " unless given
    status, body = server.post("/v1/completions", {"prompt": "x", "max_tokens": 40, "temperature": 0.9, "seed": 3,
                                                   "structured_outputs": {"json": obj, "indent": 3, "max_digits": 2}})
    assert status == 200, body
    text = body["choices"][0]["text"]
    assert re.fullmatch(r'\{\n   "a": -?[0-9]{1,2},\n   "b": (true|false)\n\}', text) or (
        body["choices"][0]["finish_reason"] == "length" and text.startswith('{\n   "a": ')), repr(text)
    for bad in ({"json": {}, "indent": 0}, {"json": {}, "indent": 17}, {"json": {}, "indent": 2, "max_whitespace": 1},
                {"regex": "a", "indent": 2}):
        status, body = server.post("/v1/completions", {"prompt": "x", "structured_outputs": bad})
        check_error(status, body, 400)
    for bad in ({"grammar": "start: x", "grammar_syntax": "peg"}, {"json": {}, "max_digits": 0},
                {"json": {}, "strict": "yes"}, {"grammar": "s: \"x\"", "grammar_syntax": "lark"},
                {"json": {}, "separators": [";", ":"]}, {"json": {}, "separators": [","]},
                {"json": {}, "max_whitespace": 100}):
        status, body = server.post("/v1/completions", {"prompt": "x", "structured_outputs": bad})
        check_error(status, body, 400)
    status, body = server.post("/v1/completions", {"prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"name": "t", "schema": {}, "strict": 1}}})
    check_error(status, body, 400)


def test_errors(server):
    s = server
    status, h, raw = s.request("POST", "/v1/completions", b"{not json")
    check_error(status, json.loads(raw), 400)
    assert "byte 2" in json.loads(raw)["error"]["message"]
    status, h, raw = s.request("POST", "/v1/completions", b"")
    check_error(status, json.loads(raw), 400)
    check_error(*s.post("/v1/completions", [1, 2]), 400)
    check_error(*s.post("/v1/completions", {"prompt": "x", "max_tokens": "ten"}), 400, "max_tokens")
    check_error(*s.post("/v1/completions", {"prompt": "x", "max_tokens": 0}), 400, "max_tokens")
    check_error(*s.post("/v1/completions", {"prompt": "x", "temperature": -1}), 400, "temperature")
    check_error(*s.post("/v1/completions", {"prompt": "x", "top_p": 0}), 400, "top_p")
    check_error(*s.post("/v1/completions", {"prompt": "x", "n": 0}), 400, "n")
    check_error(*s.post("/v1/completions", {"prompt": "x", "stop": [1]}), 400, "stop")
    check_error(*s.post("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}), 400, "logit_bias")
    check_error(*s.post("/v1/completions", {"prompt": "x", "logprobs": 50}), 400, "logprobs")
    check_error(*s.post("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}), 400,
                "stream_options")
    check_error(*s.post("/v1/completions", {"prompt": [5, -1]}), 400, "prompt")
    check_error(*s.post("/v1/completions", {"prompt": [99999]}), 400, "prompt")
    check_error(*s.post("/v1/completions", {"prompt": []}), 400, "prompt")
    check_error(*s.post("/v1/completions", {}), 400, "prompt")
    check_error(*s.post("/v1/chat/completions", {"messages": []}), 400, "messages")
    check_error(*s.post("/v1/chat/completions", {"messages": [{"content": "no role"}]}), 400)
    check_error(*s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), 400)
    check_error(*s.post("/v1/chat/completions", {"messages": "hi"}), 400, "messages")
    st, body = s.post("/v1/completions", {"prompt": "x", "model": "gpt-4"})
    check_error(st, body, 404, "model")
    assert body["error"]["code"] == "model_not_found"
    st, body = s.post("/v1/completions", {"prompt": [7] * MAX_LEN})
    check_error(st, body, 400, "prompt")
    assert body["error"]["code"] == "context_length_exceeded"
    st, body = s.post("/v1/completions", {"prompt": [7] * 1000, "max_tokens": 100})
    check_error(st, body, 400, "max_tokens")
    # a long prompt without max_tokens gets the rest of the context
    st, body = s.post("/v1/completions", {"prompt": [7] * (MAX_LEN - 3), "temperature": 0, "ignore_eos": True})
    assert st == 200 and body["usage"]["completion_tokens"] == 3
    st, h, raw = s.request("GET", "/no/such/path")
    check_error(st, json.loads(raw), 404)
    st, h, raw = s.request("GET", "/v1/completions")
    check_error(st, json.loads(raw), 405)
    assert h.get("Allow") == "POST"
    st, h, raw = s.request("POST", "/v1/completions", b"x" * 70000)
    check_error(st, json.loads(raw), 413)


def raw_exchange(port, data, read_until_close=True, timeout=10):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        out = b""
        while True:
            try:
                b = sock.recv(65536)
            except ConnectionResetError:  # closed with the client's bytes unread (after the answer)
                break
            except socket.timeout:
                break
            if not b:
                break
            out += b
            if not read_until_close and b"\r\n\r\n" in out:
                break
        return out


def test_raw_http(server):
    # no Content-Length on a POST
    out = raw_exchange(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 411 ")
    # a chunked request body
    body = json.dumps(greedy(prompt="The quick brown fox", max_tokens=10)).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7]) for i in range(0, len(body), 7)) + b"0\r\n\r\n"
    out = raw_exchange(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                    b"Connection: close\r\n\r\n" + chunks)
    assert out.startswith(b"HTTP/1.1 200 "), out
    status, whole = server.post("/v1/completions", greedy(prompt="The quick brown fox", max_tokens=10))
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["choices"][0]["text"] == whole["choices"][0]["text"]
    # malformed heads: answered and closed
    # (a request line libmicrohttpd cannot split at all is closed without an answer)
    assert raw_exchange(server.port, b"GARBAGE\r\n\r\n") in (b"",) or raw_exchange(server.port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    for bad, code in [(b"GET / HTTP/2.0\r\n\r\n", b"505"),
                      (b"GET / HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", b"431"),
                      (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", b"400"),
                      (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", b"400")]:
        out = raw_exchange(server.port, bad)
        assert out.startswith(b"HTTP/1.1 " + code), (bad[:40], out[:80])
    # pipelined requests on one connection, answered in order
    out = raw_exchange(server.port, b"GET /health HTTP/1.1\r\n\r\nGET /version HTTP/1.1\r\n\r\n"
                                    b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 200 ") == 2 and out.count(b"HTTP/1.1 404 ") == 1
    # Expect: 100-continue
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        body = json.dumps(greedy(prompt="x", max_tokens=2)).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\nExpect: 100-continue\r\n"
                     b"Connection: close\r\n\r\n" % len(body))
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        out = b""
        while True:
            b = sock.recv(65536)
            if not b:
                break
            out += b
        assert out.startswith(b"HTTP/1.1 200 ")


def test_keep_alive(server):
    c = server.conn()
    for i in range(3):
        status, h, raw = server.request("POST", "/v1/completions", json.dumps(greedy(prompt="k", max_tokens=2)), conn=c)
        assert status == 200 and h.get("Connection") in (None, "keep-alive")  # HTTP/1.1: kept by default
    status, h, raw = server.request("GET", "/v1/nope", conn=c)  # an error keeps the connection too
    assert status == 404
    status, h, raw = server.request("GET", "/health", conn=c)
    assert status == 200
    c.close()


def test_concurrent_requests(server):
    prompts = ["Alpha %d" % i for i in range(8)]
    solo = {}
    for p in prompts[:3]:
        solo[p] = server.post("/v1/completions", greedy(prompt=p, max_tokens=16))[1]["choices"][0]["text"]
    results, errors = {}, []

    def worker(p, stream):
        try:
            if stream:
                events, done = server.stream("/v1/completions", greedy(prompt=p, max_tokens=16, stream=True))
                assert done
                results[p] = "".join(e["choices"][0]["text"] for e in events)
            else:
                st, body = server.post("/v1/completions", greedy(prompt=p, max_tokens=16))
                assert st == 200 and body["usage"]["completion_tokens"] == 16
                results[p] = body["choices"][0]["text"]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(p, i % 2 == 1)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(results) == len(prompts), errors
    # batching does not change greedy output much on this model; the text is at least well formed
    assert all(isinstance(v, str) and v for v in results.values())
    same = sum(results[p] == solo[p] for p in solo)
    assert same >= 1, (results, solo)


def metric(server, name):
    status, h, raw = server.request("GET", "/metrics")
    m = re.search(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), raw.decode(), re.M)
    return float(m.group(1))


def test_disconnect_aborts(server):
    before = metric(server, "deepinfer_client_disconnects_total")
    gen_before = metric(server, "deepinfer_generation_tokens_total")
    body = json.dumps(greedy(prompt="Long one", max_tokens=900, stream=True)).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += sock.recv(4096)
    sock.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        if (metric(server, "deepinfer_client_disconnects_total") > before and
                metric(server, "deepinfer_num_requests_running") == 0):
            break
        time.sleep(0.05)
    assert metric(server, "deepinfer_client_disconnects_total") == before + 1
    assert metric(server, "deepinfer_num_requests_running") == 0
    assert metric(server, "deepinfer_generation_tokens_total") - gen_before < 900
    # a non-streamed request whose client leaves is aborted too
    body = json.dumps(greedy(prompt="Long two", max_tokens=900)).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(0.05)
    sock.close()
    deadline = time.time() + 30
    while time.time() < deadline and metric(server, "deepinfer_client_disconnects_total") < before + 2:
        time.sleep(0.05)
    assert metric(server, "deepinfer_client_disconnects_total") == before + 2
    assert server.request("GET", "/health")[0] == 200


def test_tokenize_detokenize(server):
    status, tok = server.post("/tokenize", {"prompt": "Hello world"})
    assert status == 200 and tok["tokens"][0] == 0 and tok["count"] == len(tok["tokens"])
    status, raw = server.post("/tokenize", {"prompt": "Hello world", "add_special_tokens": False})
    assert raw["tokens"] == tok["tokens"][1:]
    status, det = server.post("/detokenize", {"tokens": raw["tokens"]})
    assert status == 200 and det["prompt"] == "Hello world"
    check_error(*server.post("/detokenize", {"tokens": [-4]}), 400)


def test_still_healthy_after_errors(server):
    for _ in range(3):
        server.request("POST", "/v1/completions", b"\xff\xfe")
        raw_exchange(server.port, b"\x00\x01\x02\r\n\r\n")
    assert server.request("GET", "/health")[0] == 200
    status, body = server.post("/v1/completions", greedy(prompt="Still fine", max_tokens=3))
    assert status == 200 and body["usage"]["completion_tokens"] == 3


def test_openai_client(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % server.port, api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [NAME]
    c = client.completions.create(model=NAME, prompt="Hello", max_tokens=5, temperature=0, logprobs=1)
    assert c.choices[0].finish_reason in ("length", "stop") and c.usage.completion_tokens <= 5
    assert len(c.choices[0].logprobs.tokens) == c.usage.completion_tokens
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=2, seed=1)
    assert r.choices[0].message.role == "assistant" and r.usage.total_tokens > 6
    text = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0, seed=1, stream=True,
        stream_options={"include_usage": True}) if ch.choices)
    assert text == r.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=NAME, prompt="x", max_tokens=-3)


def test_api_key_and_graceful_shutdown():
    s = Server("--api-key", "sekrit", "--disable-log-requests", "--num-kv-blocks", "4",
               "--allowed-origins", "http://a.example, http://b.example", "--max-connections", "4",
               "--keep-alive-timeout", "2")
    try:
        # connection limit: a fifth connection is not accepted while four are open (libmicrohttpd stops
        # accepting at the limit; it waits in the listen backlog)
        idle = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(4)]
        t0 = time.time()
        time.sleep(0.3)
        assert raw_exchange(s.port, b"GET /health HTTP/1.1\r\n\r\n", timeout=1) == b""
        # idle keep-alive connections are closed after --keep-alive-timeout
        assert idle[0].recv(100) == b"" and 1.5 < time.time() - t0 < 6
        for sock in idle:
            sock.close()
        time.sleep(0.3)
        # CORS with a list of origins: only those are named back; a preflight needs no key
        status, h, raw = s.request("OPTIONS", "/v1/completions", headers={"Origin": "http://b.example"})
        assert status == 200 and h.get("Access-Control-Allow-Origin") == "http://b.example" and h.get("Vary") == "Origin"
        status, h, raw = s.request("GET", "/health", headers={"Origin": "http://c.example"})
        assert status == 200 and "Access-Control-Allow-Origin" not in h
        # a request the KV pool (4 blocks of 64 tokens) can never hold fails at admission: a 400, or in a
        # stream an error event before [DONE]
        auth = {"Authorization": "Bearer sekrit"}
        status, body = s.post("/v1/completions", greedy(prompt="x", max_tokens=400), headers=auth)
        check_error(status, body, 400)
        assert "KV" in body["error"]["message"]
        status, headers, raw = s.request("POST", "/v1/completions", json.dumps(greedy(prompt="x", max_tokens=400,
                                                                                      stream=True)), headers=auth)
        blocks = [b for b in raw.decode().split("\n\n") if b.strip()]
        assert status == 200 and blocks[-1] == "data: [DONE]"
        err = json.loads(blocks[-2][6:])["error"]
        assert "KV" in err["message"] and err["type"] == "invalid_request_error"
        status, body = s.post("/v1/completions", greedy(prompt="x", max_tokens=2))
        check_error(status, body, 401)
        status, body = s.post("/v1/completions", greedy(prompt="x", max_tokens=2), headers={"Authorization": "Bearer nope"})
        check_error(status, body, 401)
        status, body = s.post("/v1/completions", greedy(prompt="x", max_tokens=2),
                              headers={"Authorization": "Bearer sekrit"})
        assert status == 200
        assert s.request("GET", "/health")[0] == 200  # health needs no key
        # SIGTERM while a stream is in flight: it completes, then the server exits cleanly
        result = {}

        def streamer():
            result["events"] = s.stream("/v1/completions", dict(greedy(prompt="shutdown", max_tokens=200, stream=True)))

        def streamer_with_key():
            status, headers, raw = s.request("POST", "/v1/completions",
                                             json.dumps(greedy(prompt="shutdown", max_tokens=200, stream=True)),
                                             headers={"Authorization": "Bearer sekrit"})
            result["status"], result["raw"] = status, raw

        t = threading.Thread(target=streamer_with_key)
        t.start()
        time.sleep(0.3)
        rc = s.stop(timeout=30)
        t.join(30)
        assert rc == 0, s.text()
        assert result.get("status") == 200 and result["raw"].rstrip().endswith(b"data: [DONE]")
        assert "sekrit" not in s.text()  # the key is never logged (rejections are, with their reason)
    finally:
        s.kill()


def test_continuous_usage_and_unsupported(server):
    events, done = server.stream("/v1/completions", greedy(prompt="u", max_tokens=4, stream=True,
                                                           stream_options={"include_usage": True,
                                                                           "continuous_usage_stats": True}))
    counts = [e["usage"]["completion_tokens"] for e in events if e["choices"]]
    assert done and counts == sorted(counts) and counts[-1] == 4
    check_error(*server.post("/v1/completions", {"prompt": "x", "prompt_logprobs": 21}), 400, "prompt_logprobs")
    check_error(*server.post("/v1/completions", {"prompt": "x", "suffix": "y"}), 400, "suffix")
    check_error(*server.post("/v1/completions", {"prompt": "x", "n": 2, "best_of": 3}), 400, "best_of")
    check_error(*server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                      "tool_choice": "required"}), 400, "tool_choice")  # no tools


TOOL_MARKUP = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
               "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


V31_MARKUP = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}<｜tool▁call▁end｜>"
              "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
V4_MARKUP = ("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
             "<｜DSML｜parameter name=\"city\" string=\"true\">Li\"ma</｜DSML｜parameter>\n"
             "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>")


def reassemble(events):
    """A streamed chat reply put back together: content, reasoning, tool calls (deltas joined per
    index) and the finish reason; checks that no chunk's content holds tool-call markup."""
    content, reasoning, calls, finish = "", "", {}, None
    for e in events:
        if not e["choices"]:
            continue
        ch = e["choices"][0]
        d = ch["delta"]
        piece = d.get("content") or ""
        assert "｜tool" not in piece and "DSML" not in piece, piece
        content += piece
        reasoning += d.get("reasoning_content") or ""
        for tc in d.get("tool_calls") or []:
            if tc["index"] not in calls:
                assert tc.get("id") and tc["type"] == "function" and tc["function"]["name"], tc
                calls[tc["index"]] = {"name": tc["function"]["name"], "arguments": ""}
            calls[tc["index"]]["arguments"] += tc["function"].get("arguments") or ""
        finish = ch.get("finish_reason") or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def whole_calls(message):
    return [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message["tool_calls"] or []]


def test_tool_calls(server):
    # the reply is forced (guided_regex) to DeepSeek-V3 tool-call markup after some content
    rx = re.sub(r"([{}\[\]().*+?|^$\\])", r"\\\1", "Sure." + TOOL_MARKUP)
    req = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS, "max_tokens": 400,
           "temperature": 0, "guided_regex": rx}
    status, body = server.post("/v1/chat/completions", req)
    assert status == 200, body
    c = body["choices"][0]
    assert c["finish_reason"] == "tool_calls", c
    assert c["message"]["content"] == "Sure."
    (call,) = c["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert body["system_fingerprint"].startswith("fp_")
    events, done = server.stream("/v1/chat/completions", dict(req, stream=True))
    content, _, calls, finish = reassemble(events)
    assert done and content == "Sure." and calls == whole_calls(c["message"]) and finish == "tool_calls"
    # the arguments arrive as incremental deltas, not in one piece
    assert sum(1 for e in events for tc in e["choices"][0]["delta"].get("tool_calls") or []) > 3
    # without tools in the request the markup stays content
    no_tools = dict(req)
    del no_tools["tools"]
    status, body = server.post("/v1/chat/completions", no_tools)
    assert body["choices"][0]["message"]["content"] == "Sure." + TOOL_MARKUP
    assert body["choices"][0]["message"]["tool_calls"] is None and body["choices"][0]["finish_reason"] == "stop"
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % server.port, api_key="unused", max_retries=0)
    r = client.chat.completions.create(model=NAME, messages=req["messages"], tools=TOOLS, max_tokens=400, temperature=0,
                                       extra_body={"guided_regex": rx})
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    # every form (V3.1 with two calls, V4's DSML): streamed deltas reassemble to the whole reply
    for text, want in [("Two." + V31_MARKUP, [("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Oslo"})]),
                       ("Let me look." + V4_MARKUP, [("get_weather", {"city": "Li\"ma", "days": 2})])]:
        req2 = dict(req, guided_regex=escape_rx(text))
        status, body = server.post("/v1/chat/completions", req2)
        m = body["choices"][0]["message"]
        assert status == 200 and body["choices"][0]["finish_reason"] == "tool_calls", body
        assert [(c["name"], json.loads(c["arguments"])) for c in whole_calls(m)] == want
        events, done = server.stream("/v1/chat/completions", dict(req2, stream=True))
        content, _, calls, finish = reassemble(events)
        assert done and content == m["content"] and calls == whole_calls(m) and finish == "tool_calls"
        stream = client.chat.completions.create(model=NAME, messages=req["messages"], tools=TOOLS, max_tokens=400,
                                                temperature=0, stream=True, extra_body={"guided_regex": req2["guided_regex"]})
        args = {}
        for chunk in stream:
            for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        assert [args[i] for i in sorted(args)] == [c["arguments"] for c in whole_calls(m)]


CHOICE_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                    "required": ["city"], "additionalProperties": False}}},
                {"type": "function", "function": {"name": "get_time", "parameters": {
                    "type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"],
                    "additionalProperties": False}}}]


def test_tool_choice_required_and_named(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % server.port, api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "Weather?"}]
    for seed in range(3):
        # a named function: the reply is constrained to its parameters, returned as that call's arguments
        named = {"type": "function", "function": {"name": "get_time"}}
        r = client.chat.completions.create(model=NAME, messages=msgs, tools=CHOICE_TOOLS, tool_choice=named,
                                           max_tokens=200, seed=seed)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_time" and r.choices[0].finish_reason == "tool_calls"
        assert set(json.loads(call.function.arguments)) == {"utc"} and r.choices[0].message.content is None
        # "required": a JSON array of calls, each one of the tools with its own parameters
        r = client.chat.completions.create(model=NAME, messages=msgs, tools=CHOICE_TOOLS, tool_choice="required",
                                           max_tokens=300, seed=seed)
        calls = r.choices[0].message.tool_calls
        assert calls and r.choices[0].finish_reason == "tool_calls", r
        for c in calls:
            args = json.loads(c.function.arguments)
            assert (c.function.name, set(args)) in [("get_weather", {"city"}), ("get_time", {"utc"})]
    # streamed = whole (greedy), the named call's arguments as incremental deltas
    for choice in [{"type": "function", "function": {"name": "get_weather"}}, "required"]:
        req = {"messages": msgs, "tools": CHOICE_TOOLS, "tool_choice": choice, "max_tokens": 300, "temperature": 0}
        status, body = server.post("/v1/chat/completions", req)
        assert status == 200, body
        events, done = server.stream("/v1/chat/completions", dict(req, stream=True))
        content, _, calls, finish = reassemble(events)
        assert done and calls == whole_calls(body["choices"][0]["message"]) and content == "" and finish == "tool_calls"
        n_deltas = sum(1 for e in events if e["choices"] for tc in e["choices"][0]["delta"].get("tool_calls") or [])
        assert n_deltas > len(calls) + 1  # the arguments arrive in pieces, for "required" too
    # "none": the tools are not offered and markup in the reply stays content
    r = client.chat.completions.create(model=NAME, messages=msgs, tools=CHOICE_TOOLS, tool_choice="none",
                                       max_tokens=400, temperature=0, extra_body={"guided_regex": escape_rx(TOOL_MARKUP)})
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == TOOL_MARKUP
    assert r.choices[0].finish_reason == "stop"
    check_error(*server.post("/v1/chat/completions", {"messages": msgs, "tools": CHOICE_TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}), 400, "tool_choice")
    check_error(*server.post("/v1/chat/completions", {"messages": msgs, "tools": CHOICE_TOOLS, "tool_choice": "required",
                                                      "response_format": {"type": "json_object"}}), 400, "tool_choice")


def test_tool_round_trip(server):
    """The standard exchange: an assistant message with content null and tool_calls, then a tool
    message, rendered by the shipped template (as transformers renders it: jinja2 with its settings)."""
    jinja2 = pytest.importorskip("jinja2")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % server.port, api_key="unused", max_retries=0)
    r = client.chat.completions.create(model=NAME, messages=msgs, tools=TOOLS, max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None
    status, tok = server.post("/tokenize", {"messages": msgs, "tools": TOOLS})
    status, detok = server.post("/detokenize", {"tokens": tok["tokens"]})
    with open(os.path.join(DUMMY, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    want = env.from_string(cfg["chat_template"]).render(messages=msgs, tools=TOOLS, add_generation_prompt=True,
                                                        bos_token=cfg["bos_token"], eos_token=cfg["eos_token"])
    assert detok["prompt"] == want
    assert "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>sunny, 21 C<｜tool▁output▁end｜><｜tool▁outputs▁end｜>" in want
    assert "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather" in want


def escape_rx(text):
    return re.sub(r"([{}\[\]().*+?|^$\\])", r"\\\1", text)


def test_reasoning_parser():
    s = Server("--reasoning-parser", "deepseek_r1", "--disable-log-requests")
    try:
        cases = [("Two and two.</think>It is 4.", "Two and two.", "It is 4.", None),
                 ("Still thinking", "Still thinking", None, None),
                 ("<think>hmm</think>Sure." + TOOL_MARKUP, "hmm", "Sure.", "get_weather")]
        for forced, reasoning, content, tool in cases:
            req = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 400, "temperature": 0,
                   "guided_regex": escape_rx(forced)}
            if tool:
                req["tools"] = TOOLS
            status, body = s.post("/v1/chat/completions", req)
            assert status == 200, body
            m = body["choices"][0]["message"]
            assert m["reasoning_content"] == reasoning and m["content"] == content, m
            if tool:
                assert m["tool_calls"][0]["function"]["name"] == tool
                assert body["choices"][0]["finish_reason"] == "tool_calls"
            events, done = s.stream("/v1/chat/completions", dict(req, stream=True))
            got_content, got_reasoning, calls, _ = reassemble(events)
            assert done and got_reasoning == reasoning and got_content == (content or "")
            assert calls == whole_calls(m) and [c["name"] for c in calls] == ([tool] if tool else [])
        # completions are not split
        status, body = s.post("/v1/completions", {"prompt": "x", "max_tokens": 50, "temperature": 0,
                                                  "guided_regex": escape_rx("a</think>b")})
        assert body["choices"][0]["text"] == "a</think>b"
        assert s.stop() == 0
    finally:
        s.kill()


def test_metrics_histograms(server):
    server.post("/v1/completions", greedy(prompt="histogram", max_tokens=4))
    status, h, raw = server.request("GET", "/metrics")
    text = raw.decode()
    assert status == 200 and h["Content-Type"].startswith("text/plain")
    for name in ("deepinfer_time_to_first_token_seconds", "deepinfer_e2e_request_latency_seconds",
                 "deepinfer_time_per_output_token_seconds"):
        count = float(re.search(r"^%s_count\{[^}]*\} (\S+)$" % name, text, re.M).group(1))
        inf = float(re.search(r'^%s_bucket\{[^}]*le="\+Inf"\} (\S+)$' % name, text, re.M).group(1))
        buckets = [float(x) for x in re.findall(r"^%s_bucket\{[^}]*\} (\S+)$" % name, text, re.M)]
        assert count >= 1 and inf == count and buckets == sorted(buckets)
    assert metric(server, "deepinfer_generation_tokens_total") >= 4
    assert re.search(r'deepinfer_request_success_total\{model_name="%s",finished_reason="length"\} [1-9]' % NAME, text)


def test_cors_and_request_id(server):
    status, h, raw = server.request("GET", "/v1/models", headers={"Origin": "http://ui.example"})
    assert status == 200 and h.get("Access-Control-Allow-Origin") == "*"
    status, h, raw = server.request("GET", "/v1/models")
    assert "Access-Control-Allow-Origin" not in h
    status, h, raw = server.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "http://ui.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    assert status == 200 and h.get("Access-Control-Allow-Origin") == "*"
    assert "POST" in h.get("Access-Control-Allow-Methods", "") and h.get("Access-Control-Allow-Headers") == "content-type, authorization"
    status, h, raw = server.request("POST", "/v1/completions", json.dumps(greedy(prompt="id", max_tokens=2)),
                                    headers={"X-Request-Id": "req-42"})
    assert status == 200 and h.get("X-Request-Id") == "req-42"
    status, h, raw = server.request("POST", "/v1/completions", json.dumps(greedy(prompt="id", max_tokens=2, stream=True)),
                                    headers={"X-Request-Id": "req-43", "Origin": "http://ui.example"})
    assert status == 200 and h.get("X-Request-Id") == "req-43" and h.get("Access-Control-Allow-Origin") == "*"
    status, h, raw = server.request("POST", "/v1/completions", b"{", headers={"X-Request-Id": "req-44"})
    assert status == 400 and h.get("X-Request-Id") == "req-44"


def dummy_logprobs(ids):
    """float64 log-softmax of `deepinfer score` logits of ids on the server's dummy model: row t-1 -> ids[t]
    (logprob, the top 3 (id, logprob)) per position t >= 1."""
    from cli_score import score_logits
    logits = score_logits(CLI, DUMMY, ids, ("--load-format", "dummy"))
    vocab = len(logits[0])
    # the engine's distribution covers the tokenizer's ids (the rest of the rows is padding)
    from tokenizers import Tokenizer
    tv = Tokenizer.from_file(os.path.join(DUMMY, "tokenizer.json"))
    limit = min(vocab, 1 + max(tv.get_vocab(with_added_tokens=True).values()))
    res = [None]
    for t in range(1, len(ids)):
        row = logits[t - 1][:limit]
        m = max(row)
        lse = m + math.log(sum(math.exp(x - m) for x in row))
        order = sorted(range(limit), key=lambda i: (-row[i], i))[:3]
        res.append((row[ids[t]] - lse, [(i, row[i] - lse) for i in order], 1 + sum(x > row[ids[t]] for x in row)))
    return res


def test_prompt_logprobs(server):
    ids = [0, 1250, 3000, 77, 9, 1250, 3000]
    ref = dummy_logprobs(ids)
    # lm-evaluation-harness's local-completions scoring request: echo + logprobs + max_tokens 0
    status, body = server.post("/v1/completions", {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0,
                                                   "temperature": 0})
    assert status == 200, body
    c = body["choices"][0]
    assert c["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 0
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and lp["text_offset"][0] == 0
    assert lp["text_offset"] == sorted(lp["text_offset"])
    assert "".join(lp["tokens"]) == c["text"] or "\ufffd" in "".join(lp["tokens"])
    for t in range(1, len(ids)):
        want, top, _ = ref[t]
        assert abs(lp["token_logprobs"][t] - want) < 1e-4 * max(1, abs(want)), (t, lp["token_logprobs"][t], want)
        d = lp["top_logprobs"][t]
        assert lp["tokens"][t] in d and 1 <= len(d) <= 2
        assert abs(max(d.values()) - top[0][1]) < 1e-4 * max(1, abs(top[0][1]))
    # echo + logprobs with generated tokens: the prompt's entries come first, offsets run on
    status, gen = server.post("/v1/completions", {"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 3,
                                                  "temperature": 0, "ignore_eos": True})
    assert status == 200, gen
    glp = gen["choices"][0]["logprobs"]
    assert len(glp["tokens"]) == len(glp["token_logprobs"]) == len(glp["text_offset"]) == len(ids) + 3
    assert glp["text_offset"] == sorted(glp["text_offset"]) and glp["token_logprobs"][0] is None
    for t in range(1, len(ids)):
        assert abs(glp["token_logprobs"][t] - lp["token_logprobs"][t]) < 1e-6
    # several token prompts in one request, max_tokens 1 (as lm-evaluation-harness batches them): each
    # choice echoes its own prompt's logprobs, then the generated token's
    status, batch = server.post("/v1/completions", {"prompt": [ids, ids[:4], ids[2:]], "echo": True, "logprobs": 1,
                                                    "max_tokens": 1, "temperature": 0, "seed": 1234})
    assert status == 200, batch
    for c, p in zip(sorted(batch["choices"], key=lambda c: c["index"]), [ids, ids[:4], ids[2:]]):
        tl = c["logprobs"]["token_logprobs"]
        assert len(tl) == len(p) + 1 and tl[0] is None and all(x <= 0 for x in tl[1:])
    assert batch["choices"][0]["logprobs"]["token_logprobs"][:len(ids)] == lp["token_logprobs"]
    assert batch["choices"][1]["logprobs"]["token_logprobs"][:4] == lp["token_logprobs"][:4]
    # n samples: every choice echoes the prompt's logprobs (computed once, by sample 0)
    for mt in (0, 2):
        status, nb = server.post("/v1/completions", {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": mt,
                                                     "n": 2, "temperature": 0, "ignore_eos": True})
        assert status == 200 and len(nb["choices"]) == 2, nb
        for c in nb["choices"]:
            assert c["logprobs"]["token_logprobs"][:len(ids)] == lp["token_logprobs"]
            assert len(c["logprobs"]["tokens"]) == len(ids) + mt and c["finish_reason"] == "length"
    # vLLM's prompt_logprobs field
    status, body = server.post("/v1/completions", {"prompt": ids, "prompt_logprobs": 2, "max_tokens": 1,
                                                   "temperature": 0})
    assert status == 200, body
    plp = body["choices"][0]["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for t in range(1, len(ids)):
        want, top, rank = ref[t]
        d = plp[t]
        assert abs(d[str(ids[t])]["logprob"] - want) < 1e-4 * max(1, abs(want)) and d[str(ids[t])]["rank"] == rank
        assert all(d[str(i)]["rank"] == j + 1 for j, (i, _) in enumerate(top[:2]) if i != ids[t])
        assert len(d) <= 3 and all("decoded_token" in e for e in d.values())
    status, chat = server.post("/v1/chat/completions", greedy(messages=[{"role": "user", "content": "x"}], max_tokens=1,
                                                              prompt_logprobs=0))
    assert status == 200, chat
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    # refused: scoring without asking for the prompt back, and prompt logprobs in a stream
    status, body = server.post("/v1/completions", {"prompt": ids, "max_tokens": 0})
    check_error(status, body, 400, "max_tokens")
    status, body = server.post("/v1/completions", {"prompt": ids, "prompt_logprobs": 1, "stream": True})
    check_error(status, body, 400, "prompt_logprobs")
    # streamed echo + logprobs: the first chunk of each choice is the prompt with its logprobs
    for mt in (0, 3):
        req = {"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": mt, "n": 2, "temperature": 0,
               "ignore_eos": True}
        status, whole = server.post("/v1/completions", req)
        events, done = server.stream("/v1/completions", dict(req, stream=True))
        assert done
        for i in range(2):
            chunks = [c for e in events for c in e["choices"] if c["index"] == i]
            first = chunks[0]["logprobs"]
            assert len(first["tokens"]) == len(ids) and first["token_logprobs"] == lp["token_logprobs"]
            merged = {k: [x for c in chunks if c["logprobs"] for x in c["logprobs"][k]] for k in first}
            assert merged == whole["choices"][i]["logprobs"]
            assert "".join(c["text"] for c in chunks) == whole["choices"][i]["text"]
            assert chunks[-1]["finish_reason"] == "length"


def test_shared_prompt_blocks_computed_once(server):
    # four prompts of one request share 200 tokens (3 full KV blocks) and reach the engine together:
    # the first computes the shared blocks, the others wait for them (the scheduler's prefix_in_flight,
    # counted in deepinfer_prefix_waits_total) and take them from the prefix cache
    before = metric(server, "deepinfer_prefix_waits_total")
    shared = [300 + (i * 7) % 200 for i in range(200)]
    prompts = [shared + [600 + k, 601 + k, 602 + k] for k in range(4)]
    status, body = server.post("/v1/completions", {"prompt": prompts, "max_tokens": 3, "temperature": 0})
    assert status == 200, body
    assert len(body["choices"]) == 4
    assert metric(server, "deepinfer_prefix_waits_total") > before
    # the same prompts one at a time give the same text
    for k, p in enumerate(prompts):
        status, one = server.post("/v1/completions", {"prompt": p, "max_tokens": 3, "temperature": 0})
        assert status == 200, one
        assert one["choices"][0]["text"] == body["choices"][k]["text"]


def test_sampling_ranges_match_the_cli(server):
    """The server and `deepinfer generate` check one table of ranges (src/sampler/sampling_ranges.c):
    the same values are refused with the same words (test_engine_cli.py's test_sampling_flag_ranges)."""
    cases = [("temperature", -1, "must be in [0, 1e+06], got -1"), ("top_p", 1.5, "must be in [1e-09, 1], got 1.5"),
             ("min_p", 2, "must be in [0, 1], got 2"), ("presence_penalty", 3, "must be in [-2, 2], got 3"),
             ("top_k", -2, "must be in [-1, 2147483647], got -2"), ("n", 0, "must be in [1, 1024], got 0")]
    for key, value, words in cases:
        status, body = server.post("/v1/completions", {"prompt": "x", key: value})
        check_error(status, body, 400, key)
        assert body["error"]["message"] == f"'{key}' {words}", body
    status, body = server.post("/v1/completions", {"prompt": "x", "min_tokens": 9, "max_tokens": 4})
    check_error(status, body, 400, "min_tokens")
    assert "'min_tokens' must be at most 'max_tokens' (4), got 9" in body["error"]["message"]


def test_no_tokenizer_streams_token_ids(tmp_path):
    """A model folder without tokenizer.json: token-id prompts, each streamed chunk carrying its new
    token ids (vLLM's token_ids), equal to the whole response's."""
    import shutil
    shutil.copy(os.path.join(DUMMY, "config.json"), tmp_path / "config.json")
    s = Server("--disable-log-requests", model=str(tmp_path))
    try:
        req = {"prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0}
        status, body = s.post("/v1/completions", req)
        assert status == 200 and len(body["choices"][0]["token_ids"]) == 6, body
        events, done = s.stream("/v1/completions", dict(req, stream=True))
        streamed = [t for e in events for t in e["choices"][0].get("token_ids", [])]
        assert done and len(events) >= 6 and streamed == body["choices"][0]["token_ids"]
        check_error(*s.post("/v1/completions", {"prompt": "text"}), 400, "prompt")
        assert s.stop() == 0
    finally:
        s.kill()


def test_lmeval_local_completions_requests(server):
    """lm-evaluation-harness's local-completions requests (echo, logprobs 1, max_tokens 1; it sums
    token_logprobs[ctxlen:-1]) through the openai client: token ids, and the same sequence as text
    (its BOS decoded into the text: no second BOS), give the float64 reference's log-likelihood;
    add_special_tokens false keeps a text's tokens as they are. /tokenizer_info as vLLM's."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % server.port, api_key="unused", max_retries=0)
    ctx, cont = "The quick brown fox", " jumps over"
    ctx_ids = server.post("/tokenize", {"prompt": ctx})[1]["tokens"]  # with BOS
    whole = server.post("/tokenize", {"prompt": ctx + cont})[1]["tokens"]
    assert whole[:len(ctx_ids)] == ctx_ids and whole[0] == 0
    ctxlen = len(ctx_ids)
    ref = dummy_logprobs(whole)
    want = sum(ref[t][0] for t in range(ctxlen, len(whole)))
    text = server.post("/detokenize", {"tokens": whole})[1]["prompt"]
    assert text.startswith("<｜begin▁of▁sentence｜>")
    for prompt, extra in [(whole, {}), (text, {}), (text[len("<｜begin▁of▁sentence｜>"):], {}),
                          (whole[1:], {}), (text[len("<｜begin▁of▁sentence｜>"):], {"add_special_tokens": False})]:
        r = client.completions.create(model=NAME, prompt=prompt, max_tokens=1, echo=True, logprobs=1, temperature=0,
                                      extra_body=extra)
        lp = r.choices[0].logprobs
        with_bos = not (prompt == whole[1:] or extra)
        n = len(whole) if with_bos else len(whole) - 1
        assert len(lp.token_logprobs) == n + 1 and lp.token_logprobs[0] is None, (prompt, extra)
        got = sum(lp.token_logprobs[(ctxlen if with_bos else ctxlen - 1):-1])
        if with_bos:
            assert abs(got - want) < 1e-4, (prompt, got, want)
        assert r.choices[0].text.startswith(prompt if isinstance(prompt, str) else "")
    status, info = server.request("GET", "/tokenizer_info")[0], json.loads(server.request("GET", "/tokenizer_info")[2])
    assert status == 200 and info["eos_token"] == "<｜end▁of▁sentence｜>" and info["bos_token"] == "<｜begin▁of▁sentence｜>"
    assert "added_tokens_decoder" not in info and info["chat_template"].startswith("{{ bos_token }}")


def strip_ids(items):
    return [{k: v for k, v in it.items() if k not in ("id", "call_id")} for it in items]


def test_responses_api():
    """/v1/responses through the openai client, whole and streamed: text input with instructions,
    reasoning items, function tools (the tool round trip as input items), text.format, a custom tool
    with a regex grammar; the stateless 400s. Streamed events reassemble to the whole response."""
    openai = pytest.importorskip("openai")
    s = Server("--reasoning-parser", "deepseek_r1", "--disable-log-requests")
    try:
        client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % s.port, api_key="unused", max_retries=0)

        def both(**kw):
            whole = client.responses.create(model=NAME, temperature=0, **kw).model_dump()
            events = [e.model_dump() for e in client.responses.create(model=NAME, temperature=0, stream=True, **kw)]
            assert events[0]["type"] == "response.created" and events[-1]["type"] in ("response.completed",
                                                                                     "response.incomplete")
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            final = events[-1]["response"]
            assert strip_ids(final["output"]) == strip_ids(whole["output"]) and final["status"] == whole["status"]
            # the deltas reassemble to each item
            for i, item in enumerate(final["output"]):
                deltas = "".join(e["delta"] for e in events if e.get("output_index") == i and e["type"].endswith(".delta"))
                full = {"reasoning": lambda it: it["content"][0]["text"], "message": lambda it: it["content"][0]["text"],
                        "function_call": lambda it: it["arguments"], "custom_tool_call": lambda it: it["input"]}[item["type"]]
                assert deltas == full(item), (item, deltas)
            return whole

        # text input and instructions: the chat reply to [system, user]
        r = both(input="Hello there", instructions="Be brief.", max_output_tokens=6)
        status, chat = s.post("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                                                    {"role": "user", "content": "Hello there"}],
                                                       "max_tokens": 6, "temperature": 0})
        assert r["status"] == "incomplete" and r["incomplete_details"]["reason"] == "max_output_tokens"
        assert r["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"] and r["usage"]["output_tokens"] == 6
        texts = [it["content"][0]["text"] for it in r["output"] if it["type"] == "message"]
        reasoning = [it["content"][0]["text"] for it in r["output"] if it["type"] == "reasoning"]
        assert (reasoning or [None])[0] == chat["choices"][0]["message"]["reasoning_content"] and not texts
        # <think> output: a reasoning item, then the message
        r = both(input="2+2?", max_output_tokens=300, extra_body={"guided_regex": escape_rx("Two and two.</think>It is 4.")})
        assert [it["type"] for it in r["output"]] == ["reasoning", "message"] and r["status"] == "completed"
        assert r["output"][0]["content"][0]["text"] == "Two and two." and r["output"][1]["content"][0]["text"] == "It is 4."
        assert client.responses.create(model=NAME, input="2+2?", max_output_tokens=300, temperature=0, extra_body={
            "guided_regex": escape_rx("Two and two.</think>It is 4.")}).output_text == "It is 4."
        # function tools: the reply's tool-call markup becomes function_call items (the server parses V3 markup)
        tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
        r = both(input="Weather in Paris?", tools=tools, max_output_tokens=400,
                 extra_body={"guided_regex": escape_rx("</think>" + TOOL_MARKUP)})
        (call,) = [it for it in r["output"] if it["type"] == "function_call"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
        # the round trip as input items: function_call + function_call_output render as chat's tool messages
        items = [{"role": "user", "content": "Weather in Paris?"},
                 {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
                 {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
        r = client.responses.create(model=NAME, input=items, tools=tools, max_output_tokens=3, temperature=0)
        status, tok = s.post("/tokenize", {"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
            "tools": [{"type": "function", "function": {k: v for k, v in tools[0].items() if k != "type"}}]})
        assert r.usage.input_tokens == tok["count"]
        # structured output
        fmt = {"type": "json_schema", "name": "answer", "schema": {"type": "object", "properties": {
            "n": {"type": "integer", "enum": [3, 4]}}, "required": ["n"], "additionalProperties": False}}
        r = both(input="2+2?", text={"format": fmt}, max_output_tokens=100,)
        assert json.loads("".join(it["content"][0]["text"] for it in r["output"] if it["type"] == "message"))["n"] in (3, 4)
        # a custom tool with a regex grammar, chosen by name: the reply is its input
        custom = [{"type": "custom", "name": "set_code", "description": "a code",
                   "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]{3}-[0-9]{2}"}}]
        r = both(input="A code?", tools=custom, tool_choice={"type": "custom", "name": "set_code"}, max_output_tokens=50)
        (call,) = r["output"]
        assert call["type"] == "custom_tool_call" and call["name"] == "set_code"
        assert re.fullmatch("[A-Z]{3}-[0-9]{2}", call["input"]), call
        # a custom tool with a Lark grammar (llguidance's syntax), chosen by name
        lark = [dict(custom[0], format={"type": "grammar", "syntax": "lark",
                                        "definition": 'start: CODE\nCODE: /[A-Z]{3}/ "-" /[0-9]{2}/'})]
        r = both(input="A code?", tools=lark, tool_choice={"type": "custom", "name": "set_code"}, max_output_tokens=50)
        (call,) = r["output"]
        assert call["type"] == "custom_tool_call" and re.fullmatch("[A-Z]{3}-[0-9]{2}", call["input"]), call
        bad = [dict(custom[0], format={"type": "grammar", "syntax": "yacc", "definition": "x"})]
        # the stateless API's refusals
        for body, param in [({"input": "x", "store": True}, "store"), ({"input": "x", "previous_response_id": "resp_1"},
                                                                       "previous_response_id"),
                            ({"input": "x", "tools": bad, "tool_choice": {"type": "custom", "name": "set_code"}}, "tools"),
                            ({"input": [{"type": "image", "url": "x"}]}, "input[0]"), ({}, "input")]:
            status, err = s.post("/v1/responses", body)
            check_error(status, err, 400, param)
        assert s.stop() == 0
    finally:
        s.kill()
