"""The offline API: LLM(model=...).generate(prompts, params) and .chat(messages, params), as in vLLM.

The model folder is `model`, else $DEEPINFER_HF_MODEL_DIR, else the shipped default model
(models/default next to the package or in the repository).
"""
import ctypes
import functools
import json
import os
import sys
import time

from . import _dist, _lib, scoring
from .outputs import Logprob, RequestOutput
from .sampling_params import SamplingParams


def default_model_dir():
    env = os.environ.get("DEEPINFER_HF_MODEL_DIR")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "models", "default"), os.path.join(_lib._repo_root(), "models", "default")):
        if os.path.exists(os.path.join(cand, "config.json")):
            return cand
    raise FileNotFoundError("no model given, DEEPINFER_HF_MODEL_DIR is not set and the default model "
                            "(models/default) was not found")


class _SpecStats(ctypes.Structure):
    """Mirror of di_spec_stats."""
    _fields_ = [("num_tokens", ctypes.c_int), ("verify_steps", ctypes.c_int64), ("drafted_tokens", ctypes.c_int64),
                ("accepted_tokens", ctypes.c_int64), ("drafted_at", ctypes.c_int64 * 5),
                ("accepted_at", ctypes.c_int64 * 5), ("acceptance_rate", ctypes.c_double),
                ("mean_accepted_length", ctypes.c_double), ("method", ctypes.c_int),
                ("calib_count", ctypes.c_int64 * 10), ("calib_predicted", ctypes.c_double * 10),
                ("calib_accepted", ctypes.c_int64 * 10), ("calibration_error", ctypes.c_double),
                ("proposals_in_step", ctypes.c_int64), ("proposals_missed", ctypes.c_int64)]


def _prompt_logprobs(s):
    """vLLM's shape: None for the first prompt token, then {token_id: Logprob} with the token itself
    and the top alternatives (rank 1 = the most likely; the token's rank counts the ids more likely than it)."""
    out = [None]
    k = s.n_prompt_top
    for i in range(1, s.n_prompt_tokens):
        d = {}
        for j in range(k):
            tl = s.prompt_top[i * k + j]
            if tl.id >= 0:
                d[tl.id] = Logprob(tl.logprob, rank=j + 1)
        tok = s.prompt_token_ids[i]
        d[tok] = Logprob(s.prompt_logprobs[i], rank=s.prompt_ranks[i])
        out.append(d)
    return out


