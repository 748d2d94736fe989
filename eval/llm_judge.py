"""The LLM judge: an OpenAI-compatible chat-completions service asked whether a reply matches the
reference answer, with Humanity's Last Exam's judge prompt.

Configured by EVAL_JUDGE_URL (the API base, e.g. https://host/v1, or the full .../chat/completions
address), EVAL_JUDGE_MODEL and EVAL_JUDGE_API_KEY (sent as a Bearer token). The verdict is read from a
JSON object {"extracted_final_answer", "reasoning", "correct": "yes"|"no", "confidence"} asked for
through response_format json_schema (HLE's own judge asks the same fields through structured outputs);
a judge that ignores the schema may answer in prose: a reply whose first word is yes or no, or whose
"correct:" line says so, is accepted too.

Calls are rate limited (EVAL_JUDGE_RPS requests per second across threads, default 5) and retried with
exponential backoff on connection errors, timeouts, 408/409/429 and 5xx (EVAL_JUDGE_RETRIES retries,
default 5, first wait EVAL_JUDGE_BACKOFF seconds, default 1, doubling; a Retry-After header is
honoured up to 60 s). After the last retry, or on another HTTP error, JudgeError names the address
and the last problem.
"""
import json
import os
import re

import http_client

ENV_VARS = ("EVAL_JUDGE_URL", "EVAL_JUDGE_MODEL", "EVAL_JUDGE_API_KEY")

# Humanity's Last Exam's judge prompt (hle_eval/run_judge_results.py), verbatim.
JUDGE_PROMPT = """Judge whether the following [response] to [question] is correct or not based on the precise and unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. Put the extracted answer as 'None' if there is no exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: Explain why the extracted_final_answer is correct or incorrect based on [correct_answer], focusing only on if there are meaningful differences between [correct_answer] and the extracted_final_answer. Do not comment on any background to the problem, do not attempt to solve the problem, do not argue for any answer different than [correct_answer], focus only on whether the answers match.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or is within a small margin of error for numerical problems. Answer 'no' otherwise, i.e. if there if there is any inconsistency, ambiguity, non-equivalency, or if the extracted answer is incorrect.


confidence: The extracted confidence score between 0|\\%| and 100|\\%| from [response]. Put 100 if there is no confidence score available."""

VERDICT_SCHEMA = {
    "type": "object",
    "properties": {
        "extracted_final_answer": {"type": "string"},
        "reasoning": {"type": "string"},
        "correct": {"type": "string", "enum": ["yes", "no"]},
        "confidence": {"type": "integer"},
    },
    "required": ["extracted_final_answer", "reasoning", "correct", "confidence"],
    "additionalProperties": False,
}


class JudgeError(Exception):
    """The judge could not be used (not configured, unreachable after retries, or a bad reply)."""


def configured():
    return all(os.environ.get(v) for v in ENV_VARS)


def missing_message(what):
    missing = [v for v in ENV_VARS if not os.environ.get(v)]
    return (f"{what} needs the LLM judge: set {', '.join(ENV_VARS)} (an OpenAI-compatible chat-completions "
            f"service, its model name and API key); not set: {', '.join(missing)}")


def parse_verdict(content):
    """(correct: bool, fields: dict) from the judge's reply; JudgeError when it says neither yes nor no."""
    text = (content or "").strip()
    fields = None
    m = re.search(r"\{.*\}", text, re.S)
    if m:
        try:
            fields = json.loads(m.group(0))
        except ValueError:
            fields = None
    if isinstance(fields, dict) and str(fields.get("correct", "")).strip().lower() in ("yes", "no"):
        return str(fields["correct"]).strip().lower() == "yes", fields
    first = re.match(r"[\s\"'*`]*(yes|no)\b", text, re.I)
    line = re.search(r"^\W*correct\W*:\s*\W*(yes|no)\b", text, re.I | re.M)
    word = first or line
    if word:
        return word.group(1).lower() == "yes", {"raw": text[:2000]}
    raise JudgeError(f"the judge's reply says neither yes nor no: {text[:200]!r}")


class LLMJudge:
    def __init__(self, url=None, model=None, api_key=None, retries=None, backoff=None, rps=None, timeout=None):
        env = os.environ
        self.url = (url or env.get("EVAL_JUDGE_URL", "")).rstrip("/")
        if not self.url.endswith("/chat/completions"):
            self.url += "/chat/completions"
        self.model = model or env.get("EVAL_JUDGE_MODEL", "")
        self.api_key = api_key or env.get("EVAL_JUDGE_API_KEY", "")
        self.http = http_client.JSONPoster(
            self.url, self.api_key, what="judge",
            retries=int(retries if retries is not None else env.get("EVAL_JUDGE_RETRIES", 5)),
            backoff=float(backoff if backoff is not None else env.get("EVAL_JUDGE_BACKOFF", 1.0)),
            timeout=float(timeout if timeout is not None else env.get("EVAL_JUDGE_TIMEOUT", 120)),
            rps=float(rps if rps is not None else env.get("EVAL_JUDGE_RPS", 5)))

    def describe(self):
        return {"kind": "llm", "url": self.url, "model": self.model}

    def judge(self, question, response, correct_answer):
        """(correct: bool, fields: dict) for one reply."""
        prompt = JUDGE_PROMPT.format(question=question, response=response, correct_answer=correct_answer)
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                "max_tokens": 4096,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "judgement", "strict": True, "schema": VERDICT_SCHEMA}}}
        try:
            reply = self.http.post(body)
        except http_client.HTTPFailure as e:
            raise JudgeError(str(e)) from None
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"judge {self.url}: no choices[0].message.content in the reply: {str(reply)[:200]}") from None
        return parse_verdict(content)
