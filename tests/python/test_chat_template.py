"""Chat templates: the `deepinfer chat-template` CLI on the committed goldens, and a randomized
oracle comparison against transformers' apply_chat_template (5.17, when installed) through the
shared library: random conversations (unicode, whitespace, tool calls, reasoning, Jinja-looking
text) on every template folder in tests/data/chat. Both must render the same bytes or both fail."""
import ctypes
import json
import os
import random
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "chat")
CLI = os.environ.get("DEEPINFER_CLI")
LIB = os.environ.get("DEEPINFER_LIB")
TEMPLATES = ["deepseek-v3", "deepseek-v2", "deepseek-r1", "deepseek-v3.1", "llama3", "llama3.2", "qwen3", "named", "features",
             "default"]


def template_dir(name):
    """tests/data/chat/NAME, or for "default" the shipped model's folder (its template is the served one)."""
    return os.path.join(ROOT, "models", "default") if name == "default" else os.path.join(DATA, name)


def goldens(name):
    with open(os.path.join(DATA, "goldens", name + ".jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_cli(args, stdin=None):
    return subprocess.run([CLI, "chat-template"] + args, input=stdin, capture_output=True, timeout=60)


@pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI not set")
def test_cli_help_and_errors(tmp_path):
    r = run_cli(["--help"])
    assert r.returncode == 0 and b"--no-generation-prompt" in r.stdout
    r = run_cli(["--tokenizer", os.path.join(DATA, "qwen3")])
    assert r.returncode == 2 and b"--messages" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [')
    r = run_cli(["--tokenizer", os.path.join(DATA, "qwen3"), "--messages", str(bad)])
    assert r.returncode == 1 and b"the conversation" in r.stderr and r.stdout == b""
    r = run_cli(["--tokenizer", str(tmp_path), "--messages", str(bad)])
    assert r.returncode == 1 and b"no chat template" in r.stderr
    tpl = tmp_path / "tpl"
    tpl.mkdir()
    (tpl / "chat_template.jinja").write_text("{% include 'x' %}")
    ok = tmp_path / "ok.json"
    ok.write_text('[{"role": "user", "content": "hi"}]')
    r = run_cli(["--tokenizer", str(tpl), "--messages", str(ok)])
    assert r.returncode == 1 and b"unsupported construct: the 'include' tag" in r.stderr and b"line 1 column 4" in r.stderr


@pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI not set")
@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3", "llama3.2"])
def test_cli_goldens(tmp_path, name):
    path = tmp_path / "conv.json"
    for i, rec in enumerate(goldens(name)):
        conv = dict(rec["extra"])
        conv["messages"] = rec["messages"]
        if rec["tools"] is not None:
            conv["tools"] = rec["tools"]
        # the generation prompt through the flag (false) or the default (true)
        path.write_text(json.dumps(conv, ensure_ascii=False), encoding="utf-8")
        args = ["--tokenizer", os.path.join(DATA, name), "--messages", str(path)]
        if not rec["add_generation_prompt"]:
            args.append("--no-generation-prompt")
        r = run_cli(args)
        if "error" in rec:
            assert r.returncode == 1 and r.stderr, f"{name} case {i}: expected failure"
            continue
        assert r.returncode == 0, f"{name} case {i}: {r.stderr.decode()}"
        assert r.stdout == rec["text"].encode("utf-8"), f"{name} case {i}"
    # a bare array on stdin
    r = run_cli(["--tokenizer", os.path.join(DATA, "deepseek-v3"), "--messages", "-"],
                stdin=b'[{"role": "user", "content": "Hi"}]')
    assert r.returncode == 0 and r.stdout == "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>".encode()


# ---- randomized oracle against transformers ------------------------------------------------------
PIECES = ["Hello", "world", " ", "  ", "\n", "\n\n", "\t", "é", "你好", "🌍", "Ω", "—", "\"", "'", "\\", "{{ x }}",
          "{% if %}", "{#", "#}", "</think>", "<think>", "<tool_response>", "</tool_response>", "42", "-1.5", "?", ".",
          "\r\n", "ß", "ÀÉ", "Ünï", "<|im_end|>", "null", "true", "a,b", ":", "[", "]"]


def rand_text(rng):
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 8)))


def rand_args(rng, as_string):
    args = {}
    for _ in range(rng.randint(0, 3)):
        args[rng.choice(["city", "q", "n", "flag", "nested"])] = rng.choice(
            [rand_text(rng), rng.randint(-5, 100), True, None, [1, "x"], {"k": rand_text(rng)}, 1.0, -2.5e-3, 1e21, 0.1])
    return json.dumps(args, ensure_ascii=False) if as_string else args


