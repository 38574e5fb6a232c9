"""An OpenAI-compatible chat-completions server over the project's own sampler (`launch.serve`).

    backend = Backend(policy, params, name="default", max_tokens=4096, limits=Limits())
    app = make_app(backend)             # GET /health, GET /v1/models, POST /v1/chat/completions
    uvicorn.Server(server_config(app, "127.0.0.1", 8000, backend.limits)).run()

A request's messages go through the tokenizer's chat template (`chat_template_kwargs`'
`enable_thinking`, default the backend's), are left-padded to a prompt-length bucket, and
decode with `temperature` (0: greedy), `top_p`, `top_k` (vLLM's extension; 0 or -1: off), `n`
samples sharing one prefill, and `seed`; `response_format` {"type": "json_schema", "json_schema":
{"schema": ...}} decodes under the schema's token automaton (sampling.constrained), as the
engineer does in process. The reply's
text is decoded as `rollout.Policy.decode` does (the stop token dropped, special tokens such as
</think> kept), so an evaluation through this server parses exactly what the in-process one
parses; `usage.completion_tokens` counts the stop token, as the in-process lengths do.

What a request may cost is bounded before it costs it (`Limits`), in this order: the body's
size (413) and read time (408; a connection that stalls in its headers is closed); its JSON
(depth, numbers, text that is not UTF-8: 400); the number of messages, their roles (system,
user, assistant; developer is system) and content (400); then the prompt is tokenized and
prompt + max_tokens must fit the context (400 naming both lengths, as vLLM does; max_tokens
omitted: what the context leaves, at most the server's --max_tokens). A JSON schema must be
small, shallow and without huge repetition counts; it compiles in a worker process (the
automaton's states and table size bounded, a deadline after which the process is killed and
the request refused), and compiled schemas (and refusals) stay in a bounded LRU; the tables are
padded to powers of two so new schemas reuse the decode's compiled shapes.

One decode runs at a time (a thread that owns the accelerator) from a bounded queue: a request
beyond `max_queue` in flight is answered 429 with Retry-After. Health (`GET /health`) and
`GET /v1/models` run on the event loop, never behind a decode. A client that hangs up while
queued is dropped; while decoding, its rows stop at the next chunk (the engine's `check` hook).
With an API key every path but /health needs `Authorization: Bearer KEY` (401). Every error,
404 and 405 included, is {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import hmac
import json
import logging
import math
import queue
import threading
import time
import uuid
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request  # (at module level: FastAPI resolves the handlers' annotations here)

log = logging.getLogger(__name__)

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
REPEAT_KEYWORDS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
OPEN_PATHS = ("/health",)  # (no API key needed)


@dataclasses.dataclass
class Limits:
    """What one request may cost (see the module docstring); 0 for `context`: the model's own."""

    context: int = 0  # prompt + max_tokens (0: the model's max_position_embeddings)
    max_body_bytes: int = 1 << 20
    max_messages: int = 1024
    max_queue: int = 64  # requests in flight (reading, tokenizing, queued, decoding) before 429
    read_timeout: float = 10.0  # seconds for a request's headers and body to arrive
    max_connections: int = 512  # open connections before a new one is answered 503
    keep_alive: int = 5  # seconds an idle keep-alive connection stays open
    schema_timeout: float = 10.0  # seconds a schema may take to compile
    schema_bytes: int = 32 << 10  # the schema's JSON
    schema_depth: int = 32  # nesting of the schema's JSON
    schema_repeat: int = 1024  # the largest minLength / maxItems / ... a schema may ask
    max_states: int = 20_000  # automaton states
    constraint_bytes: int = 256 << 20  # the automaton's tables (states x widest state x 8 bytes)
    schema_cache: int = 16  # compiled schemas (and refusals) kept
    schema_cache_bytes: int = 1 << 30  # and at most this much of their tables
    compiler_memory: int = 4 << 30  # address space of the compiler process (0: no limit)
    api_key: str = ""
    docs: bool = False  # /docs and /openapi.json


class ContentPart(BaseModel):
    type: str
    text: str = ""


