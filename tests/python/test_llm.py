"""The Python package `deepinfer` (ctypes binding): LLM.generate and LLM.chat on fixture models.

dsv3-tiny: real weights, token-id prompts; greedy output equals the `deepinfer generate` CLI and
does not depend on batching. engine-dummy: random weights with the default model's tokenizer and
chat template, for text prompts, chat, stop strings, n samples, logprobs, structured outputs and
per-request errors.
"""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from deepinfer import LLM, SamplingParams, StructuredOutputsParams, DeepInferError  # noqa: E402

TINY = os.path.join(ROOT, "tests", "data", "models", "dsv3-tiny")
DUMMY = os.path.join(ROOT, "tests", "data", "models", "engine-dummy")


@pytest.fixture(scope="module")
def tiny():
    llm = LLM(TINY, num_kv_blocks=256, threads=2)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def dummy():
    llm = LLM(DUMMY, load_format="dummy", num_kv_blocks=256, threads=2, seed=1)
    yield llm
    llm.close()


def test_generate_ids_matches_cli_and_alone(tiny):
    prompts = [{"prompt_token_ids": [(7 * i + 3 * k) % 1000 + 2 for i in range(1 + 13 * k)]} for k in range(8)]
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    together = tiny.generate(prompts, sp)
    assert [o.outputs[0].finish_reason for o in together] == ["length"] * 8
    for p, o in zip(prompts, together):
        alone = tiny.generate(p, sp)[0]
        assert alone.outputs[0].token_ids == o.outputs[0].token_ids
        assert o.prompt_token_ids == p["prompt_token_ids"]
        assert len(o.outputs[0].token_ids) == 10
        assert o.metrics.time_to_first_token is not None and o.metrics.time_to_first_token >= 0
    cli = os.environ.get("DEEPINFER_CLI")
    if cli:
        ids = ",".join(map(str, prompts[3]["prompt_token_ids"]))
        r = subprocess.run([cli, "generate", "--model", TINY, "--prompt-ids", ids, "--max-tokens", "10",
                            "--temperature", "0", "--ignore-eos", "--output-format", "json"],
                           capture_output=True, text=True, check=True)
        res = json.loads(r.stdout)
        assert res["ids"] == together[3].outputs[0].token_ids
        assert res["finish_reason"] == "length" and res["text"] == ""
    tiny.check()
    assert tiny.get_stats()["kv_blocks_used"] == 0


def test_batch_invariant_option(tiny):
    # di_model_options.batch_invariant: the CPU backend always is, so the same tokens as without it
    inv = LLM(TINY, num_kv_blocks=64, threads=2, batch_invariant=True)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    p = {"prompt_token_ids": [5, 9, 11, 200, 31]}
    assert inv.generate(p, sp)[0].outputs[0].token_ids == tiny.generate(p, sp)[0].outputs[0].token_ids


def test_seeded_sampling_reproducible(tiny):
    p = {"prompt_token_ids": [5, 6, 7, 8, 9]}
    sp = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True, n=3)
    a = tiny.generate(p, sp)[0]
    b = tiny.generate([p, {"prompt_token_ids": [9, 9, 9]}], sp)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1  # the three samples differ
    unseeded = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    x, y = tiny.generate([p, p], unseeded)
    assert x.outputs[0].token_ids != y.outputs[0].token_ids  # each draws its own seed


def test_logprobs_and_errors(tiny):
    o = tiny.generate({"prompt_token_ids": [3, 4]}, SamplingParams(temperature=0, max_tokens=4, logprobs=3,
                                                                   ignore_eos=True))[0].outputs[0]
    assert len(o.logprobs) == 4
    for tok, d in zip(o.token_ids, o.logprobs):
        assert tok in d and d[tok].rank == 1  # greedy: the chosen token is the top one
        assert len(d) == 3 and all(lp.logprob <= 0 for lp in d.values())
    assert o.cumulative_logprob == pytest.approx(sum(d[t].logprob for t, d in zip(o.token_ids, o.logprobs)))
    with pytest.raises(DeepInferError, match="top_p"):
        tiny.generate({"prompt_token_ids": [3]}, SamplingParams(top_p=0))
    with pytest.raises(DeepInferError, match="outside the vocabulary"):
        tiny.generate({"prompt_token_ids": [3, 99999]}, SamplingParams())
    # a prompt longer than the context fails on its own; the other request still finishes
    long = {"prompt_token_ids": [5] * 5000}
    bad, good = tiny.generate([long, {"prompt_token_ids": [5, 6]}], SamplingParams(max_tokens=3, ignore_eos=True))
    assert bad.outputs[0].finish_reason == "error" and "max_model_len" in bad.outputs[0].error
    assert good.outputs[0].finish_reason == "length" and len(good.outputs[0].token_ids) == 3
    with pytest.raises(DeepInferError, match="tokenizer"):
        tiny.generate("text needs a tokenizer", SamplingParams())
    tiny.check()


