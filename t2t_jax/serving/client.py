"""Chat completions from any OpenAI-compatible endpoint (vLLM, SGLang, hosted APIs, `launch.serve`)
through the official `openai` client: retries with exponential backoff, a per-request timeout,
a response cache on disk, requests in parallel.

    client = ChatClient("http://127.0.0.1:8000/v1", "qwen3-4b", cache_dir="eval/api_cache")
    reply = client.complete(Request(messages, max_tokens=512))          # greedy (temperature 0)
    reply.text, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens, reply.error
    replies = client.complete_many(requests, progress=True)              # in order; duplicates sent once

A request that keeps failing (timeouts, 5xx, 408/409/429, a malformed or unusable body) is
retried `retries` times, as the official client retries: the server's `Retry-After`
(`retry-after-ms`) when it gives one (up to 2 minutes; a longer one is not waited for), else
exponential backoff with jitter (backoff x 2^k x (0.75..1), at most 8 s); then it comes back as a
Reply with `finish_reason` "error" and the reason in `error`: it never raises, so an evaluation
or a stage loop records the failure and goes on. A 4xx other than 408 / 409 / 429 is not retried.
With `response_format` set, a server that rejects it (400) is asked again without it, and the
reply says so (`schema_dropped`): the caller parses and checks the text as for free decoding.

A reply is used only when it has a choice with text and its `usage` holds non-negative finite
numbers (token counts are clamped: completion tokens to the request's max_tokens, prompt tokens
to 2^31 - 1); one that is not counts as malformed. Only usable replies are cached
(`cache_dir/<sha256 of the endpoint, model and request>.json`, written atomically), so rerunning
an interrupted evaluation repeats no finished request and retries the failed ones; a cache
entry that cannot be read or used is removed with a warning naming its file, and its request
sent again. `complete_many` runs its requests on daemon threads: Ctrl-C returns at once (the
replies that finished are in the cache), it does not wait for requests in flight.
"""

from __future__ import annotations

import dataclasses
import email.utils
import hashlib
import json
import logging
import math
import os
import queue
import random
import threading
import time
from collections.abc import Sequence

from tqdm import tqdm

from t2t_jax.env.io import write_atomic

log = logging.getLogger(__name__)

INITIAL_RETRY_DELAY, MAX_RETRY_DELAY, MAX_RETRY_AFTER = 0.5, 8.0, 120.0  # (the official client's)
MAX_PROMPT_TOKENS = 2**31 - 1


def normalize_endpoint(url: str) -> str:
    """The endpoint as a cache key and a results record: no trailing slash."""
    return (url or "").strip().rstrip("/")