class Message(BaseModel):
    role: str
    content: str | list[ContentPart]


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = ""
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # (vLLM's extension; 0 or -1: off)
    n: int = Field(1, ge=1, le=64)
    seed: int | None = None
    response_format: dict | None = None
    chat_template_kwargs: dict | None = None
    stream: bool = False
    stop: Any = None


class ApiError(Exception):
    """An error answered in the OpenAI shape."""

    status = 400
    kind = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None, headers=None, status=None):
        super().__init__(message)
        self.param, self.code, self.headers = param, code, headers or {}
        if status is not None:
            self.status = status


class BadRequest(ApiError, ValueError):
    pass


class Departed(Exception):
    """The client hung up; its decode stops (raised from the engine's check hook)."""


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _budget(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << max(int(n) - 1, 0).bit_length())


# ---------------------------------------------------------------------------------------------
# Request bodies


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_body(raw: bytes, limits: Limits) -> dict:
    """The request's JSON object, refused (400) when it is not JSON, not an object, too deep, has
    a non-finite number or a string that is not valid Unicode."""
    if len(raw) > limits.max_body_bytes:
        raise ApiError(
            f"the request body is {len(raw)} bytes; this server takes at most {limits.max_body_bytes}",
            status=413,
            code="request_too_large",
        )
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise BadRequest("the request body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request body is not valid JSON ({str(e)[:200]})") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_tree(body, "", 64)
    return body


def _check_tree(value, path: str, depth: int):
    """Every string encodable as UTF-8 (no lone surrogates) and nesting below `depth` (iterative)."""
    stack = [(value, path, 0)]
    while stack:
        v, p, d = stack.pop()
        if d > depth:
            raise BadRequest(f"{p or 'the body'}: nested more than {depth} levels deep", p or None)
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"{p}: the text holds a lone surrogate (not valid Unicode)", p or None) from None
        elif isinstance(v, dict):
            for k, x in v.items():
                q = f"{p}.{k}" if p else str(k)
                try:
                    k.encode("utf-8")
                except UnicodeEncodeError:
                    raise BadRequest(f"{p or 'the body'}: a key holds a lone surrogate", p or None) from None
                stack.append((x, q, d + 1))
        elif isinstance(v, list):
            stack.extend((x, f"{p}[{i}]", d + 1) for i, x in enumerate(v))


def _validation_error(e: ValidationError) -> BadRequest:
    first = e.errors()[0] if e.errors() else {}
    field = ".".join(str(x) for x in first.get("loc", ())) or None
    return BadRequest(f"{field}: {first.get('msg', 'invalid request')}", field)


# ---------------------------------------------------------------------------------------------
# JSON schemas: bounded, compiled in a worker process with a deadline, cached


def check_schema(schema, limits: Limits) -> str:
    """The schema's canonical JSON, refused (BadRequest) when too large, too deep or asking for
    more repetitions than `limits.schema_repeat`."""
    if not isinstance(schema, dict):
        raise BadRequest("response_format.json_schema.schema: expected a JSON schema object", "response_format")
    text = json.dumps(schema, sort_keys=True)
    if len(text) > limits.schema_bytes:
        raise BadRequest(
            f"response_format: the schema is {len(text)} bytes; this server compiles at most {limits.schema_bytes}",
            "response_format",
        )
    stack = [(schema, "schema", 0)]
    while stack:
        v, p, d = stack.pop()
        if d > limits.schema_depth:
            raise BadRequest(f"response_format: {p} is nested deeper than {limits.schema_depth}", "response_format")
        if isinstance(v, dict):
            for k, x in v.items():
                if k in REPEAT_KEYWORDS and isinstance(x, (int, float)) and not isinstance(x, bool):
                    if not math.isfinite(x) or x > limits.schema_repeat or x < 0:
                        raise BadRequest(
                            f"response_format: {p}.{k} = {x} is outside [0, {limits.schema_repeat}] "
                            "(the automaton would be too large)",
                            "response_format",
                        )
                stack.append((x, f"{p}.{k}", d + 1))
        elif isinstance(v, list):
            stack.extend((x, f"{p}[{i}]", d + 1) for i, x in enumerate(v))
    return text


