"""Chat completions from any OpenAI-compatible endpoint (vLLM, SGLang, hosted APIs, `launch.serve`)
through the official `openai` client: retries with exponential backoff, a per-request timeout,
a response cache on disk, requests in parallel.

    client = ChatClient("http://127.0.0.1:8000/v1", "qwen3-4b", cache_dir="eval/api_cache")
    reply = client.complete(Request(messages, max_tokens=512))          # greedy (temperature 0)
    reply.text, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens, reply.error
    replies = client.complete_many(requests, progress=True)              # in order; duplicates sent once

A request that keeps failing (timeouts, 5xx, 429, a malformed body) is retried `retries` times,
then comes back as a Reply with `finish_reason` "error" and the reason in `error`: it never
raises, so an evaluation or a stage loop records the failure and goes on. A 4xx other than 408 /
429 is not retried. With `response_format` set, a server that rejects it (400) is asked again
without it, and the reply says so (`schema_dropped`): the caller parses and checks the text as
for free decoding. Only successful replies are cached (`cache_dir/<sha256 of the request>.json`,
written atomically), so rerunning an interrupted evaluation repeats no finished request and
retries the failed ones.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Sequence

from tqdm import tqdm

from t2t_jax.env.io import write_atomic


@dataclasses.dataclass(frozen=True)
class Request:
    """One chat completion (n = 1). `extra_body` goes to the server as is (e.g. vLLM's
    `{"chat_template_kwargs": {"enable_thinking": False}}`)."""

    messages: Sequence[dict]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    response_format: dict | None = None
    extra_body: dict | None = None

    def key(self, model: str) -> str:
        """The cache key: sha256 of the model and every field."""
        blob = json.dumps({"model": model, **dataclasses.asdict(self)}, sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Reply:
    text: str
    finish_reason: str  # "stop", "length" (the token budget ran out), or "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0
    error: str = ""
    schema_dropped: bool = False  # the server refused response_format; decoded free
    cached: bool = False


def json_schema_format(schema: dict, name: str = "answer") -> dict:
    """The structured-output `response_format` of a JSON schema."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


class ChatClient:
    """Args:
    api_base: the endpoint's base URL, e.g. http://127.0.0.1:8000/v1.
    model: the model name the server knows.
    api_key: sent as the bearer token (servers without auth ignore it).
    timeout: seconds per request.
    retries: further attempts after a retryable failure (backoff, 2 * backoff, 4 * backoff, ...
      seconds between them, at most 30).
    concurrency: requests in flight in `complete_many`.
    cache_dir: where successful replies are kept ("" for no cache).
    """

    def __init__(
        self,
        api_base: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = 1.0,
        concurrency: int = 8,
        cache_dir: str = "",
    ):
        import openai

        self.model, self.retries, self.backoff = model, retries, backoff
        self.concurrency, self.cache_dir = max(int(concurrency), 1), cache_dir
        self._openai = openai
        self._client = openai.OpenAI(base_url=api_base, api_key=api_key or "EMPTY", timeout=timeout, max_retries=0)
        if cache_dir:
            os.makedirs(cache_dir, exist_ok=True)

    def _cache_path(self, request: Request) -> str:
        return os.path.join(self.cache_dir, request.key(self.model) + ".json")

    def _retryable(self, e: Exception) -> bool:
        o = self._openai
        if isinstance(e, o.APIStatusError):
            return e.status_code in (408, 409, 429) or e.status_code >= 500
        return isinstance(e, (o.APIConnectionError, o.APIResponseValidationError, ValueError, KeyError, TypeError))

    def _call(self, request: Request, response_format) -> Reply:
        kw = dict(
            model=self.model,
            messages=list(request.messages),
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            n=1,
        )
        if request.seed is not None:
            kw["seed"] = request.seed
        if response_format is not None:
            kw["response_format"] = response_format
        if request.extra_body:
            kw["extra_body"] = dict(request.extra_body)
        out = self._client.chat.completions.create(**kw)
        if not getattr(out, "choices", None):
            raise ValueError(f"a reply without choices: {str(out)[:200]}")
        choice, usage = out.choices[0], out.usage
        if choice.message is None or not isinstance(choice.message.content, (str, type(None))):
            raise ValueError(f"a choice without a message: {str(choice)[:200]}")
        return Reply(
            text=choice.message.content or "",
            finish_reason="length" if choice.finish_reason == "length" else "stop",
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        )

    def complete(self, request: Request) -> Reply:
        """One request: from the cache, else from the server (with retries); never raises."""
        path = self._cache_path(request) if self.cache_dir else ""
        if path and os.path.exists(path):
            with open(path) as f:
                return dataclasses.replace(Reply(**json.load(f)), cached=True)
        response_format, dropped, error = request.response_format, False, ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff * 2 ** (attempt - 1), 30.0))
            try:
                reply = self._call(request, response_format)
            except Exception as e:  # noqa: BLE001 - every failure is recorded, retryable ones retried
                error = f"{type(e).__name__}: {str(e)[:300]}"
                o = self._openai
                if response_format is not None and isinstance(e, o.BadRequestError):
                    response_format, dropped = None, True  # the server has no structured output
                    continue
                if not self._retryable(e):
                    return Reply("", "error", attempts=attempt + 1, error=error, schema_dropped=dropped)
                continue
            reply = dataclasses.replace(reply, attempts=attempt + 1, schema_dropped=dropped)
            if path:
                write_atomic(path, json.dumps(dataclasses.asdict(reply)))
            return reply
        return Reply("", "error", attempts=self.retries + 1, error=error, schema_dropped=dropped)

    def complete_many(self, requests: Sequence[Request], progress: bool = False, desc: str = "api") -> list[Reply]:
        """Replies in request order, `concurrency` at a time; identical requests are sent once."""
        keys = [r.key(self.model) for r in requests]
        unique = {k: r for k, r in zip(keys, requests)}
        done: dict[str, Reply] = {}
        pool = concurrent.futures.ThreadPoolExecutor(self.concurrency)
        try:
            futures = {pool.submit(self.complete, r): k for k, r in unique.items()}
            bar = tqdm(concurrent.futures.as_completed(futures), total=len(futures), desc=desc, disable=not progress)
            for fut in bar:
                done[futures[fut]] = fut.result()
        finally:  # Ctrl-C / SIGTERM: drop the queued requests, do not wait for them
            pool.shutdown(wait=False, cancel_futures=True)
        return [done[k] for k in keys]