def retry_after(headers) -> float | None:
    """Seconds the server asked to wait (`retry-after-ms`, `retry-after` in seconds or as an HTTP
    date), None when it did not say."""
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        return delay / divisor if math.isfinite(delay) else MAX_RETRY_AFTER + 1
    value = headers.get("retry-after")
    try:
        date = email.utils.parsedate_tz(value) if value else None
        return None if date is None else float(email.utils.mktime_tz(date) - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def count(value, name: str, cap: int) -> int:
    """A token count from a reply's usage: absent -> 0; a non-negative finite number -> an int,
    clamped to `cap`; anything else is refused (ValueError: the reply is unusable)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"usage.{name}: {str(value)[:40]!r} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"usage.{name}: {value} is not finite")
    if value < 0:
        raise ValueError(f"usage.{name}: {value} is negative")
    return int(min(value, cap))


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

    def key(self, model: str, endpoint: str = "") -> str:
        """The cache key: sha256 of the endpoint, the model and every field."""
        blob = json.dumps(
            {"endpoint": normalize_endpoint(endpoint), "model": model, **dataclasses.asdict(self)},
            sort_keys=True,
            default=list,
        )
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
    retries: further attempts after a retryable failure (the server's Retry-After, else
      backoff x 2^k with jitter, at most 8 s).
    concurrency: requests in flight in `complete_many`.
    cache_dir: where usable replies are kept ("" for no cache).
    """

    def __init__(
        self,
        api_base: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = INITIAL_RETRY_DELAY,
        concurrency: int = 8,
        cache_dir: str = "",
    ):
        import openai

        self.api_base = normalize_endpoint(api_base)
        self.model, self.retries, self.backoff = model, max(int(retries), 0), float(backoff)
        self.concurrency, self.cache_dir = max(int(concurrency), 1), cache_dir
        self._openai = openai
        self._client = openai.OpenAI(base_url=api_base, api_key=api_key or "EMPTY", timeout=timeout, max_retries=0)
        self._stop = threading.Event()  # set by Ctrl-C in complete_many: no new attempts
        self.dropped_cache: list[str] = []  # cache files removed as unreadable
        if cache_dir:
            os.makedirs(cache_dir, exist_ok=True)

    def key(self, request: Request) -> str:
        return request.key(self.model, self.api_base)

    def _cache_path(self, request: Request) -> str:
        return os.path.join(self.cache_dir, self.key(request) + ".json")

    def _retryable(self, e: Exception) -> bool:
        o = self._openai
        if isinstance(e, o.APIStatusError):
            should = e.response.headers.get("x-should-retry") if e.response is not None else None
            if should in ("true", "false"):
                return should == "true"
            return e.status_code in (408, 409, 429) or e.status_code >= 500
        return isinstance(e, (o.APIConnectionError, o.APIResponseValidationError, ValueError, KeyError, TypeError))

    def _delay(self, attempt: int, e: Exception | None) -> float | None:
        """Seconds before attempt `attempt` (>= 1): the server's Retry-After when it gave one (None:
        it asked for more than MAX_RETRY_AFTER, do not retry), else backoff with jitter."""
        response = getattr(e, "response", None)
        wait = retry_after(getattr(response, "headers", None))
        if wait is not None:
            if wait > MAX_RETRY_AFTER:
                return None
            if wait > 0:
                return wait
        backoff = min(self.backoff * 2.0 ** min(attempt - 1, 60), MAX_RETRY_DELAY)
        return backoff * (1 - 0.25 * random.random())

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
        choice, usage = out.choices[0], getattr(out, "usage", None)
        if getattr(choice, "message", None) is None or not isinstance(choice.message.content, (str, type(None))):
            raise ValueError(f"a choice without a message: {str(choice)[:200]}")
        if usage is not None and not hasattr(usage, "completion_tokens"):
            raise ValueError(f"usage: expected an object of token counts, got {str(usage)[:80]}")
        return self._usable(
            {
                "text": choice.message.content or "",
                "finish_reason": "length" if choice.finish_reason == "length" else "stop",
                "prompt_tokens": getattr(usage, "prompt_tokens", None),
                "completion_tokens": getattr(usage, "completion_tokens", None),
            },
            request,
        )

    @staticmethod
    def _usable(fields: dict, request: Request) -> Reply:
        """A Reply from a reply's (or a cache entry's) fields, the counts checked and clamped;
        ValueError / TypeError when they cannot be used."""
        text = fields.get("text")
        if not isinstance(text, str):
            raise ValueError(f"text: expected a string, got {type(text).__name__}")
        finish = fields.get("finish_reason")
        if finish not in ("stop", "length"):
            raise ValueError(f"finish_reason: {str(finish)[:40]!r}")
        prompt = count(fields.get("prompt_tokens"), "prompt_tokens", MAX_PROMPT_TOKENS)
        completion = count(fields.get("completion_tokens"), "completion_tokens", max(int(request.max_tokens), 0))
        extra = {k: fields[k] for k in ("attempts", "schema_dropped") if k in fields}
        if not isinstance(extra.get("attempts", 0), int) or not isinstance(extra.get("schema_dropped", False), bool):
            raise ValueError("attempts / schema_dropped: wrong types")
        return Reply(text, finish, prompt, completion, **extra)

    def _cached(self, path: str, request: Request) -> Reply | None:
        """The cached reply at `path`, None when there is none; an entry that cannot be read or
        used is removed (a warning names it) and the request goes out again."""
        try:
            with open(path, encoding="utf-8") as f:
                fields = json.load(f)
            if not isinstance(fields, dict):
                raise ValueError("not a JSON object")
            return dataclasses.replace(self._usable(fields, request), cached=True)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, RecursionError) as e:
            log.warning("api cache: dropping %s (%s: %s); sending its request again", path, type(e).__name__, e)
            self.dropped_cache.append(path)
            try:
                os.remove(path)
            except OSError:
                pass
            return None

    def complete(self, request: Request) -> Reply:
        """One request: from the cache, else from the server (with retries); never raises (but
        KeyboardInterrupt)."""
        path = self._cache_path(request) if self.cache_dir else ""
        if path:
            hit = self._cached(path, request)
            if hit is not None:
                return hit
        response_format, dropped, error, last = request.response_format, False, "", None
        attempts = 0
        for attempt in range(self.retries + 1):
            if attempt:
                delay = self._delay(attempt, last)
                if delay is None:
                    error += " (the server asked to wait longer than 2 minutes)"
                    break
                if self._stop.wait(delay):
                    error = error or "interrupted"
                    break
            attempts = attempt + 1
            try:
                reply = self._call(request, response_format)
            except Exception as e:  # noqa: BLE001 - every failure is recorded, retryable ones retried
                error, last = f"{type(e).__name__}: {str(e)[:300]}", e
                o = self._openai
                if response_format is not None and isinstance(e, o.BadRequestError):
                    response_format, dropped, last = None, True, None  # the server has no structured output
                    continue
                if not self._retryable(e):
                    return Reply("", "error", attempts=attempts, error=error, schema_dropped=dropped)
                continue
            reply = dataclasses.replace(reply, attempts=attempts, schema_dropped=dropped)
            if path:
                write_atomic(path, json.dumps(dataclasses.asdict(reply)))
            return reply
        return Reply("", "error", attempts=attempts, error=error, schema_dropped=dropped)

    def complete_many(self, requests: Sequence[Request], progress: bool = False, desc: str = "api") -> list[Reply]:
        """Replies in request order, `concurrency` at a time; identical requests are sent once.
        On Ctrl-C (KeyboardInterrupt) it stops at once: the requests in flight are abandoned
        (daemon threads), the finished ones are already in the cache."""
        keys = [self.key(r) for r in requests]
        unique = {k: r for k, r in zip(keys, requests)}
        todo: queue.Queue = queue.Queue()
        for item in unique.items():
            todo.put(item)
        results: queue.Queue = queue.Queue()
        self._stop.clear()

        def work():
            while not self._stop.is_set():
                try:
                    k, r = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    results.put((k, self.complete(r)))
                except BaseException as e:  # noqa: BLE001 - reported to the caller's thread
                    results.put((k, e))

        for _ in range(min(self.concurrency, len(unique))):
            threading.Thread(target=work, daemon=True, name="t2t-api").start()
        done: dict[str, Reply] = {}
        try:
            with tqdm(total=len(unique), desc=desc, disable=not progress) as bar:
                while len(done) < len(unique):
                    try:
                        k, reply = results.get(timeout=0.2)
                    except queue.Empty:
                        continue
                    if isinstance(reply, BaseException):
                        raise reply
                    done[k] = reply
                    bar.update(1)
        except BaseException:  # Ctrl-C / SIGTERM: no new requests, do not wait for those in flight
            self._stop.set()
            raise
        return [done[k] for k in keys]