def _compile_worker(conn, vocab, eos: int, max_states: int, max_bytes: int, memory: int):
    """The compiler process: schema JSON in, ("ok", tables) or ("error", message) out. The tables
    are Constraint.from_regex's (sampling/constrained.py), exported the same way."""
    if memory:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    from outlines_core import Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    from t2t_jax.automaton import index_tables

    vocabulary = Vocabulary(eos, vocab)
    while True:
        try:
            text = conn.recv()
        except (EOFError, OSError):
            return

        def bounded(states: int, width: int) -> None:
            if states > max_states or states * width * 8 > max_bytes:
                raise _TooLarge(
                    f"its automaton has {states} states x {width} tokens; this server takes at most "
                    f"{max_states} states and {max_bytes >> 20} MiB of tables"
                )

        try:
            index = Index(build_regex_from_schema(text, whitespace_pattern=""), vocabulary)
            conn.send(("ok", index_tables(index, eos, check=bounded)))
        except _TooLarge as e:
            conn.send(("refused", str(e)))
        except MemoryError:
            conn.send(("refused", "compiling it ran out of memory"))
        except Exception as e:  # noqa: BLE001 - outlines-core's errors for schemas it cannot compile
            conn.send(("error", f"{type(e).__name__}: {str(e)[:300]}"))


class _TooLarge(Exception):
    """A schema's automaton over the server's bounds (the compiler process refuses it)."""


def pad_tables(tokens, nxt, final, width_cap: int):
    """The tables padded to powers of two (states: unreachable, no tokens; width: -1): the same
    language, and a handful of shapes for the decode to compile."""
    s, w = tokens.shape
    s2, w2 = _pow2(s, 16), min(_pow2(w, 8), max(w, width_cap))
    t = np.full((s2, w2), -1, np.int32)
    t[:s, :w] = tokens
    n = np.zeros((s2, w2), np.int32)
    n[:s, :w] = nxt
    f = np.zeros((s2,), bool)
    f[:s] = final
    return t, n, f


class SchemaCompiler:
    """JSON schema -> Constraint, in a worker process with a deadline, through a bounded LRU."""

    def __init__(self, tokenizer, limits: Limits):
        from t2t_jax.sampling.constrained import token_bytes

        self.limits = limits
        self._vocab = token_bytes(tokenizer)
        self._width_cap = sum(len(v) for v in self._vocab.values())
        self._eos = int(tokenizer.eos_token_id)
        self._lock = threading.Lock()  # one compile at a time
        self._cache_lock = threading.Lock()
        self._cache: collections.OrderedDict[str, object] = collections.OrderedDict()
        self._proc = self._conn = None
        self.compiles = self.killed = 0

    def _start(self):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # (never fork a process that runs JAX)
        parent, child = ctx.Pipe()
        lim = self.limits
        proc = ctx.Process(
            target=_compile_worker,
            args=(child, self._vocab, self._eos, lim.max_states, lim.constraint_bytes, lim.compiler_memory),
            daemon=True,
            name="t2t-schema-compiler",
        )
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent

    def _stop(self):
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
            self._conn.close()
        self._proc = self._conn = None

    def close(self):
        with self._lock:
            self._stop()

    def warm(self):
        """Start the worker process now (not at the first schema)."""
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._start()

    def _remember(self, key: str, value):
        size = lambda v: 0 if isinstance(v, str) else v.tokens.nbytes + v.next.nbytes  # noqa: E731
        with self._cache_lock:
            self._cache[key] = value
            self._cache.move_to_end(key)
            total = sum(size(v) for v in self._cache.values())
            while len(self._cache) > 1 and (
                len(self._cache) > self.limits.schema_cache or total > self.limits.schema_cache_bytes
            ):
                _, dropped = self._cache.popitem(last=False)
                total -= size(dropped)

    def get(self, schema_text: str):
        """The Constraint of a schema (canonical JSON), or BadRequest."""
        with self._cache_lock:
            hit = self._cache.get(schema_text)
            if hit is not None:
                self._cache.move_to_end(schema_text)
        if hit is None:
            if not self._lock.acquire(timeout=self.limits.schema_timeout):
                raise ApiError(
                    "response_format: the schema compiler is busy; try again",
                    "response_format",
                    headers={"Retry-After": str(max(1, math.ceil(self.limits.schema_timeout)))},
                    status=503,
                )
            try:
                with self._cache_lock:
                    hit = self._cache.get(schema_text)
                if hit is None:
                    hit = self._compile(schema_text)
                    self._remember(schema_text, hit)
            finally:
                self._lock.release()
        if isinstance(hit, str):
            raise BadRequest(hit, "response_format")
        return hit

    def _compile(self, text: str):
        """A Constraint, or the refusal's message (cached as such)."""
        import jax.numpy as jnp

        from t2t_jax.sampling.constrained import Constraint

        if self._proc is None or not self._proc.is_alive():
            self._start()
        self.compiles += 1
        timeout = self.limits.schema_timeout
        try:
            self._conn.send(text)
            ready = self._conn.poll(timeout)
            status, payload = self._conn.recv() if ready else (None, None)
        except (EOFError, OSError, BrokenPipeError):
            self._stop()
            return "response_format: the schema compiler died compiling it (out of memory?): the schema is too large"
        if status is None:
            self._stop()
            self.killed += 1
            return f"response_format: the schema did not compile within {timeout:g} s (its automaton is too large)"
        if status == "refused":
            return f"response_format: the schema is too large: {payload}"
        if status == "error":
            return f"response_format: the schema does not compile ({payload})"
        tokens, nxt, final, initial = payload
        tokens, nxt, final = pad_tables(tokens, nxt, final, self._width_cap)
        return Constraint(
            tokens=jnp.asarray(tokens), next=jnp.asarray(nxt), final=jnp.asarray(final), initial=jnp.int32(initial)
        )


