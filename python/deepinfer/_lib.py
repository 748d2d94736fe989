"""ctypes mirror of the engine section of include/deepinfer.h, and the search for libdeepinfer.so.

The library is found through $DEEPINFER_LIB, else next to this package, else in the repository's
build folders (build/, then build-*/), else the system's search path. Struct layouts are checked
against the library's own sizeof (di_abi_sizeof) when it is loaded.
"""
import ctypes
import ctypes.util
import glob
import os

c_int32_p = ctypes.POINTER(ctypes.c_int32)
c_float_p = ctypes.POINTER(ctypes.c_float)


class ModelOptions(ctypes.Structure):
    _fields_ = [("load_format", ctypes.c_char_p), ("accelerator", ctypes.c_char_p), ("threads", ctypes.c_int),
                ("dummy_seed", ctypes.c_uint64), ("quiet", ctypes.c_int), ("batch_invariant", ctypes.c_int),
                ("quantization", ctypes.c_char_p), ("kv_cache_dtype", ctypes.c_char_p)]


class EngineOptions(ctypes.Structure):
    _fields_ = [("max_num_seqs", ctypes.c_int), ("max_num_batched_tokens", ctypes.c_int),
                ("max_model_len", ctypes.c_int), ("enable_prefix_caching", ctypes.c_int),
                ("enable_chunked_prefill", ctypes.c_int), ("async_scheduling", ctypes.c_int),
                ("kv_cache_memory_bytes", ctypes.c_int64), ("num_kv_blocks", ctypes.c_int64),
                ("seed", ctypes.c_uint64), ("gpu_memory_utilization", ctypes.c_float),
                ("swa_bounded_replay", ctypes.c_int)]


class RequestParams(ctypes.Structure):
    _fields_ = [("prompt_ids", c_int32_p), ("n_prompt_ids", ctypes.c_int), ("prompt", ctypes.c_char_p),
                ("prompt_is_rendered", ctypes.c_int), ("n", ctypes.c_int), ("temperature", ctypes.c_float),
                ("top_p", ctypes.c_float), ("top_k", ctypes.c_int), ("min_p", ctypes.c_float),
                ("repetition_penalty", ctypes.c_float), ("presence_penalty", ctypes.c_float),
                ("frequency_penalty", ctypes.c_float), ("logit_bias_ids", c_int32_p),
                ("logit_bias_values", c_float_p), ("n_logit_bias", ctypes.c_int), ("has_seed", ctypes.c_int),
                ("seed", ctypes.c_uint64), ("logprobs", ctypes.c_int), ("prompt_logprobs", ctypes.c_int),
                ("prompt_logprobs_from", ctypes.c_int), ("max_tokens", ctypes.c_int),
                ("min_tokens", ctypes.c_int), ("stop_token_ids", c_int32_p), ("n_stop_token_ids", ctypes.c_int),
                ("stop", ctypes.POINTER(ctypes.c_char_p)), ("n_stop", ctypes.c_int), ("ignore_eos", ctypes.c_int),
                ("include_stop_str_in_output", ctypes.c_int), ("skip_special_tokens", ctypes.c_int),
                ("json_schema", ctypes.c_char_p), ("regex", ctypes.c_char_p), ("grammar", ctypes.c_char_p),
                ("json_object", ctypes.c_int), ("grammar_syntax", ctypes.c_int), ("json_strict", ctypes.c_int),
                ("max_digits", ctypes.c_int), ("max_string_length", ctypes.c_int),
                ("item_separator", ctypes.c_char_p), ("key_separator", ctypes.c_char_p),
                ("max_whitespace", ctypes.c_int), ("indent", ctypes.c_int)]


class TokenLogprob(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int32), ("logprob", ctypes.c_float)]


class SeqOutput(ctypes.Structure):
    _fields_ = [("req_id", ctypes.c_uint64), ("sample_index", ctypes.c_int), ("n_new_tokens", ctypes.c_int),
                ("new_tokens", c_int32_p), ("new_text", ctypes.c_void_p), ("new_text_len", ctypes.c_size_t),
                ("new_logprobs", c_float_p), ("n_top", ctypes.c_int), ("top", ctypes.POINTER(TokenLogprob)),
                ("finish_reason", ctypes.c_int), ("error", ctypes.c_char_p), ("stop_token", ctypes.c_int32),
                ("n_prompt_tokens", ctypes.c_int), ("n_cached_tokens", ctypes.c_int),
                ("n_output_tokens", ctypes.c_int), ("prompt_token_ids", c_int32_p),
                ("time_to_first_token", ctypes.c_double), ("time_per_output_token", ctypes.c_double),
                ("prompt_logprobs", c_float_p), ("n_prompt_top", ctypes.c_int),
                ("prompt_top", ctypes.POINTER(TokenLogprob)), ("prompt_ranks", c_int32_p)]


