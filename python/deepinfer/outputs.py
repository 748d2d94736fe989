"""Results shaped like vLLM's RequestOutput / CompletionOutput."""


class Logprob:
    def __init__(self, logprob, rank=None, decoded_token=None):
        self.logprob = logprob
        self.rank = rank
        self.decoded_token = decoded_token

    def __repr__(self):
        return f"Logprob(logprob={self.logprob!r}, rank={self.rank!r})"


class CompletionOutput:
    def __init__(self, index):
        self.index = index
        self.text = ""
        self.token_ids = []
        self.cumulative_logprob = None
        self.logprobs = None          # list (one per token) of {token_id: Logprob}
        self.finish_reason = None     # "stop", "length", "abort", "error"
        self.stop_reason = None       # the stop token id (int) when it stopped on one
        self.error = None

    def finished(self):
        return self.finish_reason is not None

    def __repr__(self):
        return (f"CompletionOutput(index={self.index}, text={self.text!r}, token_ids={self.token_ids!r}, "
                f"finish_reason={self.finish_reason!r})")


class RequestMetrics:
    def __init__(self):
        self.arrival_time = None
        self.time_to_first_token = None   # seconds
        self.time_per_output_token = None  # seconds (mean over the tokens after the first)
        self.finished_time = None

    def __repr__(self):
        return (f"RequestMetrics(time_to_first_token={self.time_to_first_token!r}, "
                f"time_per_output_token={self.time_per_output_token!r})")


class RequestOutput:
    def __init__(self, request_id, prompt, n):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = None
        self.prompt_logprobs = None   # prompt_logprobs=k: [None, {token_id: Logprob}, ...] per prompt token
        self.outputs = [CompletionOutput(i) for i in range(n)]
        self.finished = False
        self.num_cached_tokens = 0
        self.metrics = RequestMetrics()

    def __repr__(self):
        return (f"RequestOutput(request_id={self.request_id!r}, prompt={self.prompt!r}, "
                f"prompt_token_ids={self.prompt_token_ids!r}, outputs={self.outputs!r}, finished={self.finished})")
