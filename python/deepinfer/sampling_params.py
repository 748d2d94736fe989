"""SamplingParams and StructuredOutputsParams with vLLM's parameter names."""
import json as _json


class StructuredOutputsParams:
    """At most one of: json (a JSON Schema as dict or text), regex (ECMA-262, u flag), grammar (in
    grammar_syntax: "gbnf", llama.cpp's EBNF, the default, or "lark", llguidance's Lark),
    json_object=True (any JSON object). For JSON: strict=True is XGrammar's strict mode (objects
    without additionalProperties admit no other properties); max_digits / max_string_length bound
    numbers and strings (pattern / format strings and additional keys too) the schema leaves unbounded (None = defaults: 16
    digits, 4,096 characters; -1 = unbounded). separators=(item, key) fixes the JSON text between items / members and between a
    key and its value, as XGrammar's `separators` (", " / ": " is XGrammar's any_whitespace=False
    text); each is "," / ":" with JSON whitespace around it. max_whitespace=N allows up to N (at most
    64) whitespace characters in each gap besides (None = 0: compact). indent=N (1..16; json only)
    lays the JSON out as XGrammar's indent (any_whitespace=False) does: a newline and N spaces per
    nesting level inside non-empty objects and arrays, separators "," / ": " unless given, values
    of an unconstrained schema ({}, bare {"type": "object"}) and const / enum on one line."""

    SYNTAXES = ("gbnf", "lark")

    def __init__(self, json=None, regex=None, grammar=None, json_object=None, grammar_syntax=None, strict=False,
                 max_digits=None, max_string_length=None, separators=None, max_whitespace=None,
                 indent=None):
        given = [x for x in (json, regex, grammar) if x is not None] + ([1] if json_object else [])
        if len(given) > 1:
            raise ValueError("StructuredOutputsParams: give only one of json, regex, grammar, json_object")
        if grammar_syntax is not None and grammar_syntax not in self.SYNTAXES:
            raise ValueError(f"StructuredOutputsParams: grammar_syntax must be 'gbnf' or 'lark', not {grammar_syntax!r}")
        for name, v in (("max_digits", max_digits), ("max_string_length", max_string_length)):
            if v is not None and (not isinstance(v, int) or v == 0 or v < -1):
                raise ValueError(f"StructuredOutputsParams: {name} must be a positive integer or -1 (unbounded)")
        if separators is not None:
            if (not isinstance(separators, (tuple, list)) or len(separators) != 2
                    or not all(isinstance(x, str) for x in separators)):
                raise ValueError("StructuredOutputsParams: separators must be two strings (item, key), "
                                 f"not {separators!r}")
            separators = tuple(separators)
        if max_whitespace is not None and (not isinstance(max_whitespace, int) or not 0 <= max_whitespace <= 64):
            raise ValueError("StructuredOutputsParams: max_whitespace must be an integer in 0..64")
        if indent is not None:
            if isinstance(indent, bool) or not isinstance(indent, int) or not 1 <= indent <= 16:
                raise ValueError(f"StructuredOutputsParams: indent must be an integer in 1..16, not {indent!r}")
            if json is None:
                raise ValueError("StructuredOutputsParams: indent goes with json=")
            if max_whitespace:
                raise ValueError("StructuredOutputsParams: indent fixes the whitespace; give no max_whitespace")
        self.indent = indent
        self.separators = separators
        self.max_whitespace = max_whitespace
        self.json = json
        self.regex = regex
        self.grammar = grammar
        self.json_object = bool(json_object)
        self.grammar_syntax = grammar_syntax
        self.strict = bool(strict)
        self.max_digits = max_digits
        self.max_string_length = max_string_length

    def grammar_syntax_id(self):
        return self.SYNTAXES.index(self.grammar_syntax or "gbnf")

    def schema_text(self):
        if self.json is None:
            return None
        return self.json if isinstance(self.json, str) else _json.dumps(self.json)

    def __repr__(self):
        return (f"StructuredOutputsParams(json={self.json!r}, regex={self.regex!r}, grammar={self.grammar!r}, "
                f"json_object={self.json_object})")


class SamplingParams:
    """Sampling parameters of one request (vLLM's names and defaults: temperature 1, top_p 1,
    top_k off (0 or -1), max_tokens 16). temperature 0 is greedy. seed=None: a seed is drawn when
    the request is admitted. stop strings are not included in the returned text unless
    include_stop_str_in_output. logprobs=k returns the chosen token's logprob and the top k.
    prompt_logprobs=k returns every prompt token's logprob (after the first) and the top k (raw
    log-softmax, as vLLM); with it, max_tokens=0 only scores the prompt (no token generated)."""

    def __init__(self, n=1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, presence_penalty=0.0,
                 frequency_penalty=0.0, repetition_penalty=1.0, seed=None, stop=None, stop_token_ids=None,
                 ignore_eos=False, max_tokens=16, min_tokens=0, logprobs=None, include_stop_str_in_output=False,
                 skip_special_tokens=True, logit_bias=None, structured_outputs=None, prompt_logprobs=None):
        self.n = int(n)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k) if top_k is not None else 0
        self.min_p = float(min_p)
        self.presence_penalty = float(presence_penalty)
        self.frequency_penalty = float(frequency_penalty)
        self.repetition_penalty = float(repetition_penalty)
        self.seed = seed
        if isinstance(stop, str):
            stop = [stop]
        self.stop = list(stop) if stop else []
        self.stop_token_ids = list(stop_token_ids) if stop_token_ids else []
        self.ignore_eos = bool(ignore_eos)
        self.max_tokens = max_tokens
        self.min_tokens = int(min_tokens)
        self.logprobs = logprobs
        self.prompt_logprobs = prompt_logprobs
        self.include_stop_str_in_output = bool(include_stop_str_in_output)
        self.skip_special_tokens = bool(skip_special_tokens)
        self.logit_bias = dict(logit_bias) if logit_bias else {}
        self.structured_outputs = structured_outputs
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {temperature}")

    def __repr__(self):
        keys = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "stop", "stop_token_ids",
                "ignore_eos", "logprobs", "prompt_logprobs")
        return "SamplingParams(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in keys) + ")"
