"""Structured outputs end to end (issue 5): a random-weight DeepSeek-V3-shaped model with the real
DeepSeek-V3 tokenizer (128,815 ids in a 129,280-row vocabulary), hundreds of seeds at temperature 1.

Every output that finished on its own must be valid: JSON Schema outputs validate with `jsonschema`
(format checking on), regex outputs fully match (Python's `re`), EBNF outputs parse (an independent
recursive-descent parser here). Outputs cut by max_tokens must be valid prefixes, checked with
`deepinfer grammar ... --check-prefix`. A random model samples almost uniformly among the allowed
tokens, which is the hardest case for a grammar engine: it walks into every corner the grammar allows.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
jsonschema = pytest.importorskip("jsonschema")

from deepinfer import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402

TOK = os.path.join(ROOT, "tests", "data", "tokenizers", "deepseek-v3")
CLI = os.environ.get("DEEPINFER_CLI")

# A DeepSeek-V3 architecture small enough to run hundreds of requests on 2 cores in seconds.
CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 2, "n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "n_group": 2, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
    "routed_scaling_factor": 1.0, "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 16,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6, "rope_theta": 10000, "rope_scaling": None, "bos_token_id": 0, "eos_token_id": 1,
    "tie_word_embeddings": False, "hidden_act": "silu",
}

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "name": {"type": "string", "minLength": 1, "maxLength": 10},
        "born": {"type": "string", "format": "date"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 8},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city"], "additionalProperties": False},
        "flag": {"anyOf": [{"type": "null"}, {"type": "boolean"}, {"const": "n/a"}]},
        "ip": {"type": "string", "format": "ipv4"},
    },
    "required": ["id", "name", "age", "tags"],
    "additionalProperties": False,
}
REGEX = r"[A-Z][a-z]{2,6} (is|was) [0-9]{1,3}(\.[0-9]{1,2})?%"
EBNF = r'''
root   ::= expr
expr   ::= term (("+" | "-") term){0,3}
term   ::= factor (("*" | "/") factor){0,2}
factor ::= [0-9]{1,3} | "(" expr ")"
'''


def parse_expr(s):
    """Independent recursive-descent parser of the EBNF above; True when s is a whole expression."""
    pos = 0

    def factor(depth):
        nonlocal pos
        if depth > 50:
            return False
        if pos < len(s) and s[pos] == "(":
            pos += 1
            if not expr(depth + 1) or pos >= len(s) or s[pos] != ")":
                return False
            pos += 1
            return True
        start = pos
        while pos < len(s) and s[pos].isdigit() and pos - start < 3:
            pos += 1
        return pos > start and not (pos < len(s) and s[pos].isdigit())

    def term(depth):
        nonlocal pos
        if not factor(depth):
            return False
        for _ in range(2):
            if pos < len(s) and s[pos] in "*/":
                pos += 1
                if not factor(depth):
                    return False
        return True

    def expr(depth):
        nonlocal pos
        if not term(depth):
            return False
        for _ in range(3):
            if pos < len(s) and s[pos] in "+-":
                pos += 1
                if not term(depth):
                    return False
        return True

    return expr(0) and pos == len(s)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    if not os.path.exists(os.path.join(TOK, "tokenizer.json")):
        pytest.skip("tokenizer.json not decompressed (configure the build first)")
    d = tmp_path_factory.mktemp("dsv3-dummy")
    json.dump(CONFIG, open(d / "config.json", "w"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOK, f), d / f)
    m = LLM(str(d), load_format="dummy", threads=2, num_kv_blocks=2048, seed=7)
    yield m
    m.close()


def check_prefix(args, text):
    assert CLI, "DEEPINFER_CLI is needed for the prefix check"
    r = subprocess.run([CLI, "grammar", *args, "--check-prefix"], input=text.encode(), capture_output=True)
    return r.returncode == 0


def run(llm, so, n, max_tokens):
    params = [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=s, structured_outputs=so) for s in range(n)]
    outs = llm.generate(["Output:"] * n, params)
    return [o.outputs[0] for o in outs]


def test_json_schema_outputs_validate(llm, tmp_path):
    outs = run(llm, StructuredOutputsParams(json=SCHEMA), 200, 160)
    validator = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    finished = 0
    for c in outs:
        assert c.finish_reason in ("stop", "length"), c.finish_reason
        if c.finish_reason == "stop":
            finished += 1
            validator.validate(json.loads(c.text))
        else:
            assert check_prefix(["--json-schema", str(schema_file)], c.text), c.text
    print(f"json schema: {finished}/{len(outs)} finished on their own")
    assert finished >= len(outs) // 2  # the schema is bounded: most outputs must complete
    llm.check()


def test_json_object_outputs_parse(llm):
    outs = run(llm, StructuredOutputsParams(json_object=True), 100, 48)
    finished = 0
    for c in outs:
        if c.finish_reason == "stop":
            finished += 1
            assert isinstance(json.loads(c.text), dict), c.text
        else:
            assert check_prefix(["--json"], c.text), c.text
    print(f"json object: {finished}/{len(outs)} finished on their own")


def test_regex_outputs_match(llm):
    outs = run(llm, StructuredOutputsParams(regex=REGEX), 150, 40)
    finished = 0
    for c in outs:
        if c.finish_reason == "stop":
            finished += 1
            assert re.fullmatch(REGEX, c.text), c.text
        else:
            assert check_prefix(["--regex", REGEX], c.text), c.text
    print(f"regex: {finished}/{len(outs)} finished on their own")
    assert finished >= len(outs) // 2


def test_ebnf_outputs_parse(llm, tmp_path):
    g = tmp_path / "expr.gbnf"
    g.write_text(EBNF)
    outs = run(llm, StructuredOutputsParams(grammar=EBNF), 150, 64)
    finished = 0
    for c in outs:
        if c.finish_reason == "stop":
            finished += 1
            assert parse_expr(c.text), c.text
        else:
            assert check_prefix(["--grammar", str(g)], c.text), c.text
    print(f"ebnf: {finished}/{len(outs)} finished on their own")
    assert finished > 0
