"""The model under evaluation, one interface for both ways to reach it:

- InProcess: the deepinfer Python binding (`--model DIR`), conversations rendered with the model's
  chat template; one SamplingParams(n=samples) request per item, seeded by the item's index, so a
  resumed run draws the same samples.
- Endpoint: any OpenAI-compatible server (`--base-url URL`, e.g. http://127.0.0.1:8000/v1), the
  server applies its own chat template; the model name sent is --served-model-name, else the first
  id of GET /models; /chat/completions with n=1 per sample (not every server
  honours n), sent from `--concurrency` threads; a server that separates reasoning
  (message.reasoning_content) has it kept with the reply, the judge sees only `content`.

complete(batch) takes [(index, messages)] and returns, per item, a list of samples
{"response", "finish_reason", "completion_tokens"}.
"""
import concurrent.futures
import json
import os
import urllib.request

import http_client
from evalutil import ROOT, import_deepinfer  # noqa: F401 (ROOT is used by judged_eval)


class InProcess:
    def __init__(self, args):
        self.di = import_deepinfer()
        kw = {}
        if args.num_kv_blocks:
            kw["num_kv_blocks"] = args.num_kv_blocks
        self.llm = self.di.LLM(args.model, threads=args.threads, accelerator=args.accelerator,
                               load_format=args.load_format, max_num_seqs=args.max_num_seqs, **kw)
        self.args = args
        self.name = self.llm.model_dir

    def describe(self):
        return {"kind": "in-process", "model": self.llm.model_dir, "accelerator": self.args.accelerator or "cpu"}

    def complete(self, batch):
        a = self.args
        params = [self.di.SamplingParams(n=a.samples, temperature=a.temperature, top_p=a.top_p,
                                         seed=a.seed * 1000003 + idx, max_tokens=a.max_tokens)
                  for idx, _ in batch]
        outs = self.llm.chat([m for _, m in batch], params)
        result = []
        for o in outs:
            samples = []
            for c in o.outputs:
                if c.finish_reason == "error":
                    raise RuntimeError(f"the model failed on a request: {c.error}")
                samples.append({"response": c.text, "finish_reason": c.finish_reason,
                                "completion_tokens": len(c.token_ids)})
            result.append(samples)
        return result

    def close(self):
        self.llm.close()


def served_model(base, api_key):
    """The first model id of GET {base}/models, else "default" (servers that do not list)."""
    req = urllib.request.Request(base + "/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return "default"


class Endpoint:
    def __init__(self, args):
        base = args.base_url.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else base + "/chat/completions"
        self.args = args
        key = os.environ.get("EVAL_API_KEY", "")
        self.served = args.served_model_name or served_model(self.url[:-len("/chat/completions")], key)
        self.http = http_client.JSONPoster(self.url, key, what="model server",
                                           retries=args.retries, backoff=1.0, timeout=args.request_timeout)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.concurrency))
        self.name = f"{self.served} @ {base}"

    def describe(self):
        return {"kind": "endpoint", "base_url": self.args.base_url, "model": self.served}

    def _one(self, idx, k, messages):
        a = self.args
        body = {"model": self.served, "messages": messages, "temperature": a.temperature, "top_p": a.top_p,
                "seed": a.seed * 1000003 + idx * 1009 + k}
        if a.max_tokens:
            body["max_tokens"] = a.max_tokens
        try:
            r = self.http.post(body)
            ch = r["choices"][0]
            msg = ch.get("message") or {}
        except http_client.HTTPFailure as e:
            raise RuntimeError(str(e)) from None
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"model server {self.url}: no choices[0].message in the reply: {str(r)[:200]}") from None
        text = msg.get("content") or ""
        if msg.get("reasoning_content"):
            text = f"<think>{msg['reasoning_content']}</think>{text}"
        return {"response": text, "finish_reason": ch.get("finish_reason"),
                "completion_tokens": (r.get("usage") or {}).get("completion_tokens")}

    def complete(self, batch):
        futs = [[self.pool.submit(self._one, idx, k, m) for k in range(self.args.samples)] for idx, m in batch]
        return [[f.result() for f in row] for row in futs]

    def close(self):
        self.pool.shutdown(wait=True)


def open_model(args):
    return Endpoint(args) if args.base_url else InProcess(args)