# ---------------------------------------------------------------------------------------------
# The backend


@dataclasses.dataclass
class Job:
    """One prepared request: its prompt, budget and sampling, then its reply (a future)."""

    ids: np.ndarray
    mask: np.ndarray
    prompt_tokens: int
    budget: int
    temperature: float
    top_p: float
    n: int
    seed: int
    schema: str | None = None
    constraint: object = None
    top_k: int = 0
    departed: threading.Event = dataclasses.field(default_factory=threading.Event)
    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)

    def check(self):
        if self.departed.is_set():
            raise Departed("the client hung up")


class Backend:
    """Args:
    policy: a rollout.Policy (its sampler, tokenizer, buckets and enable_thinking default).
    params: the weights to decode with (None: the sampler's model's own).
    name: the model id of /v1/models.
    max_tokens: the largest `max_tokens` accepted, and the default (at most what the context leaves).
    limits: what a request may cost (`Limits`).
    """

    def __init__(self, policy, params, name: str, max_tokens: int = 4096, limits: Limits | None = None):
        self.policy, self.params, self.name, self.max_tokens = policy, params, name, int(max_tokens)
        self.limits = limits or Limits()
        config = getattr(getattr(policy.sampler, "model", None), "config", None)
        model_context = getattr(config, "max_position_embeddings", 0)
        self.context = int(self.limits.context or model_context or 0)  # 0: unknown (no check)
        self.created = int(time.time())
        self.compiler = SchemaCompiler(policy.tokenizer, self.limits)
        self._jobs: queue.Queue = queue.Queue()
        self.in_flight = 0  # requests admitted and not answered (the event loop's count)
        self.decoded = self.departed = self.failed = 0
        self._seconds = collections.deque(maxlen=32)  # recent decode times (Retry-After)
        self._thread = threading.Thread(target=self._serve, daemon=True, name="t2t-decode")
        self._thread.start()

    # -- preparing a request (any thread) --

    def prepare(self, body: dict | ChatRequest) -> Job:
        """Validate and tokenize one request -> a Job (its schema not compiled yet), or BadRequest."""
        lim = self.limits
        if isinstance(body, dict):
            messages = body.get("messages")
            if isinstance(messages, list) and len(messages) > lim.max_messages:
                raise BadRequest(
                    f"messages: {len(messages)} messages; this server takes at most {lim.max_messages}", "messages"
                )
            try:
                req = ChatRequest.model_validate(body)
            except ValidationError as e:
                raise _validation_error(e) from None
        else:
            req = body
        if req.model and req.model != self.name:
            raise BadRequest(f"model: {req.model!r} is not served here (this server has {self.name!r})", "model")
        if req.stream:
            raise BadRequest("stream: streaming is not supported", "stream")
        if req.stop is not None:
            raise BadRequest("stop: stop sequences are not supported (the model's own stop tokens end a reply)", "stop")
        if len(req.messages) > lim.max_messages:
            raise BadRequest(f"messages: {len(req.messages)} messages; this server takes at most {lim.max_messages}")
        messages = []
        for i, m in enumerate(req.messages):
            role = ROLES.get(m.role)
            if role is None:
                raise BadRequest(
                    f"messages[{i}].role: {m.role[:40]!r} is not one of {sorted(ROLES)}", f"messages[{i}].role"
                )
            content = m.content
            if not isinstance(content, str):
                if any(p.type != "text" for p in content):
                    raise BadRequest(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
                content = "".join(p.text for p in content)
            try:
                content.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(
                    f"messages[{i}].content: the text holds a lone surrogate (not valid Unicode)",
                    f"messages[{i}].content",
                ) from None
            messages.append({"role": role, "content": content})
        asked = req.max_completion_tokens or req.max_tokens
        if asked is not None and asked > self.max_tokens:
            raise BadRequest(f"max_tokens: {asked} is above this server's limit {self.max_tokens}", "max_tokens")
        schema = self._schema(req.response_format)
        kwargs = req.chat_template_kwargs or {}
        thinking = kwargs.get("enable_thinking", self.policy.enable_thinking)
        if not isinstance(thinking, bool):
            raise BadRequest("chat_template_kwargs.enable_thinking: expected true or false", "chat_template_kwargs")
        tok = self.policy.tokenizer
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        prompt = len(ids)
        budget = asked if asked is not None else self.max_tokens
        if self.context:
            if asked is None:
                budget = min(budget, self.context - prompt)
            if prompt + budget > self.context or budget < 1:
                raise BadRequest(
                    f"This model's maximum context length is {self.context} tokens. However, you requested "
                    f"{prompt + max(budget, asked or 1)} tokens ({prompt} in the messages, {max(budget, asked or 1)} "
                    "in the completion). Please reduce the length of the messages or completion.",
                    "messages" if prompt >= self.context else "max_tokens",
                    code="context_length_exceeded",
                )
        from t2t_jax.text.prompts import bucket_length

        length = bucket_length(prompt, self.policy.buckets)
        out = np.full((1, length), tok.pad_token_id, np.int32)
        mask = np.zeros((1, length), bool)
        out[0, length - prompt :] = ids
        mask[0, length - prompt :] = True
        seed = 0 if req.seed is None else int(req.seed) % 2**31
        top_k = max(req.top_k, 0)
        return Job(out, mask, prompt, int(budget), req.temperature, req.top_p, req.n, seed, schema, top_k=top_k)

    def _schema(self, fmt) -> str | None:
        if fmt is None or fmt.get("type") == "text":
            return None
        if fmt.get("type") != "json_schema":
            raise BadRequest(
                f"response_format.type: {str(fmt.get('type'))[:40]!r} is not supported (use 'json_schema' or 'text')",
                "response_format",
            )
        spec = fmt.get("json_schema")
        return check_schema(spec.get("schema") if isinstance(spec, dict) else None, self.limits)

    def compile(self, job: Job) -> Job:
        """The job's schema compiled (a worker process, a deadline, the LRU), or BadRequest."""
        if job.schema is not None and job.constraint is None:
            job.constraint = self.compiler.get(job.schema)
        return job

    # -- decoding (the decode thread) --

    def submit(self, job: Job) -> concurrent.futures.Future:
        self._jobs.put(job)
        return job.future

    def queued(self) -> int:
        return self._jobs.qsize()

    def retry_after(self) -> int:
        """Seconds until the queue has likely moved on (for 429s)."""
        mean = sum(self._seconds) / len(self._seconds) if self._seconds else 1.0
        return int(min(60, max(1, math.ceil(mean * max(self.queued(), 1)))))

    def _serve(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if not job.future.set_running_or_notify_cancel():
                continue
            if job.departed.is_set():
                self.departed += 1
                job.future.set_exception(Departed("the client hung up while queued"))
                continue
            start = time.perf_counter()
            try:
                job.future.set_result(self.run(job))
                self.decoded += 1
            except Departed as e:
                self.departed += 1
                job.future.set_exception(e)
            except BaseException as e:  # noqa: BLE001 - a failed decode answers 500; the server goes on
                self.failed += 1
                log.exception("decode failed")
                job.future.set_exception(e)
            self._seconds.append(time.perf_counter() - start)

    def close(self):
        self._jobs.put(None)
        self.compiler.close()

    def run(self, job: Job) -> dict:
        """Decode one prepared job (its schema compiled) -> the OpenAI response object."""
        from t2t_jax.sampling import Sampler

        sampler, budget = self.policy.sampler, job.budget
        width = budget
        if isinstance(sampler, Sampler):  # (a static batch compiles per budget: round it up)
            width = _budget(budget)
            if self.context and job.prompt_tokens + width > self.context:
                width = budget
        out = sampler.generate(
            job.ids,
            job.mask,
            max_new_tokens=width,
            temperature=job.temperature,
            top_k=job.top_k,
            top_p=job.top_p,
            n=job.n,
            seed=job.seed,
            constraint=job.constraint,
            params=self.params,
            check=job.check,
        )
        tokens = np.asarray(out.tokens)[:, :budget]
        stops = np.isin(tokens, np.asarray(sampler.stop_ids))
        stopped = stops.any(axis=1)
        lengths = np.where(stopped, stops.argmax(axis=1) + 1, budget)
        texts = self.policy.decode(tokens, lengths)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": t},
                "finish_reason": "stop" if s else "length",
                "logprobs": None,
            }
            for i, (t, s) in enumerate(zip(texts, stopped))
        ]
        completion_tokens = int(lengths.sum())
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": choices,
            "usage": {
                "prompt_tokens": job.prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": job.prompt_tokens + completion_tokens,
            },
        }

    def chat(self, req: ChatRequest | dict) -> dict:
        """One chat completion in this thread (queued behind other decodes): prepare, compile, decode."""
        job = self.compile(self.prepare(req))
        return self.submit(job).result()

    def models(self) -> dict:
        return {
            "object": "list",
            "data": [{"id": self.name, "object": "model", "created": self.created, "owned_by": "t2t_jax"}],
        }