def test_text_prompt_stop_strings(dummy):
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    full = dummy.generate("The quick brown fox", sp)[0]
    text = full.outputs[0].text
    assert len(text) > 10 and full.prompt_token_ids[0] == 0  # BOS added for a text prompt
    assert all(t < 8197 for t in full.outputs[0].token_ids)  # padding ids never sampled
    stop = text[4:7]
    cut = dummy.generate("The quick brown fox", SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                                                stop=[stop]))[0].outputs[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[:text.index(stop)]
    incl = dummy.generate("The quick brown fox", SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                                                 stop=[stop], include_stop_str_in_output=True))
    assert incl[0].outputs[0].text == text[:text.index(stop) + len(stop)]


def test_chat(dummy):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    rendered = dummy.render_chat(msgs)
    assert "Hi!" in rendered
    out = dummy.chat(msgs, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(out) == 1 and len(out[0].outputs[0].token_ids) == 8
    ids = out[0].prompt_token_ids
    assert ids.count(0) == 1  # the template's BOS only (not a second one from encoding)
    two = dummy.chat([msgs, [{"role": "user", "content": "Other"}]], SamplingParams(temperature=0, max_tokens=8,
                                                                                   ignore_eos=True))
    assert two[0].outputs[0].token_ids == out[0].outputs[0].token_ids


def test_structured_outputs(dummy):
    rx = r"(yes|no|maybe) [0-9]{2}"
    sp = SamplingParams(temperature=1.0, max_tokens=20, structured_outputs=StructuredOutputsParams(regex=rx))
    outs = dummy.generate(["Answer:"] * 8, [SamplingParams(temperature=1.0, max_tokens=20, seed=s,
                                                           structured_outputs=StructuredOutputsParams(regex=rx))
                                            for s in range(8)])
    for o in outs:
        c = o.outputs[0]
        assert c.finish_reason == "stop", c
        assert re.fullmatch(rx, c.text), c.text
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
              "required": ["a", "b"], "additionalProperties": False}
    sp = SamplingParams(temperature=0.8, max_tokens=64, seed=3,
                        structured_outputs=StructuredOutputsParams(json=schema))
    o = dummy.generate("JSON:", sp)[0].outputs[0]
    if o.finish_reason == "stop":
        v = json.loads(o.text)
        assert set(v) == {"a", "b"} and isinstance(v["a"], int) and v["b"] in ("x", "y")
    else:
        assert o.finish_reason == "length" and o.text.startswith("{")
    with pytest.raises(DeepInferError, match="structured output"):
        dummy.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(regex="(unclosed")))
    dummy.check()