class LLM:
    """An engine over one model. Engine options use vLLM's names: max_model_len, max_num_seqs,
    max_num_batched_tokens, enable_prefix_caching, enable_chunked_prefill, async_scheduling,
    kv_cache_memory_bytes, num_kv_blocks, gpu_memory_utilization (CUDA: the share of the device's memory
    for everything, 0.9; the KV cache gets what the weights and step buffers leave), seed, swa_bounded_replay
    (DeepSeek-V4: a cached prefix keeps only its compressed entries and indexer keys, a hit recomputes the
    last sliding_window - 1 tokens; less memory, approximate); model loading: load_format ("auto", "dummy"),
    accelerator ("cpu", "cuda"), quantization (None or "fp8": a bf16 checkpoint's linear layers to 128 x 128
    block FP8 at load, DeepSeek's format; vLLM's name, per block rather than per tensor), kv_cache_dtype
    (None / "auto" or "fp8": the latent KV cache in E4M3, CPU and CUDA backends), threads, quiet, batch_invariant (outputs independent of the other requests
    in a step: the CPU always is; on CUDA slower kernels). speculative_config={"method": "mtp",
    "num_speculative_tokens": 1..5, "min_confidence": 0.3 (optional)} turns on lossless speculative
    decoding with the model's MTP layer (CPU backend; off by default); {"method": "dspark"} with the DSpark
    block drafter (keys acceptance, schedule, profile ("online" / "startup"), model: docs/speculative.md). Several ranks (docs/multi-gpu.md):
    data_parallel_size=N (N ranks under mpirun, requests placed on them by load; outside mpirun the
    program is re-run under it), enable_expert_parallel, enable_eplb, eplb_config={"num_redundant_experts":
    R, "window_size": W, "step_interval": S}, dist_timeout (seconds per collective, 60)."""

    def __init__(self, model=None, *, max_model_len=None, max_num_seqs=256, max_num_batched_tokens=2048,
                 enable_prefix_caching=True, enable_chunked_prefill=True, async_scheduling=True,
                 kv_cache_memory_bytes=None, num_kv_blocks=None, gpu_memory_utilization=0.9, seed=0,
                 load_format="auto", accelerator=None, quantization=None, kv_cache_dtype=None,
                 threads=None, dummy_seed=0, quiet=True, batch_invariant=False, speculative_config=None,
                 swa_bounded_replay=False, data_parallel_size=1, enable_expert_parallel=False, enable_eplb=False,
                 eplb_config=None, dist_timeout=None, **unsupported):
        if unsupported:
            raise TypeError("LLM: unsupported argument(s): " + ", ".join(sorted(unsupported)))
        self._L = _lib.lib()
        distributed = data_parallel_size != 1 or enable_expert_parallel or enable_eplb or eplb_config is not None
        if distributed:  # several ranks (deepinfer/_dist.py); outside mpirun this re-runs the program under it
            _dist.setup(self._L, data_parallel_size, enable_expert_parallel, enable_eplb, eplb_config, dist_timeout)
        self._model = ctypes.c_void_p()
        self._engine = ctypes.c_void_p()
        self._template = None
        self._tok = None
        self.model_dir = model if model is not None else default_model_dir()
        mo = _lib.ModelOptions()
        self._L.di_model_options_default(ctypes.byref(mo))
        mo.load_format = load_format.encode()
        mo.accelerator = accelerator.encode() if accelerator else None
        mo.threads = int(threads or 0)
        mo.dummy_seed = int(dummy_seed)
        mo.quiet = 1 if quiet else 0
        mo.batch_invariant = 1 if batch_invariant else 0
        mo.quantization = quantization.encode() if quantization else None
        mo.kv_cache_dtype = kv_cache_dtype.encode() if kv_cache_dtype else None
        _lib.check(self._L.di_model_load(self.model_dir.encode(), ctypes.byref(mo), ctypes.byref(self._model)),
                   f"loading {self.model_dir}")
        eo = _lib.EngineOptions()
        self._L.di_engine_options_default(ctypes.byref(eo))
        eo.max_num_seqs = int(max_num_seqs)
        eo.max_num_batched_tokens = int(max_num_batched_tokens)
        eo.max_model_len = int(max_model_len or 0)
        eo.enable_prefix_caching = int(bool(enable_prefix_caching))
        eo.enable_chunked_prefill = int(bool(enable_chunked_prefill))
        eo.async_scheduling = int(bool(async_scheduling))
        if kv_cache_memory_bytes:
            eo.kv_cache_memory_bytes = int(kv_cache_memory_bytes)
        if num_kv_blocks:
            eo.num_kv_blocks = int(num_kv_blocks)
        if not 0 < float(gpu_memory_utilization) <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        eo.gpu_memory_utilization = float(gpu_memory_utilization)
        eo.seed = int(seed or 0)
        eo.swa_bounded_replay = 1 if swa_bounded_replay else 0
        st = self._L.di_engine_create(self._model, ctypes.byref(eo), ctypes.byref(self._engine))
        if st != 0:
            msg = self._L.di_last_error().decode("utf-8", "replace")
            self._L.di_model_free(self._model)
            self._model = ctypes.c_void_p()
            raise _lib.DeepInferError(f"creating the engine: {msg}")
        if distributed:
            _dist.close_at_exit(self)
        self.kv_summary = self._L.di_engine_kv_summary(self._engine).decode("utf-8", "replace")
        if not quiet:
            print(f"deepinfer: {self.kv_summary}", file=sys.stderr)
        self._counter = 0
        if speculative_config:
            try:
                self._set_speculative(speculative_config)
            except Exception:
                self.close()
                raise

    def _set_speculative(self, cfg):
        """vLLM's speculative_config: {"method": "mtp" | "dspark", "num_speculative_tokens": N, ...};
        the C library parses it (di_engine_set_speculative_config, docs/speculative.md)."""
        cfg = dict(cfg)
        method = cfg.get("method", "mtp")
        if method not in ("mtp", "deepseek_mtp", "dspark"):
            raise ValueError(f"speculative_config: method must be \"mtp\" or \"dspark\", got {method!r}")
        n = cfg.get("num_speculative_tokens")
        if method != "dspark" and (not isinstance(n, int) or isinstance(n, bool)):
            raise ValueError("speculative_config: num_speculative_tokens (an int, 0..5) is required")
        f = self._L.di_engine_set_speculative_config
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p]
        _lib.check(f(self._engine, self._model, json.dumps(cfg).encode()), "speculative_config")

    def get_speculative_stats(self):
        """Speculative decoding counters: drafted / accepted tokens, per draft position, rates."""
        s = _SpecStats()
        f = self._L.di_engine_get_spec_stats
        f.restype = None
        f.argtypes = [ctypes.c_void_p, ctypes.POINTER(_SpecStats)]
        f(self._engine, ctypes.byref(s))
        return {"num_speculative_tokens": s.num_tokens, "verify_steps": s.verify_steps,
                "drafted_tokens": s.drafted_tokens, "accepted_tokens": s.accepted_tokens,
                "drafted_per_position": list(s.drafted_at)[:s.num_tokens],
                "accepted_per_position": list(s.accepted_at)[:s.num_tokens],
                "acceptance_rate": s.acceptance_rate, "mean_accepted_length": s.mean_accepted_length,
                "method": "dspark" if s.method == 1 else "mtp",
                "calibration": {"count": list(s.calib_count), "predicted": list(s.calib_predicted),
                                "accepted": list(s.calib_accepted), "ece": s.calibration_error},
                "proposals_in_step": s.proposals_in_step, "proposals_missed": s.proposals_missed}

    # ---- lifetime ------------------------------------------------------------------------------
    def close(self):
        if getattr(self, "_engine", None):
            self._L.di_engine_free(self._engine)
            self._engine = ctypes.c_void_p()
        if getattr(self, "_tok", None):
            self._L.di_tokenizer_free(self._tok)
            self._tok = None
        if getattr(self, "_template", None):
            self._L.di_chat_template_free(self._template)
            self._template = None
        if getattr(self, "_model", None):
            self._L.di_model_free(self._model)
            self._model = ctypes.c_void_p()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- requests ------------------------------------------------------------------------------
    def _add(self, prompt, sp, rendered=False, prompt_logprobs_from=0):
        keep = []  # ctypes buffers that must live until add_request returns (it copies)
        p = _lib.RequestParams()
        self._L.di_request_params_default(ctypes.byref(p))
        text = None
        if isinstance(prompt, str):
            text = prompt
            p.prompt = prompt.encode("utf-8")
            p.prompt_is_rendered = 1 if rendered else 0
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = [int(x) for x in prompt["prompt_token_ids"]]
            arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
            keep.append(arr)
            p.prompt_ids = ctypes.cast(arr, _lib.c_int32_p)
            p.n_prompt_ids = len(ids)
        elif isinstance(prompt, dict) and "prompt" in prompt:
            text = prompt["prompt"]
            p.prompt = text.encode("utf-8")
        else:
            raise TypeError("a prompt is a string, {'prompt': str} or {'prompt_token_ids': [ints]}")
        p.n = sp.n
        p.temperature = sp.temperature
        p.top_p = sp.top_p
        p.top_k = sp.top_k if sp.top_k > 0 else 0
        p.min_p = sp.min_p
        p.repetition_penalty = sp.repetition_penalty
        p.presence_penalty = sp.presence_penalty
        p.frequency_penalty = sp.frequency_penalty
        if sp.seed is not None:
            p.has_seed = 1
            p.seed = int(sp.seed) & 0xFFFFFFFFFFFFFFFF
        p.logprobs = -1 if sp.logprobs is None else int(sp.logprobs)
        plp = getattr(sp, "prompt_logprobs", None)
        p.prompt_logprobs = -1 if plp is None else int(plp)
        if plp is not None and p.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be non-negative, got {plp}")
        p.prompt_logprobs_from = prompt_logprobs_from
        if sp.max_tokens is None:  # up to the context (0 would mean "score only" with prompt logprobs)
            p.max_tokens = 0 if plp is None else self._L.di_model_max_context(self._model)
        else:
            p.max_tokens = int(sp.max_tokens)
            if p.max_tokens < (0 if plp is not None else 1):
                raise ValueError(f"max_tokens must be at least {0 if plp is not None else 1}"
                                 f"{'' if plp is not None else ' (0 only with prompt_logprobs)'}, got {sp.max_tokens}")
        p.min_tokens = sp.min_tokens
        if sp.stop_token_ids:
            arr = (ctypes.c_int32 * len(sp.stop_token_ids))(*sp.stop_token_ids)
            keep.append(arr)
            p.stop_token_ids = ctypes.cast(arr, _lib.c_int32_p)
            p.n_stop_token_ids = len(sp.stop_token_ids)
        if sp.stop:
            arr = (ctypes.c_char_p * len(sp.stop))(*[s.encode("utf-8") for s in sp.stop])
            keep.append(arr)
            p.stop = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
            p.n_stop = len(sp.stop)
        if sp.logit_bias:
            ids = list(sp.logit_bias.keys())
            a = (ctypes.c_int32 * len(ids))(*[int(i) for i in ids])
            b = (ctypes.c_float * len(ids))(*[float(sp.logit_bias[i]) for i in ids])
            keep += [a, b]
            p.logit_bias_ids = ctypes.cast(a, _lib.c_int32_p)
            p.logit_bias_values = ctypes.cast(b, _lib.c_float_p)
            p.n_logit_bias = len(ids)
        p.ignore_eos = int(sp.ignore_eos)
        p.include_stop_str_in_output = int(sp.include_stop_str_in_output)
        p.skip_special_tokens = int(sp.skip_special_tokens)
        so = sp.structured_outputs
        if so is not None:
            schema = so.schema_text()
            if schema is not None:
                p.json_schema = schema.encode("utf-8")
            if so.regex is not None:
                p.regex = so.regex.encode("utf-8")
            if so.grammar is not None:
                p.grammar = so.grammar.encode("utf-8")
            p.json_object = int(so.json_object)
            p.grammar_syntax = so.grammar_syntax_id()
            p.json_strict = int(bool(so.strict))
            p.max_digits = int(so.max_digits or 0)
            p.max_string_length = int(so.max_string_length or 0)
            if so.separators is not None:
                p.item_separator, p.key_separator = (x.encode("utf-8") for x in so.separators)
            p.max_whitespace = int(so.max_whitespace or 0)
            p.indent = int(so.indent or 0)
        rid = ctypes.c_uint64()
        _lib.check(self._L.di_engine_add_request(self._engine, ctypes.byref(p), ctypes.byref(rid)), "adding a request")
        self._counter += 1
        out = RequestOutput(str(rid.value), text, sp.n)
        out.metrics.arrival_time = time.time()
        if text is None:
            out.prompt_token_ids = [int(x) for x in prompt["prompt_token_ids"]]
        return rid.value, out

    def _run(self, reqs):
        """Steps the engine until every request in `reqs` ({id: RequestOutput}) finished. Each step's
        outputs are read from the C array in one struct.iter_unpack (_lib.seq_output_reader): a decoding
        step's usual output (new tokens and text) is taken from those fields; an output with anything
        more (the prompt's ids the first time, prompt logprobs, logprobs, its end) goes through the
        ctypes structure (_take). Per sequence and step this is ~4x cheaper than the ctypes fields
        alone, which at batch 256 cost about as much as the H200's whole decoding step."""
        texts = {}
        pending = {rid: set(range(len(o.outputs))) for rid, o in reqs.items()}
        left = sum(len(p) for p in pending.values())
        step = ctypes.POINTER(_lib.StepOutput)()
        read = _lib.seq_output_reader()
        i32, chars = ctypes.c_int32, {}  # chars: ctypes char arrays by length (a text's bytes in one copy)
        while left:
            _lib.check(self._L.di_engine_step(self._engine, ctypes.byref(step)), "engine step")
            so = step.contents
            if so.n <= 0:
                continue
            rows = read(so) if read else None
            for i in range(so.n):
                if rows is not None:
                    (rid, idx, n_new, tok_p, text_p, text_len, lp_p, fin, n_cached, pid_p, plp_p) = next(rows)
                    ro = reqs.get(rid)
                    if ro is None:
                        continue
                    if not (fin or lp_p or plp_p or (pid_p and ro.prompt_token_ids is None)):
                        ro.num_cached_tokens = n_cached
                        co = ro.outputs[idx]
                        if n_new == 1:
                            co.token_ids.append(i32.from_address(tok_p).value)
                        elif n_new:
                            co.token_ids.extend((i32 * n_new).from_address(tok_p))
                        if text_len:
                            ct = chars.get(text_len)
                            if ct is None:
                                ct = chars[text_len] = ctypes.c_char * text_len
                            texts.setdefault((rid, idx), []).append(ct.from_address(text_p).raw)
                        continue
                s = so.seqs[i]
                ro = reqs.get(s.req_id)
                if ro is not None and self._take(ro, s, texts):
                    if s.sample_index in pending[s.req_id]:
                        left -= 1
                    pending[s.req_id].discard(s.sample_index)
                    if not pending[s.req_id]:
                        ro.finished = True
                        ro.metrics.finished_time = time.time()
        for (rid, idx), parts in texts.items():
            reqs[rid].outputs[idx].text = b"".join(parts).decode("utf-8", "replace")

    @staticmethod
    def _take(ro, s, texts):
        """One sequence's step output `s` (the ctypes structure) into `ro`; True when that sample ended."""
        co = ro.outputs[s.sample_index]
        if ro.prompt_token_ids is None and s.prompt_token_ids:
            ro.prompt_token_ids = s.prompt_token_ids[:s.n_prompt_tokens]
        ro.num_cached_tokens = s.n_cached_tokens
        if s.prompt_logprobs and getattr(ro, "_score_from", None) is not None:
            a = ro._score_from  # loglikelihood: the sum from there, and whether all are rank 1
            ro._score = (sum(s.prompt_logprobs[i] for i in range(a, s.n_prompt_tokens)),
                         all(s.prompt_ranks[i] == 1 for i in range(a, s.n_prompt_tokens)))
        elif s.prompt_logprobs:
            ro.prompt_logprobs = _prompt_logprobs(s)
        if s.n_new_tokens:
            co.token_ids.extend(s.new_tokens[:s.n_new_tokens])
        if s.new_text_len:
            texts.setdefault((s.req_id, s.sample_index), []).append(ctypes.string_at(s.new_text, s.new_text_len))
        if s.new_logprobs:
            if co.logprobs is None:
                co.logprobs, co.cumulative_logprob = [], 0.0
            for t in range(s.n_new_tokens):
                d = {}
                for k in range(s.n_top):
                    tl = s.top[t * s.n_top + k]
                    if tl.id >= 0:
                        d[tl.id] = Logprob(tl.logprob, rank=k + 1)
                chosen = s.new_tokens[t]
                if chosen not in d:
                    d[chosen] = Logprob(s.new_logprobs[t])
                co.logprobs.append(d)
                co.cumulative_logprob += s.new_logprobs[t]
        if not s.finish_reason:
            return False
        co.finish_reason = _lib.FINISH_REASONS.get(s.finish_reason)
        if s.stop_token >= 0:
            co.stop_reason = s.stop_token
        if s.error:
            co.error = s.error.decode("utf-8", "replace")
        ro.metrics.time_to_first_token = s.time_to_first_token if s.time_to_first_token >= 0 else None
        ro.metrics.time_per_output_token = s.time_per_output_token
        return True

    def get_default_sampling_params(self):
        """SamplingParams from the model's generation_config.json (temperature, top_p, top_k,
        max_new_tokens), as vLLM does; used when generate/chat get no sampling_params."""
        kw = {}
        try:
            with open(os.path.join(self.model_dir, "generation_config.json"), encoding="utf-8") as f:
                g = json.load(f)
        except (OSError, ValueError):
            g = {}
        if g.get("do_sample") is False:
            kw["temperature"] = 0.0
        elif isinstance(g.get("temperature"), (int, float)):
            kw["temperature"] = float(g["temperature"])
        if isinstance(g.get("top_p"), (int, float)):
            kw["top_p"] = float(g["top_p"])
        if isinstance(g.get("top_k"), int):
            kw["top_k"] = g["top_k"]
        if isinstance(g.get("max_new_tokens"), int):
            kw["max_tokens"] = g["max_new_tokens"]
        return SamplingParams(**kw)

    def generate(self, prompts, sampling_params=None, use_tqdm=False):
        """prompts: a string, {'prompt_token_ids': [...]}, or a list of these. sampling_params: one
        SamplingParams for all, or a list (one per prompt). Returns RequestOutputs in prompt order."""
        single = isinstance(prompts, (str, dict))
        plist = [prompts] if single else list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        sps = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(plist)
        if len(sps) != len(plist):
            raise ValueError(f"{len(plist)} prompts but {len(sps)} sampling params")
        return self._generate(plist, sps, rendered=False)

    def _generate(self, plist, sps, rendered):
        order, reqs = [], {}
        try:
            for pr, sp in zip(plist, sps):
                rid, out = self._add(pr, sp, rendered)
                order.append(rid)
                reqs[rid] = out
            self._run(reqs)
        except BaseException:
            for rid in order:  # leave the engine clean for the next call
                self._L.di_engine_abort(self._engine, rid)
            while self._L.di_engine_has_unfinished(self._engine):
                step = ctypes.POINTER(_lib.StepOutput)()
                if self._L.di_engine_step(self._engine, ctypes.byref(step)) != 0:
                    break
            raise
        return [reqs[rid] for rid in order]

    def _chat_template(self):
        if self._template is None:
            t = ctypes.c_void_p()
            _lib.check(self._L.di_chat_template_load(self.model_dir.encode(), ctypes.byref(t)),
                       "loading the chat template")
            self._template = t
        return self._template

    def render_chat(self, messages, add_generation_prompt=True, chat_template_kwargs=None):
        """The conversation rendered with the model's chat template (a string)."""
        conv = {"messages": messages, **(chat_template_kwargs or {})}
        out = ctypes.c_void_p()
        _lib.check(self._L.di_chat_template_render_json(self._chat_template(), json.dumps(conv).encode("utf-8"),
                                                        1 if add_generation_prompt else 0, ctypes.byref(out)),
                   "rendering the chat template")
        try:
            return ctypes.string_at(out.value).decode("utf-8")
        finally:
            self._L.di_string_free(out)

    def chat(self, messages, sampling_params=None, use_tqdm=False, add_generation_prompt=True,
             chat_template_kwargs=None):
        """messages: one conversation (a list of {'role', 'content'}) or a list of conversations."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        texts = [self.render_chat(c, add_generation_prompt, chat_template_kwargs) for c in convs]
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        sps = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(texts)
        return self._generate(texts, sps, rendered=True)

    # ---- scoring (lm-evaluation-harness style; see scoring.py for the tokenization rules) --------
    @property
    def has_tokenizer(self):
        """Whether the model folder has a tokenizer.json: without one, prompts are token ids
        ({"prompt_token_ids": [...]}) and outputs carry token_ids with empty text."""
        return os.path.exists(os.path.join(self.model_dir, "tokenizer.json"))

    def _tokenizer(self):
        if not self._model:
            raise RuntimeError("LLM: used after close()")
        if self._tok is None:
            t = ctypes.c_void_p()
            _lib.check(self._L.di_tokenizer_load(self.model_dir.encode(), ctypes.byref(t)), "loading the tokenizer")
            self._tok = t
        return self._tok

    def encode(self, text, add_special_tokens=False):
        """Token ids of `text` (Hugging Face encode; special tokens such as BOS only when asked)."""
        b = text.encode("utf-8")
        ids, n = _lib.c_int32_p(), ctypes.c_size_t()
        _lib.check(self._L.di_tokenizer_encode(self._tokenizer(), b, len(b), int(bool(add_special_tokens)),
                                               ctypes.byref(ids), ctypes.byref(n)), "encoding")
        try:
            return ids[:n.value]
        finally:
            _lib.free(ids)

    def _prefix_token(self):
        """BOS, else EOS (lm-evaluation-harness's prefix_token_id), else None."""
        t = self._tokenizer()
        bos = self._L.di_tokenizer_bos_id(t)
        if bos >= 0:
            return bos
        eos = self._L.di_tokenizer_eos_id(t)
        return eos if eos >= 0 else None

    def _score_sequences(self, seqs):
        """[(ids, start)] -> [(logprob, is_greedy)]: each sequence as a score-only engine request whose
        prompt logprobs start at `start` (di_request_params.prompt_logprobs_from), all queued at once:
        sequences that share a context compute it once (the scheduler has a later one wait for the
        context blocks another is computing, then take them from the prefix cache). is_greedy: every continuation token has rank 1 (no id more likely; an id with an exactly equal
        logit counts as a tie in its favour here, where greedy sampling takes the lowest id)."""
        if self._L.di_engine_has_unfinished(self._engine):
            raise RuntimeError("loglikelihood: the engine has unfinished requests")
        sp = SamplingParams(max_tokens=0, prompt_logprobs=0, temperature=0.0)
        for ids, start in seqs:
            if not 1 <= start <= len(ids):
                raise ValueError(f"loglikelihood: continuation start {start} outside the {len(ids)} tokens")
        reqs, order = {}, []
        for ids, start in seqs:
            rid, out = self._add({"prompt_token_ids": ids}, sp, prompt_logprobs_from=start)
            out._score_from, out._score = start, None
            reqs[rid] = out
            order.append(rid)
        self._run(reqs)
        res = []
        for rid in order:
            o = reqs[rid]
            if o.outputs[0].finish_reason == "error" or o._score is None:
                raise RuntimeError(f"loglikelihood: {o.outputs[0].error or 'no prompt logprobs came back'}")
            res.append(o._score)
        return res

    def loglikelihood(self, requests, add_bos=None):
        """requests: [(context, continuation)] strings. Returns [(logprob, is_greedy)]: the summed log
        probability of the continuation's tokens given the context, and whether greedy decoding would
        have produced exactly them. Tokenization as lm-evaluation-harness (see deepinfer.scoring):
        the continuation's tokens are those of encode(context + continuation) after the context's
        tokens (encoded separately if that split fails). add_bos: put BOS before the context (None:
        as the tokenizer's add_bos_token says)."""
        if add_bos is None:
            add_bos = bool(self._L.di_tokenizer_add_bos(self._tokenizer()))
        prefix_tok = self._prefix_token()
        max_len = self._L.di_model_max_context(self._model)
        seqs = []
        # the choices of an item come together and share their context: a small cache encodes it once
        cached = functools.lru_cache(maxsize=16)(lambda text: tuple(self.encode(text)))

        def encode(text):
            return list(cached(text))

        for req in requests:
            context, continuation = req
            prefix = [prefix_tok] if prefix_tok is not None and (add_bos or not context) else []
            if not prefix and not context:
                raise ValueError("loglikelihood: empty context and the tokenizer has neither BOS nor EOS")
            ids, start = scoring.encode_pair(encode, context, continuation, prefix)
            seqs.append(scoring.truncate_left(ids, start, max_len))
        return self._score_sequences(seqs)

    def loglikelihood_rolling(self, texts, max_length=None):
        """texts: strings. Returns [logprob]: each text's total log probability, every token predicted
        once in disjoint windows of at most max_length tokens (default: the model's context - 1), the
        first after the prefix token (BOS, else EOS), as lm-evaluation-harness's loglikelihood_rolling.
        The number of tokens scored is len(llm.encode(text))."""
        ctx = self._L.di_model_max_context(self._model)
        max_length = ctx - 1 if max_length is None else int(max_length)
        if not 1 <= max_length < ctx:
            raise ValueError(f"max_length must be in [1, {ctx - 1}] (the model's context is {ctx}), got {max_length}")
        prefix_tok = self._prefix_token()
        if prefix_tok is None:
            raise ValueError("loglikelihood_rolling: the tokenizer has neither BOS nor EOS to start a text with")
        seqs, owner = [], []
        for i, text in enumerate(texts):
            for w in scoring.rolling_windows(self.encode(text), prefix_tok, max_length):
                seqs.append(w)
                owner.append(i)
        totals = [0.0] * len(texts)
        for i, (lp, _) in zip(owner, self._score_sequences(seqs)):
            totals[i] += lp
        return totals

    # ---- statistics ----------------------------------------------------------------------------
    def get_stats(self):
        """Engine statistics: KV blocks, prefix-cache hit rate, token counts and rates, host time."""
        s = _lib.EngineStats()
        self._L.di_engine_get_stats(self._engine, ctypes.byref(s))
        return {name: getattr(s, name) for name, _ in _lib.EngineStats._fields_}

    def check(self):
        """Verifies the KV block accounting; raises on a leaked or double-freed block."""
        _lib.check(self._L.di_engine_check(self._engine), "engine check")