# ---------------------------------------------------------------------------------------------
# HTTP


def _response(status: int, body: dict, headers: dict | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content=body, headers=headers)


def _error(status: int, message: str, kind: str, param: str | None = None, code=None, headers=None):
    return _response(status, error_body(message, kind, param, code), headers)


KINDS = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error", 429: "rate_limit_error"}


class _Auth:
    """ASGI middleware: `Authorization: Bearer KEY` on every path but OPEN_PATHS."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("path") not in OPEN_PATHS:
            auth = dict(scope.get("headers") or ()).get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                message = "Incorrect or missing API key (Authorization: Bearer KEY)"
                body = json.dumps(error_body(message, KINDS[401], code="invalid_api_key")).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


async def _read_body(request, limits: Limits) -> bytes:
    """The body, at most max_body_bytes (413) and within read_timeout (408)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if size > limits.max_body_bytes:
            raise ApiError(
                f"the request body is {size} bytes; this server takes at most {limits.max_body_bytes}",
                status=413,
                code="request_too_large",
            )

    async def read():
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limits.max_body_bytes:
                raise ApiError(
                    f"the request body is over {limits.max_body_bytes} bytes", status=413, code="request_too_large"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), limits.read_timeout)
    except TimeoutError:
        raise ApiError(
            f"the request body did not arrive within {limits.read_timeout:g} s", status=408, code="timeout"
        ) from None