def test_structured_outputs_lark_strict_bounds(dummy):
    """Issue 23: Lark grammars (grammar_syntax), strict JSON Schema objects, generation bounds."""
    lark = 'start: item ("," item)*\nitem: WORD | INT\n%import common (WORD, INT)\n'
    outs = dummy.generate(["List:"] * 4, [SamplingParams(temperature=1.0, max_tokens=24, seed=s, structured_outputs=
                                                         StructuredOutputsParams(grammar=lark, grammar_syntax="lark"))
                                          for s in range(4)])
    for o in outs:
        c = o.outputs[0]
        if c.finish_reason == "stop":
            assert re.fullmatch(r"([A-Za-z]+|[0-9]+)(,([A-Za-z]+|[0-9]+))*", c.text), c.text
    # strict: no properties beyond the named ones; max_digits bounds the unbounded integer
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for seed in range(3):
        sp = SamplingParams(temperature=1.0, max_tokens=40, seed=seed, structured_outputs=StructuredOutputsParams(
            json=schema, strict=True, max_digits=2))
        o = dummy.generate("JSON:", sp)[0].outputs[0]
        assert re.fullmatch(r'\{"a":-?[0-9]{1,2}\}', o.text) or o.finish_reason == "length", o.text
    # max_string_length bounds a pattern's string too (the matcher's counter; the string must still
    # end with its "!" within the 6 characters)
    pat = {"type": "string", "pattern": "^[a-z]+!$"}
    for seed in range(3):
        sp = SamplingParams(temperature=1.0, max_tokens=40, seed=seed, structured_outputs=StructuredOutputsParams(
            json=pat, max_string_length=6))
        o = dummy.generate("JSON:", sp)[0].outputs[0]
        assert re.fullmatch(r'"[a-z]{1,5}!"', o.text) and o.finish_reason == "stop", (o.text, o.finish_reason)
    with pytest.raises(ValueError, match="grammar_syntax"):
        StructuredOutputsParams(grammar="start: \"x\"", grammar_syntax="peg")
    with pytest.raises(ValueError, match="max_digits"):
        StructuredOutputsParams(json={}, max_digits=0)
    with pytest.raises(DeepInferError, match="no 'start' rule"):
        dummy.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(grammar="s: \"x\"",
                                                                                     grammar_syntax="lark")))
    dummy.check()


def test_structured_outputs_separators(dummy):
    """Issue 23: XGrammar's separators (item, key) and max_whitespace on the Python surface."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items":
              {"type": "boolean"}}}, "required": ["a", "b"], "additionalProperties": False}
    texts = []
    for seed in range(4):
        so = StructuredOutputsParams(json=schema, separators=(", ", ": "), max_digits=3)
        o = dummy.generate("JSON:", SamplingParams(temperature=1.0, max_tokens=60, seed=seed,
                                                   structured_outputs=so))[0].outputs[0]
        texts.append(o.text)
        if o.finish_reason == "stop":
            assert re.fullmatch(r'\{"a": -?[0-9]{1,3}, "b": \[((true|false)(, (true|false))*)?\]\}', o.text), o.text
        else:
            assert '{"a": '.startswith(o.text[:6]), o.text
    assert any(t.startswith('{"a": ') for t in texts), texts
    # whitespace beside the separators: at most 2 characters of [ \t\n\r] in each gap
    so = StructuredOutputsParams(json={"type": "array", "items": {"type": "integer"}}, separators=(",", ":"),
                                 max_whitespace=2, max_digits=2)
    spaced = 0
    for seed in range(3):
        o = dummy.generate("JSON:", SamplingParams(temperature=1.0, max_tokens=40, seed=seed,
                                                   structured_outputs=so))[0].outputs[0]
        spaced += bool(re.search(r"[ \t\n\r]", o.text))
        if o.finish_reason == "stop":
            assert re.fullmatch(r"\[[ \t\n\r]{0,2}(-?[0-9]{1,2}([ \t\n\r]{0,2},[ \t\n\r]{0,2}"
                                r"-?[0-9]{1,2})*[ \t\n\r]{0,2})?\]", o.text), repr(o.text)
    assert spaced, "max_whitespace allowed whitespace, yet no sample wrote any"
    for bad in ((", ",), [",", ":", ":"], (",", 1), ", "):
        with pytest.raises(ValueError, match="separators"):
            StructuredOutputsParams(json={}, separators=bad)
    with pytest.raises(ValueError, match="max_whitespace"):
        StructuredOutputsParams(json={}, max_whitespace=65)
    # the content is the grammar compiler's to check: ',' / ':' with JSON whitespace only
    for bad in ((";", ":"), (",", ", "), (", x", ":"), (",        ", ":")):
        with pytest.raises(DeepInferError, match="separator"):
            dummy.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(json={}, separators=bad)))
    dummy.check()


def test_structured_outputs_indent(dummy):
    """Issue 23: XGrammar's indent layout on the Python surface (a newline and 2 spaces per level,
    "," / ": " by default; an empty array as "[]")."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items":
              {"type": "boolean"}}}, "required": ["a", "b"], "additionalProperties": False}
    layout = re.compile(r'\{\n  "a": -?[0-9]{1,3},\n  "b": (\[\]|\[\n    (true|false)(,\n    (true|false))*\n  \])\n\}')
    texts = []
    for seed in range(4):
        so = StructuredOutputsParams(json=schema, indent=2, max_digits=3)
        o = dummy.generate("JSON:", SamplingParams(temperature=1.0, max_tokens=60, seed=seed,
                                                   structured_outputs=so))[0].outputs[0]
        texts.append(o.text)
        if o.finish_reason == "stop":
            assert layout.fullmatch(o.text), repr(o.text)
            json.loads(o.text)
        else:
            assert '{\n  "a": '.startswith(o.text[:9]) or o.text.startswith('{\n  "a": '), repr(o.text)
    assert any(t.startswith('{\n  "a": ') for t in texts), texts
    for bad in (0, 17, "2", True, 1.5):
        with pytest.raises(ValueError, match="indent"):
            StructuredOutputsParams(json={}, indent=bad)
    with pytest.raises(ValueError, match="indent"):
        StructuredOutputsParams(regex="a", indent=2)
    with pytest.raises(ValueError, match="max_whitespace"):
        StructuredOutputsParams(json={}, indent=2, max_whitespace=1)
    dummy.check()


