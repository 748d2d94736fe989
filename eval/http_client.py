"""POSTing JSON to an OpenAI-compatible service (the LLM judge, or the model behind --base-url) with a
rate limit and retries (standard library only).

Retried with exponential backoff (backoff, 2*backoff, ...): connection errors, timeouts, and HTTP
408/409/429/5xx, honouring a numeric Retry-After up to 60 s. Any other HTTP status fails at once.
HTTPFailure names the address and the last problem; the rate limit spaces calls 1/rps apart over all
threads sharing the poster.
"""
import json
import threading
import time
import urllib.error
import urllib.request

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class HTTPFailure(Exception):
    pass


class RateLimit:
    """At most `rps` calls per second over all threads (<= 0: no limit)."""

    def __init__(self, rps):
        self.interval = 1.0 / rps if rps > 0 else 0.0
        self.next = 0.0
        self.lock = threading.Lock()

    def wait(self):
        with self.lock:
            now = time.monotonic()
            at = max(now, self.next)
            self.next = at + self.interval
        if at > now:
            time.sleep(at - now)


class JSONPoster:
    def __init__(self, url, api_key="", what="server", retries=5, backoff=1.0, timeout=120.0, rps=0.0):
        self.url, self.api_key, self.what = url, api_key, what
        self.retries, self.backoff, self.timeout = retries, backoff, timeout
        self.limit = RateLimit(rps)
        self.calls = 0

    def post(self, body):
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = None
        for attempt in range(self.retries + 1):
            if attempt:
                wait = self.backoff * (2 ** (attempt - 1))
                ra = last.headers.get("Retry-After") if isinstance(last, urllib.error.HTTPError) and last.headers else None
                if ra and ra.strip().isdigit():
                    wait = max(wait, min(60.0, float(ra)))
                time.sleep(wait)
            self.limit.wait()
            self.calls += 1
            req = urllib.request.Request(self.url, data=data, method="POST", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    raw = r.read()
            except urllib.error.HTTPError as e:
                last = e
                if e.code not in RETRY_STATUS:
                    detail = e.read()[:300].decode("utf-8", "replace") if e.fp else ""
                    raise HTTPFailure(f"{self.what} {self.url}: HTTP {e.code} {e.reason}: {detail}") from None
                continue
            except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out
                last = e
                continue
            try:
                return json.loads(raw.decode("utf-8"))
            except ValueError as e:
                raise HTTPFailure(f"{self.what} {self.url}: the reply is not JSON: {e}") from None
        what = f"HTTP {last.code}" if isinstance(last, urllib.error.HTTPError) else \
            str(getattr(last, "reason", None) or last)
        raise HTTPFailure(f"{self.what} {self.url} unreachable after {self.retries + 1} attempts "
                          f"(retried with backoff): {what}")