def rand_conversation(rng, name):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rand_text(rng)})
    deepseek_like = name.startswith("deepseek") or name == "default"
    string_args = deepseek_like or rng.random() < 0.3
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.45:
            msgs.append({"role": "user", "content": rand_text(rng)})
        elif kind < 0.75:
            m = {"role": "assistant", "content": rand_text(rng)}
            if rng.random() < 0.3:
                m["content"] = "<think>\n" + rand_text(rng) + "\n</think>\n\n" + rand_text(rng)
            if name == "qwen3" and rng.random() < 0.2:
                m["reasoning_content"] = rand_text(rng)
            msgs.append(m)
        elif kind < 0.9 and name not in ("deepseek-v2", "llama3"):
            calls = [{"type": "function", "function": {"name": rng.choice(["get_weather", "search"]),
                                                       "arguments": rand_args(rng, string_args)}}
                     for _ in range(1 if name == "llama3.2" else rng.randint(1, 2))]
            content = None if (deepseek_like and rng.random() < 0.7) else rand_text(rng)
            msgs.append({"role": "assistant", "content": content, "tool_calls": calls})
            for _ in range(rng.randint(1, len(calls))):
                msgs.append({"role": "tool", "content": rand_text(rng)})
        else:
            msgs.append({"role": "user", "content": rand_text(rng)})
    return msgs


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather — today.",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}, "required": ["city"]}}}]


class Lib:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.di_chat_template_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        self.lib.di_chat_template_render_json.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                                          ctypes.POINTER(ctypes.c_void_p)]
        self.lib.di_chat_template_free.argtypes = [ctypes.c_void_p]
        self.lib.di_string_free.argtypes = [ctypes.c_void_p]
        self.lib.di_last_error.restype = ctypes.c_char_p

    def load(self, d):
        h = ctypes.c_void_p()
        st = self.lib.di_chat_template_load(d.encode(), ctypes.byref(h))
        assert st == 0, self.lib.di_last_error()
        return h

    def render(self, h, conv):
        out = ctypes.c_void_p()
        st = self.lib.di_chat_template_render_json(h, json.dumps(conv, ensure_ascii=False).encode(), -1,
                                                   ctypes.byref(out))
        if st != 0:
            return None, self.lib.di_last_error().decode()
        text = ctypes.string_at(out).decode("utf-8")
        self.lib.di_string_free(out)
        return text, None


@pytest.mark.skipif(not LIB, reason="DEEPINFER_LIB not set")
@pytest.mark.parametrize("name", TEMPLATES)
def test_random_oracle(name):
    transformers = pytest.importorskip("transformers")
    if transformers.__version__ != "5.17.0":
        pytest.skip(f"the goldens' reference is transformers 5.17.0, not {transformers.__version__}")
    import sys
    sys.path.insert(0, DATA)
    import make_goldens

    tokens, template = make_goldens.load_dir(template_dir(name))
    tok = make_goldens.make_tokenizer(tokens, template)
    lib = Lib(LIB)
    h = lib.load(template_dir(name))
    rng = random.Random(1234 + TEMPLATES.index(name))
    n_ok = n_err = 0
    try:
        for i in range(int(os.environ.get("DI_CHAT_ORACLE_N", "150"))):
            msgs = rand_conversation(rng, name)
            conv = {"messages": msgs, "add_generation_prompt": rng.random() < 0.6}
            if name in ("qwen3", "llama3.2", "features", "named", "default") and rng.random() < 0.5:
                conv["tools"] = TOOLS
            if name == "qwen3" and rng.random() < 0.3:
                conv["enable_thinking"] = rng.random() < 0.5
            if name == "llama3.2":
                conv["date_string"] = "26 Jul 2024"
            if name == "deepseek-v3.1" and rng.random() < 0.5:
                conv["thinking"] = rng.random() < 0.5
            extra = {k: v for k, v in conv.items() if k not in ("messages", "tools", "add_generation_prompt")}
            try:
                want = tok.apply_chat_template(msgs, tools=conv.get("tools"), tokenize=False,
                                               add_generation_prompt=conv["add_generation_prompt"], **extra)
            except Exception as e:  # noqa: BLE001 - any refusal by the reference
                want, why = None, str(e)
            got, err = lib.render(h, conv)
            if want is None:
                assert got is None, f"{name} #{i}: transformers failed ({why}) but we rendered\n{json.dumps(conv)}"
                n_err += 1
            else:
                assert err is None, f"{name} #{i}: {err}\n{json.dumps(conv, ensure_ascii=False)}"
                assert got == want, f"{name} #{i}:\n{json.dumps(conv, ensure_ascii=False)}\nwant {want!r}\ngot  {got!r}"
                n_ok += 1
    finally:
        lib.lib.di_chat_template_free(h)
    assert n_ok >= 50