DEFAULT = os.path.join(ROOT, "models", "default")


@pytest.mark.skipif(not os.path.exists(os.path.join(DEFAULT, "model.safetensors")), reason="no shipped model")
def test_default_model_llm_and_chat(monkeypatch):
    monkeypatch.delenv("DEEPINFER_HF_MODEL_DIR", raising=False)
    llm = LLM(threads=2, max_num_batched_tokens=64)  # no model given: the shipped models/default
    assert os.path.samefile(llm.model_dir, DEFAULT)
    system = "You are a helpful assistant who answers in one short sentence. " * 4
    prompts = [system + q for q in ("What is the sea?", "Name a color.", "Who wrote poems?", "Where is Paris?")]
    sp = SamplingParams(temperature=0, max_tokens=24)
    together = llm.generate(prompts, sp)
    assert llm.get_stats()["prefix_cache_hit_tokens"] > 0  # the shared system prompt
    for p, t in zip(prompts, together):
        alone = llm.generate(p, sp)[0]
        assert alone.outputs[0].token_ids == t.outputs[0].token_ids
        assert alone.outputs[0].text == t.outputs[0].text
        assert t.outputs[0].finish_reason in ("stop", "length")
    stopped = [o for o in together if o.outputs[0].finish_reason == "stop"]
    for o in stopped:
        assert o.outputs[0].stop_reason == 1  # the model's EOS, included in token_ids, not in text
        assert o.outputs[0].token_ids[-1] == 1
    d = llm.get_default_sampling_params()  # generation_config.json: temperature 0.7, top_p 0.95, 128 tokens
    assert (d.temperature, d.top_p, d.max_tokens) == (0.7, 0.95, 128)
    chat = llm.chat([{"role": "user", "content": "Write one sentence about the sea."}],
                    SamplingParams(temperature=0, max_tokens=40))
    assert chat[0].outputs[0].text.strip()
    llm.check()
    llm.close()


