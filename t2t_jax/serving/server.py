"""An OpenAI-compatible chat-completions server over the project's own `Sampler` (`launch.serve`).

    backend = Backend(policy, params, name="default", max_tokens=4096)
    app = make_app(backend)             # FastAPI: GET /v1/models, POST /v1/chat/completions
    uvicorn.run(app, host="127.0.0.1", port=8000)

A request's messages go through the tokenizer's chat template (`chat_template_kwargs`'
`enable_thinking`, default the backend's), are left-padded to a prompt-length bucket, and
decode with `temperature` (0: greedy), `top_p`, `n` samples sharing one prefill, and `seed`;
`response_format` {"type": "json_schema", "json_schema": {"schema": ...}} decodes under the
schema's token automaton (sampling.constrained), as the engineer does in process. The reply's
text is decoded as `rollout.Policy.decode` does (the stop token dropped, special tokens such as
</think> kept), so an evaluation through this server parses exactly what the in-process one
parses; `usage.completion_tokens` counts the stop token, as the in-process lengths do.

Budgets are rounded up to a power of two (at least 16) for compilation and the tokens cut at the
request's `max_tokens` (the same tokens as decoding with that budget: every step draws with
its own key), so a client's varying budgets compile a handful of shapes. One decode runs at a
time (a lock: one accelerator); requests are not batched across clients (continuous batching
is the rollout engine's job, issue 21). Errors use the OpenAI shape, {"error": {"message",
"type", "param"}}, with 400 for a bad request (a field out of range names the field).
"""

from __future__ import annotations

import functools
import json
import threading
import time
import uuid
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from t2t_jax.text.prompts import encode_texts


class Message(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = ""
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=64)
    seed: int | None = None
    response_format: dict | None = None
    chat_template_kwargs: dict | None = None
    stream: bool = False
    stop: Any = None


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _budget(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


@functools.lru_cache(maxsize=8)
def _constraint(schema_json: str, tokenizer):
    from t2t_jax.sampling.constrained import Constraint

    return Constraint.from_json_schema(schema_json, tokenizer)


class Backend:
    """Args:
    policy: a rollout.Policy (its sampler, tokenizer, buckets and enable_thinking default).
    params: the weights to decode with (None: the sampler's model's own).
    name: the model id of /v1/models.
    max_tokens: the largest `max_tokens` accepted, and the default.
    """

    def __init__(self, policy, params, name: str, max_tokens: int = 4096):
        self.policy, self.params, self.name, self.max_tokens = policy, params, name, int(max_tokens)
        self.created = int(time.time())
        self._lock = threading.Lock()

    def _schema(self, fmt: dict | None):
        if fmt is None or fmt.get("type") == "text":
            return None
        if fmt.get("type") != "json_schema":
            raise BadRequest(
                f"response_format.type: {fmt.get('type')!r} is not supported (use 'json_schema' or 'text')",
                "response_format",
            )
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema: expected a JSON schema object", "response_format")
        try:
            return _constraint(json.dumps(schema, sort_keys=True), self.policy.tokenizer)
        except Exception as e:  # noqa: BLE001 - outlines-core's errors for schemas it cannot compile
            raise BadRequest(f"response_format: the schema does not compile ({e})", "response_format") from None

    def chat(self, req: ChatRequest) -> dict:
        """One chat completion (the OpenAI response object)."""
        if req.stream:
            raise BadRequest("stream: streaming is not supported", "stream")
        if req.stop is not None:
            raise BadRequest("stop: stop sequences are not supported (the model's own stop tokens end a reply)", "stop")
        budget = req.max_completion_tokens or req.max_tokens or self.max_tokens
        if budget > self.max_tokens:
            raise BadRequest(f"max_tokens: {budget} is above this server's limit {self.max_tokens}", "max_tokens")
        constraint = self._schema(req.response_format)
        tok, sampler = self.policy.tokenizer, self.policy.sampler
        thinking = (req.chat_template_kwargs or {}).get("enable_thinking", self.policy.enable_thinking)
        messages = [m.model_dump() for m in req.messages]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
        ids, mask = encode_texts(tok, [text], self.policy.buckets)
        with self._lock:
            out = sampler.generate(
                ids,
                mask,
                max_new_tokens=_budget(budget),
                temperature=req.temperature,
                top_p=req.top_p,
                n=req.n,
                seed=0 if req.seed is None else int(req.seed) % 2**31,
                constraint=constraint,
                params=self.params,
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
        prompt_tokens, completion_tokens = int(mask.sum()), int(lengths.sum())
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def models(self) -> dict:
        return {
            "object": "list",
            "data": [{"id": self.name, "object": "model", "created": self.created, "owned_by": "t2t_jax"}],
        }


def _error(status: int, message: str, kind: str, param: str | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": param}})


def make_app(backend: Backend):
    """The FastAPI app of `backend`."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError

    app = FastAPI(title="t2t_jax", description="OpenAI-compatible chat completions over a t2t_jax model")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        field = ".".join(str(x) for x in first.get("loc", ())[1:]) or None
        return _error(400, f"{field}: {first.get('msg', 'invalid request')}", "invalid_request_error", field)

    @app.exception_handler(BadRequest)
    async def bad(request: Request, exc: BadRequest):
        return _error(400, str(exc), "invalid_request_error", exc.param)

    @app.get("/v1/models")
    def models():
        return backend.models()

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest):  # a plain def: FastAPI runs it in its thread pool
        if req.model and req.model != backend.name:
            raise BadRequest(f"model: {req.model!r} is not served here (this server has {backend.name!r})", "model")
        return backend.chat(req)

    return app