class StepOutput(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int), ("seqs", ctypes.POINTER(SeqOutput))]


# The fields LLM._run reads from every sequence of every step, in their order in memory.
_READ_FIELDS = ("req_id", "sample_index", "n_new_tokens", "new_tokens", "new_text", "new_text_len", "new_logprobs",
                "finish_reason", "n_cached_tokens", "prompt_token_ids", "prompt_logprobs")


def _seq_output_format():
    """A struct format that reads _READ_FIELDS (in that order) from one di_seq_output, the other bytes
    skipped; pointers as integers (0 = NULL). None where a field's size has no code here."""
    import struct
    codes = {1: "B", 4: "I", 8: "Q"}  # unsigned; signed fields take the lower-case code
    spots = []
    for n in _READ_FIELDS:
        f, typ = getattr(SeqOutput, n), dict(SeqOutput._fields_)[n]
        pointer = hasattr(typ, "contents") or typ in (ctypes.c_void_p, ctypes.c_char_p)
        unsigned = pointer or typ in (ctypes.c_uint64, ctypes.c_size_t)
        code = codes.get(f.size)
        if code is None or typ is ctypes.c_double:
            return None
        spots.append((f.offset, f.size, code if unsigned else code.lower()))
    order = sorted(range(len(spots)), key=lambda k: spots[k][0])
    if order != list(range(len(spots))):
        return None  # the tuple's order must be the fields' order in memory
    fmt, at = "=", 0
    for off, size, code in spots:
        if off < at:
            return None
        fmt += (f"{off - at}x" if off > at else "") + code
        at = off + size
    size = ctypes.sizeof(SeqOutput)
    fmt += f"{size - at}x" if size > at else ""
    return fmt if struct.calcsize(fmt) == size else None


def seq_output_reader():
    """f(step_output) -> an iterator of one tuple per sequence with _READ_FIELDS' values, read from the
    C array by one struct.iter_unpack; None when the layout cannot be described as a struct format."""
    import struct
    fmt = _seq_output_format()
    if fmt is None:
        return None
    unpack, size = struct.Struct(fmt).iter_unpack, ctypes.sizeof(SeqOutput)

    def read(so):
        return unpack(ctypes.string_at(ctypes.cast(so.seqs, ctypes.c_void_p).value, so.n * size))
    return read


class EngineStats(ctypes.Structure):
    _fields_ = [("kv_blocks_total", ctypes.c_int64), ("kv_blocks_used", ctypes.c_int64),
                ("kv_blocks_free", ctypes.c_int64), ("kv_blocks_cached", ctypes.c_int64),
                ("prefix_cache_hit_rate", ctypes.c_double), ("prefix_cache_hit_tokens", ctypes.c_int64),
                ("prefix_cache_query_tokens", ctypes.c_int64), ("n_running", ctypes.c_int),
                ("n_waiting", ctypes.c_int), ("steps", ctypes.c_int64), ("prompt_tokens", ctypes.c_int64),
                ("generated_tokens", ctypes.c_int64), ("preemptions", ctypes.c_int64),
                ("prompt_tokens_per_s", ctypes.c_double), ("generation_tokens_per_s", ctypes.c_double),
                ("host_time_s", ctypes.c_double), ("hidden_host_time_s", ctypes.c_double),
                ("backend_wait_s", ctypes.c_double), ("prefix_waits", ctypes.c_int64)]


FINISH_REASONS = {0: None, 1: "stop", 2: "length", 3: "abort", 4: "error"}

_STRUCTS = {"di_model_options": ModelOptions, "di_engine_options": EngineOptions,
            "di_request_params": RequestParams, "di_seq_output": SeqOutput, "di_step_output": StepOutput,
            "di_engine_stats": EngineStats, "di_token_logprob": TokenLogprob}

_lib = None


def _repo_root():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def checkout_builds(name, sibling_builds=True):
    """Where a source checkout's builds hold the file `name`, in the order to try: build/, then
    build*/ (build-cuda/, build-asan/, ... when sibling_builds), then build/<wheel tag>/ (what
    `pip install -e .` builds: pyproject.toml's build-dir)."""
    root = _repo_root()
    paths = [os.path.join(root, "build", name)]
    if sibling_builds:
        paths += sorted(glob.glob(os.path.join(root, "build*", name)))
    return paths + sorted(glob.glob(os.path.join(root, "build", "*", name)))