@pytest.mark.skipif(not os.path.exists(os.path.join(DEFAULT, "model.safetensors")), reason="no shipped model")
def test_examples_run():
    env = dict(os.environ)
    env.pop("DEEPINFER_HF_MODEL_DIR", None)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "offline_inference.py"), "--max-tokens", "8"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("Generated:") == 4 and "Chat:" in r.stdout
    cli = os.environ.get("DEEPINFER_CLI")
    twin = os.path.join(os.path.dirname(cli), "offline_inference") if cli else None
    if twin and os.path.exists(twin):
        r = subprocess.run([twin], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("Generated:") == 4


def tiny_score_logits(ids):
    """`deepinfer score` logits of ids on dsv3-tiny, one list per position."""
    from cli_score import score_logits
    cli = os.environ.get("DEEPINFER_CLI", os.path.join(ROOT, "build", "deepinfer"))
    return score_logits(cli, TINY, ids)


def test_prompt_logprobs(tiny):
    import math
    ids = [(11 * i + 5) % 900 + 2 for i in range(40)]
    logits = tiny_score_logits(ids)
    outs = tiny.generate([{"prompt_token_ids": ids}, {"prompt_token_ids": ids[:9]}],
                         [SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=2),
                          SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)])
    o = outs[0]
    assert o.outputs[0].token_ids == [] and o.outputs[0].finish_reason == "length"
    assert outs[1].prompt_logprobs is None and len(outs[1].outputs[0].token_ids) == 3
    plp = o.prompt_logprobs
    assert len(plp) == len(ids) and plp[0] is None
    for t in range(1, len(ids)):
        row = logits[t - 1]
        m = max(row)
        lse = m + math.log(sum(math.exp(x - m) for x in row))
        want = row[ids[t]] - lse
        assert plp[t][ids[t]].logprob == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert plp[t][ids[t]].rank == 1 + sum(x > row[ids[t]] for x in row)
        best = sorted(range(len(row)), key=lambda i: (-row[i], i))[:2]
        assert set(best) <= set(plp[t]) and len(plp[t]) <= 3
        assert [plp[t][k].logprob for k in best] == sorted((plp[t][k].logprob for k in best), reverse=True)
    with pytest.raises(ValueError):
        tiny.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=0))  # 0 only with prompt_logprobs


def test_no_tokenizer_and_bad_options_raise_clean_errors(tiny):
    """A folder without tokenizer.json: ids work, a text prompt raises DeepInferError with the engine's
    message (never a traceback from inside the binding); bad engine options are refused by name."""
    assert not tiny.has_tokenizer
    with pytest.raises(DeepInferError, match="needs a tokenizer"):
        tiny.generate(["hello"], SamplingParams(max_tokens=2))
    out = tiny.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 2 and out[0].outputs[0].text == ""
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        LLM(TINY, gpu_memory_utilization=1.5)
    assert tiny.kv_summary.startswith("KV cache: 256 blocks of 64 tokens") and "num_kv_blocks given" in tiny.kv_summary


def test_step_output_reader():
    """LLM._run reads each step's outputs by one struct.iter_unpack (_lib.seq_output_reader): every field it
    reads equals the ctypes structure's, NULL pointers as 0, on random values in every field."""
    import ctypes
    import random
    from deepinfer import _lib
    read = _lib.seq_output_reader()
    assert read is not None, "di_seq_output's layout has no struct format"
    rng = random.Random(7)
    n = 37
    arr = (_lib.SeqOutput * n)()
    keep = []
    for s in arr:  # every byte random first, so a misplaced read shows
        ctypes.memmove(ctypes.addressof(s), bytes(rng.randrange(256) for _ in range(ctypes.sizeof(s))), ctypes.sizeof(s))
    for i, s in enumerate(arr):
        s.req_id = rng.randrange(1 << 64)
        s.sample_index, s.n_new_tokens, s.finish_reason = rng.randrange(-5, 9), rng.randrange(0, 7), rng.randrange(0, 5)
        s.n_cached_tokens = rng.randrange(-(1 << 31), 1 << 31)
        s.new_text_len = rng.randrange(1 << 40)
        for name in ("new_tokens", "new_logprobs", "prompt_token_ids", "prompt_logprobs"):
            if i % 3:
                b = ctypes.create_string_buffer(8)
                keep.append(b)
                setattr(s, name, ctypes.cast(b, dict(_lib.SeqOutput._fields_)[name]))
            else:
                setattr(s, name, None)
        s.new_text = rng.randrange(1, 1 << 47) if i % 2 else None
    so = _lib.StepOutput()
    so.n, so.seqs = n, ctypes.cast(arr, ctypes.POINTER(_lib.SeqOutput))
    rows = list(read(so))
    assert len(rows) == n

    def addr(p):
        return ctypes.cast(p, ctypes.c_void_p).value or 0
    for s, row in zip(arr, rows):
        want = (s.req_id, s.sample_index, s.n_new_tokens, addr(s.new_tokens), s.new_text or 0, s.new_text_len,
                addr(s.new_logprobs), s.finish_reason, s.n_cached_tokens, addr(s.prompt_token_ids), addr(s.prompt_logprobs))
        assert row == want
