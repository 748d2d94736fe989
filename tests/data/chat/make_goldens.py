#!/usr/bin/env python3
"""Generates the chat-template goldens in tests/data/chat/goldens/<template>.jsonl with the real
reference: transformers' apply_chat_template (version 5.17.0, the one the project's fixtures were
made with; pip install transformers==5.17.0 tokenizers jinja2, torch not needed).

Each template folder here (tokenizer_config.json, optional chat_template.jinja) is loaded the way
DeepInfer loads it; a PreTrainedTokenizerFast with an empty BPE model carries its special tokens
and template, and apply_chat_template(..., tokenize=False) renders every case. Each output line:
  {"messages", "tools", "add_generation_prompt", "extra", "conversation", "text"}  or  {..., "error": "..."}
where "conversation" is the same input as one JSON text (what `deepinfer chat-template` and
di_chat_template_render_json read)
and "error" means transformers raised (DeepInfer must fail too).

Usage: python3 tests/data/chat/make_goldens.py   (from anywhere; writes next to this file)
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN_NAMES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


def load_dir(d):
    cfg = {}
    p = os.path.join(d, "tokenizer_config.json")
    if os.path.exists(p):
        cfg = json.load(open(p, encoding="utf-8"))
    tokens = {}
    for k in TOKEN_NAMES:
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            tokens[k] = v
    jp = os.path.join(d, "chat_template.jinja")
    if os.path.exists(jp):
        template = open(jp, encoding="utf-8").read()
    else:
        template = cfg["chat_template"]
        if isinstance(template, list):
            template = {e["name"]: e["template"] for e in template}
    return tokens, template


def make_tokenizer(tokens, template):
    from tokenizers import Tokenizer
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(BPE()), chat_template=template, **tokens)


def call(fn_name, args):
    return {"type": "function", "function": {"name": fn_name, "arguments": args}}


UNICODE = "Ünïcödé — “quotes” 'single' \"double\" \\ backslash\n\tnew line, 你好，世界 🌍 Ответ ∑≠∞ 😀 café"
GENERIC = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
    [{"role": "system", "content": "Rule one."}, {"role": "system", "content": "Rule two."},
     {"role": "user", "content": "Go."}],
    [{"role": "system", "content": "你好，世界 🌍"}, {"role": "user", "content": UNICODE},
     {"role": "assistant", "content": "Ответ: ∑ ≠ ∞ 😀"}, {"role": "user", "content": "  padded with spaces  \n"}],
    [{"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "<think>\nLet me add.\n</think>\n\nThe answer is 4."},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "An old silent pond"}],
    [{"role": "user", "content": "{{ not_a_variable }} {% if x %} {# not a comment #} {%- raw -%}"}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "line one\nline two\n\n  indented\r\nwindows line"},
     {"role": "assistant", "content": "\n\nleading newlines"}, {"role": "user", "content": "ok?"}],
]

# DeepSeek-style tool calls: arguments are JSON strings; content null on pure tool-call turns.
DS_TOOLS = [
    [{"role": "user", "content": "What's the weather in Paris?"},
     {"role": "assistant", "content": None, "tool_calls": [call("get_weather", '{"city": "Paris"}')]},
     {"role": "tool", "content": '{"temperature": 21, "unit": "C"}'},
     {"role": "assistant", "content": "It is 21°C in Paris."}],
    [{"role": "system", "content": "You can call tools."}, {"role": "user", "content": "Weather in Paris and Tokyo?"},
     {"role": "assistant", "content": None, "tool_calls": [call("get_weather", '{"city": "Paris"}'),
                                                          call("get_weather", '{"city": "東京"}')]},
     {"role": "tool", "content": "21"}, {"role": "tool", "content": "18"}],
    [{"role": "user", "content": "Look it up."},
     {"role": "assistant", "content": "Let me check.", "tool_calls": [call("search", '{"q": "deepseek \\"v3\\""}')]},
     {"role": "tool", "content": "found it"}, {"role": "assistant", "content": "Here it is."},
     {"role": "user", "content": "Thanks"}],
]

# Qwen/Llama-style tool calls: arguments are objects (or strings, which Qwen passes through).
TOOL_SCHEMAS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web — fast.",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"},
                                                                                      "top_k": {"type": "integer"}}}}},
]
OBJ_TOOLS = [
    [{"role": "user", "content": "What's the weather in Paris?"},
     {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"})]},
     {"role": "tool", "content": '{"temperature": 21.5}'},
     {"role": "assistant", "content": "It is 21.5°C."}],
    [{"role": "system", "content": "Use tools when needed."}, {"role": "user", "content": "Paris and 東京?"},
     {"role": "assistant", "content": "Checking both.", "tool_calls": [
         call("get_weather", {"city": "Paris"}), call("get_weather", '{"city": "東京"}')]},
     {"role": "tool", "content": "21"}, {"role": "tool", "content": "18"}],
    [{"role": "user", "content": "Search for \"jinja\" and count to 3"},
     {"role": "assistant", "content": "", "tool_calls": [
         call("search", {"q": "jinja \"templates\" \\ path", "top_k": 3, "nested": {"a": [1, 2.5, None, True]}})]},
     {"role": "tool", "content": "no results"}],
    [{"role": "user", "content": "Numbers"},
     {"role": "assistant", "content": "", "tool_calls": [
         call("get_weather", {"temperature": 21.0, "big": 1e20, "small": 1.5e-7, "neg": -0.0, "int": 7, "e": 2.5e16})]},
     {"role": "tool", "content": "ok"}],
]

QWEN_REASONING = [
    [{"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4", "reasoning_content": "Simple addition."},
     {"role": "user", "content": "3+3?"},
     {"role": "assistant", "content": "<think>\nagain\n</think>\n\n6"}],
    [{"role": "user", "content": "<tool_response>x</tool_response>"}, {"role": "user", "content": "real question"},
     {"role": "assistant", "content": "answer"}],
]

FEATURE_EXTRA = [
    [{"role": "user", "content": "Hello World?"},
     {"role": "assistant", "content": {"b": 1, "a": [1, 2.5, None, True], "s": "é\"x"}},
     {"role": "tool", "content": 42},
     {"role": "assistant", "content": None, "tool_calls": [
         call("f", {"x": "ünï", "y": [1, 2]}), {"type": "other"}, call("g", "raw string args")]},
     {"role": "user", "content": ["list", "content"]}],
]


def cases(name):
    out = []
    def add(msgs, tools=None, extra=None, gens=(True, False)):
        for g in gens:
            out.append({"messages": msgs, "tools": tools, "add_generation_prompt": g, "extra": extra or {}})
    for m in GENERIC:
        add(m)
    if name in ("deepseek-v3", "deepseek-r1", "deepseek-v3.1", "features"):
        for m in DS_TOOLS:
            add(m)
    if name == "deepseek-v3.1":
        for think in (True, False):
            add(GENERIC[5], extra={"thinking": think})
            add(DS_TOOLS[0], extra={"thinking": think})
        add([{"role": "user", "content": "Continue"}, {"role": "assistant", "content": "Partial", "prefix": True}],
            extra={"thinking": True}, gens=(False,))
    if name in ("qwen3", "llama3.2", "features", "named"):
        for m in OBJ_TOOLS:
            add(m, TOOL_SCHEMAS)
        add(GENERIC[1], TOOL_SCHEMAS)
    if name == "qwen3":
        for m in OBJ_TOOLS:
            add(m)
        for m in QWEN_REASONING:
            add(m)
        add(GENERIC[2], extra={"enable_thinking": False})
        add(GENERIC[0], extra={"enable_thinking": True})
    if name == "llama3.2":
        add(GENERIC[1], TOOL_SCHEMAS, extra={"date_string": "15 Aug 2025", "tools_in_user_message": False})
        add(OBJ_TOOLS[0], TOOL_SCHEMAS, extra={"date_string": "01 Jan 2026"})
        add(GENERIC[2], extra={"date_string": "26 Jul 2024"})
        add([{"role": "system", "content": "sys only"}], TOOL_SCHEMAS, extra={"date_string": "x"})
        add([{"role": "tool", "content": "plain string result"}, {"role": "tool", "content": "[1, 2]"}],
            extra={"date_string": "x"})
    if name == "features":
        for m in FEATURE_EXTRA:
            add(m)
        add(GENERIC[0], extra={"extra_var": "custom value", "bos_token": "<override>"})
    if name in ("deepseek-v3", "deepseek-v2", "deepseek-r1", "deepseek-v3.1", "llama3"):
        add(GENERIC[2], extra={"unused_var": [1, 2, 3]})
    if name == "llama3.2":  # every case needs a fixed date: the template calls strftime_now otherwise
        for c in out:
            c["extra"] = dict(c["extra"])
            c["extra"].setdefault("date_string", "26 Jul 2024")
    return out


# The clock the goldens are rendered at: transformers' strftime_now() reads datetime.now(), so it is
# pinned to the instant test_chat_template.c pins DeepInfer's renderer to (GOLDEN_NOW, in UTC).
GOLDEN_NOW = 1796040000  # 2026-11-30 12:00:00 UTC


def pin_transformers_clock():
    import datetime as dt
    from transformers.utils import chat_template_utils

    class PinnedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            t = dt.datetime.fromtimestamp(GOLDEN_NOW, dt.timezone.utc)
            return t.replace(tzinfo=None) if tz is None else t.astimezone(tz)

    chat_template_utils.datetime = PinnedDatetime


def public_goldens():
    """public_templates.jsonl: real templates with the inputs huggingface.js's Jinja end-to-end tests
    use (packages/jinja/test/e2e.test.js), "documents" included. Each line {"name", "template", "conversation"}; this
    fills in "text" (or "error") from transformers, in place."""
    from transformers.utils.chat_template_utils import render_jinja_template

    pin_transformers_clock()
    path = os.path.join(HERE, "public_templates.jsonl")
    recs = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
    for r in recs:
        r.pop("text", None)
        r.pop("error", None)
        data = json.loads(r["conversation"])
        msgs = data.pop("messages")
        tools = data.pop("tools", None)
        documents = data.pop("documents", None)
        agp = data.pop("add_generation_prompt", True)  # DeepInfer's default when the key is absent
        try:
            r["text"] = render_jinja_template([msgs], tools=tools, documents=documents, chat_template=r["template"],
                                              add_generation_prompt=agp, **data)[0][0]
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {e}"
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    print(f"public_templates: {len(recs)} templates ({sum('error' in r for r in recs)} expected errors)")


def main():
    import transformers

    if transformers.__version__ != "5.17.0":
        print(f"warning: transformers {transformers.__version__}, goldens were made with 5.17.0", file=sys.stderr)
    os.makedirs(os.path.join(HERE, "goldens"), exist_ok=True)
    names = sorted(d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d)) and d != "goldens")
    for name in names:
        tokens, template = load_dir(os.path.join(HERE, name))
        tok = make_tokenizer(tokens, template)
        lines = []
        for c in cases(name):
            rec = dict(c)
            # the conversation as the JSON text DeepInfer's string API reads (keeps 21.0 a float)
            conv = dict(c["extra"])
            conv.update({"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"]})
            if c["tools"] is not None:
                conv["tools"] = c["tools"]
            rec["conversation"] = json.dumps(conv, ensure_ascii=False)
            try:
                rec["text"] = tok.apply_chat_template(c["messages"], tools=c["tools"], tokenize=False,
                                                      add_generation_prompt=c["add_generation_prompt"], **c["extra"])
            except Exception as e:  # transformers refused: DeepInfer must refuse too
                rec["error"] = f"{type(e).__name__}: {e}"
            lines.append(json.dumps(rec, ensure_ascii=False))
        with open(os.path.join(HERE, "goldens", name + ".jsonl"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        n_err = sum('"error"' in l for l in lines)
        print(f"{name}: {len(lines)} cases ({n_err} expected errors)")
    public_goldens()


if __name__ == "__main__":
    main()