def _candidates():
    env = os.environ.get("DEEPINFER_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    c = [os.path.join(here, "libdeepinfer.so")] + checkout_builds("libdeepinfer.so")
    found = ctypes.util.find_library("deepinfer")
    if found:
        c.append(found)
    return c


def _declare(lib):
    P = ctypes.c_void_p
    sigs = {
        "di_last_error": (ctypes.c_char_p, []),
        "di_status_str": (ctypes.c_char_p, [ctypes.c_int]),
        "di_model_options_default": (None, [ctypes.POINTER(ModelOptions)]),
        "di_model_load": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ModelOptions), ctypes.POINTER(P)]),
        "di_model_free": (None, [P]),
        "di_model_vocab_size": (ctypes.c_int, [P]),
        "di_model_max_context": (ctypes.c_int, [P]),
        "di_model_dir": (ctypes.c_char_p, [P]),
        "di_engine_options_default": (None, [ctypes.POINTER(EngineOptions)]),
        "di_request_params_default": (None, [ctypes.POINTER(RequestParams)]),
        "di_engine_create": (ctypes.c_int, [P, ctypes.POINTER(EngineOptions), ctypes.POINTER(P)]),
        "di_engine_free": (None, [P]),
        "di_engine_kv_summary": (ctypes.c_char_p, [P]),
        "di_engine_add_request": (ctypes.c_int, [P, ctypes.POINTER(RequestParams), ctypes.POINTER(ctypes.c_uint64)]),
        "di_engine_step": (ctypes.c_int, [P, ctypes.POINTER(ctypes.POINTER(StepOutput))]),
        "di_engine_abort": (ctypes.c_int, [P, ctypes.c_uint64]),
        "di_engine_has_unfinished": (ctypes.c_int, [P]),
        "di_engine_get_stats": (None, [P, ctypes.POINTER(EngineStats)]),
        "di_engine_check": (ctypes.c_int, [P]),
        "di_abi_sizeof": (ctypes.c_size_t, [ctypes.c_char_p]),
        "di_chat_template_load": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(P)]),
        "di_chat_template_free": (None, [P]),
        "di_chat_template_render_json": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]),
        "di_string_free": (None, [ctypes.c_void_p]),
        # scoring (LLM.loglikelihood) and the tokenizer it encodes with
        "di_model_score": (ctypes.c_int, [P, c_int32_p, ctypes.c_int, c_float_p]),
        "di_model_loglikelihood": (ctypes.c_int, [P, c_int32_p, ctypes.c_int, ctypes.c_int, c_float_p,
                                                  ctypes.POINTER(ctypes.c_int)]),
        "di_model_loglikelihood_batch": (ctypes.c_int, [P, ctypes.c_int, ctypes.POINTER(c_int32_p),
                                                        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                                                        c_float_p, ctypes.POINTER(ctypes.c_int)]),
        "di_tokenizer_load": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(P)]),
        "di_tokenizer_free": (None, [P]),
        "di_tokenizer_encode": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int,
                                               ctypes.POINTER(c_int32_p), ctypes.POINTER(ctypes.c_size_t)]),
        "di_tokenizer_bos_id": (ctypes.c_int32, [P]),
        "di_tokenizer_eos_id": (ctypes.c_int32, [P]),
        "di_tokenizer_add_bos": (ctypes.c_int, [P]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


_libc_free = None


def free(ptr):
    """free() of a buffer the library malloc'd for the caller (di_tokenizer_encode's ids)."""
    global _libc_free
    if _libc_free is None:
        _libc_free = ctypes.CDLL(None).free
        _libc_free.restype = None
        _libc_free.argtypes = [ctypes.c_void_p]
    _libc_free(ptr)


def lib():
    """The loaded library (loaded once)."""
    global _lib
    if _lib is not None:
        return _lib
    errors = []
    for path in _candidates():
        if not os.path.exists(path) and os.sep in path:
            errors.append(f"{path}: not found")
            continue
        try:
            L = ctypes.CDLL(path)
            _declare(L)
        except (OSError, AttributeError) as exc:
            errors.append(f"{path}: {exc}")
            continue
        for cname, py in _STRUCTS.items():
            size = L.di_abi_sizeof(cname.encode())
            if size != ctypes.sizeof(py):
                raise ImportError(f"deepinfer: {path}: struct {cname} is {size} bytes in the library but "
                                  f"{ctypes.sizeof(py)} in the Python binding (rebuild or update the package)")
        _lib = L
        return L
    raise ImportError("deepinfer: libdeepinfer.so not found (set DEEPINFER_LIB or build with ./build.sh): "
                      + "; ".join(errors))


class DeepInferError(RuntimeError):
    """A failure reported by the library; the message is di_last_error()."""


def check(status, what):
    if status != 0:
        L = lib()
        msg = L.di_last_error().decode("utf-8", "replace")
        kind = L.di_status_str(status).decode()
        raise DeepInferError(f"{what}: {msg} ({kind})")