def make_app(backend: Backend):
    """The FastAPI app of `backend`."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import ClientDisconnect
    from starlette.responses import Response

    lim = backend.limits
    docs = dict(docs_url="/docs", openapi_url="/openapi.json") if lim.docs else dict(docs_url=None, openapi_url=None)
    app = FastAPI(
        title="t2t_jax",
        description="OpenAI-compatible chat completions over a t2t_jax model",
        redoc_url=None,
        **docs,
    )
    prep = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="t2t-prepare")
    compile_pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="t2t-compile")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        field = ".".join(str(x) for x in first.get("loc", ())[1:]) or None
        message = f"{field or 'the request'}: {first.get('msg', 'invalid request')}"
        return _error(400, message, "invalid_request_error", field)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        kind = KINDS.get(exc.status, "invalid_request_error" if exc.status < 500 else "server_error")
        return _error(exc.status, str(exc), kind, exc.param, exc.code, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kind = KINDS.get(exc.status_code, "invalid_request_error" if exc.status_code < 500 else "server_error")
        message = f"{exc.detail}: {request.method} {request.url.path}"
        return _error(exc.status_code, message, kind, None, None, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception):
        log.exception("request failed")
        return _error(500, f"internal error ({type(exc).__name__})", "server_error")

    @app.get("/health")
    async def health():
        return {"status": "ok", "in_flight": backend.in_flight, "queued": backend.queued()}

    @app.get("/v1/models")
    async def models():
        return backend.models()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        if backend.in_flight >= lim.max_queue:
            wait = backend.retry_after()
            raise ApiError(
                f"the server is busy ({backend.in_flight} requests in flight); retry after {wait} s",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(wait)},
                status=429,
            )
        backend.in_flight += 1
        loop = asyncio.get_running_loop()
        job = None
        try:
            try:
                raw = await _read_body(request, lim)
            except ClientDisconnect:
                return Response(status_code=499)
            body = parse_body(raw, lim)
            job = await loop.run_in_executor(prep, backend.prepare, body)
            if job.schema is not None:
                job = await loop.run_in_executor(compile_pool, backend.compile, job)
            done = asyncio.wrap_future(backend.submit(job))
            while True:
                finished, _ = await asyncio.wait({done}, timeout=0.25)
                if finished:
                    break
                if await request.is_disconnected():
                    job.departed.set()  # (its rows stop at the next decode chunk)
                    done.add_done_callback(lambda f: f.cancelled() or f.exception())
                    return Response(status_code=499)
            try:
                return done.result()
            except Departed:
                return Response(status_code=499)
            except Exception as e:  # noqa: BLE001 - a failed decode is a 500; the server goes on
                return _error(500, f"the decode failed ({type(e).__name__}: {str(e)[:200]})", "server_error")
        finally:
            backend.in_flight -= 1

    if lim.api_key:
        app.add_middleware(_Auth, key=lim.api_key)
    app.state.backend = backend
    return app


# ---------------------------------------------------------------------------------------------
# uvicorn


def _raw_error(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 error response in the OpenAI shape, for the protocol level (no app)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = json.dumps(error_body(message, kind, None, code)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def timed_protocol(read_timeout: float, max_connections: int = 0):
    """uvicorn's h11 protocol with a read deadline: a connection whose request headers have not
    all arrived `read_timeout` seconds after it opened (or after its last response) is closed
    (uvicorn has no such timeout: a stalled client would hold its connection forever; bodies are
    timed by the app: 408). Beyond `max_connections` open connections (0: no limit) a new one is
    answered 503 and closed; a malformed request or headers over 16 KiB are a 400; both in the
    OpenAI error shape (uvicorn's own are plain text)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        _deadline = None

        def _arm(self):
            self._disarm()
            self._deadline = self.loop.call_later(read_timeout, self._expire)

        def _disarm(self):
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self):
            self._deadline = None
            cycle = self.cycle
            if (cycle is None or cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport):
            super().connection_made(transport)
            if max_connections and len(self.connections) > max_connections:
                message = f"the server has {max_connections} connections open; retry later"
                transport.write(_raw_error(503, "Service Unavailable", message, "too_many_connections"))
                transport.close()
                return
            self._arm()

        def send_400_response(self, msg: str):
            self.transport.write(
                _raw_error(400, "Bad Request", f"{msg} (malformed HTTP, or headers over 16 KiB)", "bad_http")
            )
            self.transport.close()

        def on_response_complete(self):
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

    return TimedH11Protocol


def server_config(app, host: str, port: int, limits: Limits, log_level: str = "warning"):
    """uvicorn's Config with the limits (`timed_protocol`): the read deadline, a connection limit
    (503 beyond it), the keep-alive timeout and 16 KiB of headers."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=timed_protocol(limits.read_timeout, limits.max_connections),
        timeout_keep_alive=limits.keep_alive,
        h11_max_incomplete_event_size=16 * 1024,
        server_header=False,
        access_log=False,
    )


def is_loopback(host: str) -> bool:
    import ipaddress

    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
