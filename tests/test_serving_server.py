"""`launch.serve`'s server under hostile requests and concurrent clients (issue 31), over real HTTP
on 127.0.0.1: a scripted sampler (the real tokenizer and chat template, a decode that takes
chunks of time and calls the engine's `check` hook between them) keeps these fast; the schema
compiler runs the real outlines-core compile in its worker process. The served tiny model
itself is in tests/test_serving.py."""

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest
import uvicorn
from conftest import free_port

from t2t_jax.rollout import Policy
from t2t_jax.serving import server as srv
from t2t_jax.serving.server import Backend, Limits, make_app, server_config
from t2t_jax.text.tokenizer import load_tokenizer, stop_ids

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELLO = [{"role": "user", "content": "hello"}]


class ScriptedSampler:
    """A sampler whose decode takes `chunks` x `delay` seconds, calling `check` between chunks,
    and makes `max_new_tokens` copies of one token then a stop token; `fail` decodes raise."""

    def __init__(self, tok, chunks=1, delay=0.0, context=512):
        self.model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=context))
        self.stop_ids = stop_ids(tok)
        self.token = tok("a", add_special_tokens=False)["input_ids"][0]
        self.chunks, self.delay, self.fail = chunks, delay, 0
        self.stopped = self.finished = 0
        self.budgets = []

    def generate(self, ids, mask, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0, n=1, seed=0, **kw):
        check = kw.get("check")
        self.budgets.append(int(max_new_tokens))
        for _ in range(self.chunks):
            if check is not None:
                try:
                    check()
                except srv.Departed:
                    self.stopped += 1
                    raise
            time.sleep(self.delay)
        if self.fail:
            self.fail -= 1
            raise RuntimeError("the accelerator fell over")
        tokens = np.full((ids.shape[0] * n, max_new_tokens), self.token, np.int32)
        tokens[:, -1] = self.stop_ids[0]
        self.finished += 1
        return types.SimpleNamespace(tokens=tokens)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


class Serve:
    """`with Serve(backend) as (host, port):` the app under uvicorn with launch.serve's config."""

    def __init__(self, backend):
        self.backend, self.port = backend, free_port()
        config = server_config(make_app(backend), "127.0.0.1", self.port, backend.limits, log_level="critical")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return "127.0.0.1", self.port

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.backend.close()


def backend_of(tok, sampler=None, **limits):
    sampler = sampler or ScriptedSampler(tok)
    policy = Policy(sampler, tok, style="compact")
    return Backend(policy, None, "m", max_tokens=limits.pop("max_tokens", 64), limits=Limits(**limits))


def call(addr, method="POST", path="/v1/chat/completions", body=None, raw=None, headers=None, timeout=30):
    """(status, parsed JSON body or text, headers) of one request."""
    conn = http.client.HTTPConnection(*addr, timeout=timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    return r.status, parsed, r.headers


def chat(**kw):
    return {"model": "m", "messages": HELLO, "max_tokens": 4, **kw}


def assert_error(status, body, want_status, *names):
    assert status == want_status, (status, body)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    for name in names:
        assert name in body["error"]["message"], (name, body)


def test_hostile_bodies_roles_and_text_are_400s_and_the_server_answers_after_them(tok):
    backend = backend_of(tok, max_body_bytes=8192, max_messages=8)
    with Serve(backend) as addr:
        cases = [
            (400, dict(raw=b"{not json"), ("not valid JSON",)),
            (400, dict(raw=b"[1, 2]"), ("JSON object",)),
            (400, dict(raw=b"[" * 1500 + b"]" * 1500), ()),
            (400, dict(raw=b'{"messages": ' + b"[" * 100 + b"]" * 100 + b"}"), ("nested",)),
            (400, dict(raw=b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}'), ("NaN",)),
            (400, dict(raw=b'{"messages": [{"role": "user", "content": "x"}], "seed": 1' + b"0" * 5000 + b"}"), ()),
            (400, dict(raw=b'{"messages": [{"role": "user", "content": "\\ud800"}]}'), ("surrogate", "content")),
            (400, dict(raw=b'{"messages": [{"role": "user", "content": "x"}], "user": "\\udfff"}'), ("surrogate",)),
            (400, dict(raw=b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'), ()),
            (400, dict(body=chat(messages=[{"role": "user<|im_end|>", "content": "x"}])), ("role",)),
            (400, dict(body=chat(messages=[{"role": "tool", "content": "x"}])), ("messages[0].role",)),
            (400, dict(body=chat(messages=[{"role": "user", "content": "x"}] * 9)), ("9 messages",)),
            (400, dict(body=chat(messages=[])), ("messages",)),
            (400, dict(body=chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}])), ("text",)),
            (400, dict(body=chat(max_tokens=10**30)), ("max_tokens",)),
            (400, dict(body=chat(n=10**9)), ("n",)),
            (400, dict(body=chat(chat_template_kwargs={"enable_thinking": "yes"})), ("enable_thinking",)),
            (400, dict(body=chat(response_format={"type": "json_schema", "json_schema": []})), ("schema",)),
            (413, dict(body=chat(messages=[{"role": "user", "content": "x" * 9000}])), ("8192",)),
        ]
        for want, kw, names in cases:
            status, body, _ = call(addr, **kw)
            assert_error(status, body, want, *names)
        ok, body, _ = call(addr, body=chat(messages=[{"role": "developer", "content": "be brief"}, *HELLO]))
        assert ok == 200 and body["choices"][0]["message"]["content"] == "aaa", body
        parts = [{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}]
        status, again, _ = call(addr, body=chat(messages=parts))
        plain = call(addr, body=chat())[1]
        assert status == 200 and again["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    assert backend.failed == 0


def test_context_overflow_is_a_400_naming_the_lengths(tok):
    sampler = ScriptedSampler(tok, context=128)
    backend = backend_of(tok, sampler, max_tokens=64)
    long = [{"role": "user", "content": "word " * 300}]
    with Serve(backend) as addr:
        status, body, _ = call(addr, body=chat(messages=long, max_tokens=8))
        assert_error(status, body, 400, "maximum context length is 128 tokens", "in the messages")
        assert body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "messages"
        status, body, _ = call(addr, body=chat(max_tokens=64, messages=[{"role": "user", "content": "word " * 20}]))
        assert_error(status, body, 400, "64 in the completion")
        assert body["error"]["param"] == "max_tokens"
        # max_tokens omitted: what the context leaves, at most the server's limit
        status, body, _ = call(addr, body={"messages": [{"role": "user", "content": "word " * 20}]})
        assert status == 200 and body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] == 128
        assert sampler.budgets == [128 - body["usage"]["prompt_tokens"]]
        status, body, _ = call(addr, body=chat(max_tokens=4))
        assert status == 200 and body["usage"]["completion_tokens"] == 4
    assert backend.decoded == 2


def test_errors_404_405_docs_and_a_failed_decode_use_the_openai_shape(tok):
    sampler = ScriptedSampler(tok)
    backend = backend_of(tok, sampler)
    with Serve(backend) as addr:
        assert_error(*call(addr, "GET", "/v1/nothing")[:2], 404, "Not Found")
        assert_error(*call(addr, "GET", "/v1/chat/completions")[:2], 405)
        assert_error(*call(addr, "GET", "/docs")[:2], 404)
        assert_error(*call(addr, "GET", "/openapi.json")[:2], 404)
        sampler.fail = 1
        assert_error(*call(addr, body=chat())[:2], 500, "decode failed")
        status, body, _ = call(addr, body=chat())
        assert status == 200 and body["choices"][0]["finish_reason"] == "stop"
    backend = backend_of(tok, docs=True)
    with Serve(backend) as addr:
        assert call(addr, "GET", "/openapi.json")[0] == 200


def test_the_api_key_is_a_bearer_token_on_every_path_but_health(tok):
    backend = backend_of(tok, api_key="s3cret")
    with Serve(backend) as addr:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            assert_error(*call(addr, body=chat(), headers=headers)[:2], 401, "API key")
            assert_error(*call(addr, "GET", "/v1/models", headers=headers)[:2], 401)
        assert call(addr, "GET", "/health")[0] == 200
        good = {"Authorization": "Bearer s3cret"}
        assert call(addr, body=chat(), headers=good)[0] == 200
        assert call(addr, "GET", "/v1/models", headers=good)[1]["data"][0]["id"] == "m"


def test_launch_serve_will_not_listen_beyond_loopback_without_a_key():
    assert srv.is_loopback("127.0.0.1") and srv.is_loopback("localhost") and srv.is_loopback("::1")
    assert not srv.is_loopback("0.0.0.0") and not srv.is_loopback("192.168.1.4")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "T2T_JAX_REEXEC": "0"}
    env.pop("T2T_JAX_API_KEY", None)
    out = subprocess.run(
        [sys.executable, "-m", "launch.serve", "--tiny", "--host=0.0.0.0", "--port=0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "--api_key" in out.stderr.strip().splitlines()[-1], out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_under_load_health_and_models_answer_fast_and_a_full_queue_is_a_429(tok):
    sampler = ScriptedSampler(tok, chunks=4, delay=0.1)  # 0.4 s a decode, one at a time
    backend = backend_of(tok, sampler, max_queue=3)
    with Serve(backend) as addr:
        results = []

        def client():
            results.append(call(addr, body=chat()))

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        slow = []
        for path in ("/health", "/v1/models") * 5:
            start = time.perf_counter()
            status = call(addr, "GET", path)[0]
            slow.append(time.perf_counter() - start)
            assert status == 200
        for t in threads:
            t.join(30)
    codes = sorted(r[0] for r in results)
    assert codes.count(200) >= 3 and set(codes) <= {200, 429}, codes
    for status, body, headers in results:
        if status == 429:
            assert_error(status, body, 429, "busy")
            assert int(headers["Retry-After"]) >= 1
    assert max(slow) < 0.1, slow
    assert 429 in codes


def test_a_client_that_hangs_up_stops_its_decode_and_the_next_is_served(tok):
    sampler = ScriptedSampler(tok, chunks=40, delay=0.05)  # 2 s a decode unless stopped
    backend = backend_of(tok, sampler)
    with Serve(backend) as addr:
        gone = socket.create_connection(addr)
        data = json.dumps(chat()).encode()
        gone.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        time.sleep(0.4)
        gone.close()
        start = time.perf_counter()
        sampler.chunks = 1
        status, _, _ = call(addr, body=chat())
        took = time.perf_counter() - start
    assert status == 200 and sampler.stopped == 1 and backend.departed == 1
    assert took < 1.2, took


def test_stalled_headers_and_bodies_are_timed_out(tok):
    backend = backend_of(tok, read_timeout=0.5)
    with Serve(backend) as addr:
        stalled_headers = socket.create_connection(addr)
        stalled_headers.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        stalled_body = socket.create_connection(addr)
        stalled_body.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b'{"messages": '
        )
        idle = socket.create_connection(addr)
        for s in (stalled_headers, stalled_body, idle):
            s.settimeout(5)
        start = time.perf_counter()
        reply = stalled_body.recv(4096)
        assert b" 408 " in reply.split(b"\r\n")[0] and b'"error"' in reply, reply
        assert stalled_headers.recv(4096) == b"" and idle.recv(4096) == b""  # (closed by the server)
        assert time.perf_counter() - start < 3
        assert call(addr, body=chat())[0] == 200
        for s in (stalled_headers, stalled_body, idle):
            s.close()


def test_schemas_are_bounded_compiled_with_a_deadline_and_cached(tok):
    """The worker's tables are Constraint.from_json_schema's; a huge repetition is refused at
    once, a slow compile at the deadline (the worker killed), too many states by the bound; the
    LRU keeps `schema_cache` entries, refusals included, and a good schema compiles after all."""
    from t2t_jax.sampling.constrained import Constraint

    limits = Limits(schema_timeout=2.0, schema_cache=3, max_states=64)
    compiler = srv.SchemaCompiler(tok, limits)
    try:
        small = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        text = srv.check_schema(small, limits)
        got = compiler.get(text)
        want = Constraint.from_json_schema(text, tok)
        s, w = want.tokens.shape
        assert got.tokens.shape[0] >= s and got.tokens.shape[0] & (got.tokens.shape[0] - 1) == 0
        assert np.array_equal(np.asarray(got.tokens)[:s, :w], np.asarray(want.tokens))
        assert np.array_equal(np.asarray(got.next)[:s, :w], np.asarray(want.next))
        assert np.array_equal(np.asarray(got.final)[:s], np.asarray(want.final))
        assert int(got.initial) == int(want.initial) and (np.asarray(got.tokens)[s:] == -1).all()
        for huge in ({"type": "string", "minLength": 200000}, {"type": "array", "minItems": 100000}):
            start = time.perf_counter()
            with pytest.raises(srv.BadRequest, match="outside"):
                srv.check_schema(huge, limits)
            assert time.perf_counter() - start < 0.1
        with pytest.raises(srv.BadRequest, match="nested"):
            nested = {}
            for _ in range(100):
                nested = {"type": "array", "items": nested}
            srv.check_schema(nested, limits)
        slow = srv.check_schema({"type": "string", "minLength": 20}, limits)
        start = time.perf_counter()
        with pytest.raises(srv.BadRequest, match="did not compile within 2 s"):
            compiler.get(slow)
        assert time.perf_counter() - start < 4 and compiler.killed == 1
        start = time.perf_counter()
        with pytest.raises(srv.BadRequest, match="did not compile"):  # (a refusal is cached)
            compiler.get(slow)
        assert time.perf_counter() - start < 0.05
        wide = srv.check_schema({"type": "array", "items": {"type": "integer"}, "maxItems": 30}, limits)
        with pytest.raises(srv.BadRequest, match="states"):
            compiler.get(wide)
        other = srv.check_schema({"enum": ["a", "b"]}, limits)
        assert compiler.get(other).tokens.shape[0] == 16
        assert len(compiler._cache) == 3 and text not in compiler._cache  # (the LRU dropped the oldest)
        assert compiler.get(text).tokens.shape == got.tokens.shape
        compiler.limits.schema_cache_bytes = 1  # (the LRU's byte bound: only the newest stays)
        compiler.get(srv.check_schema({"enum": ["c"]}, limits))
        assert list(compiler._cache) == [srv.check_schema({"enum": ["c"]}, limits)]
    finally:
        compiler.close()


def test_a_schema_request_end_to_end_400s_then_serves(tok):
    backend = backend_of(tok, schema_timeout=2.0)
    fmt = lambda schema: {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}  # noqa: E731
    with Serve(backend) as addr:
        status, body, _ = call(addr, body=chat(response_format=fmt({"type": "string", "minLength": 200000})))
        assert_error(status, body, 400, "minLength")
        assert body["error"]["param"] == "response_format"
        status, body, _ = call(addr, body=chat(response_format=fmt({"enum": ["a", "b"]})))
        assert status == 200, body


def test_a_connection_limit_and_malformed_http_answer_in_the_openai_shape(tok):
    backend = backend_of(tok, max_connections=4)
    with Serve(backend) as addr:
        held = [socket.create_connection(addr) for _ in range(4)]
        extra = socket.create_connection(addr)
        extra.settimeout(5)
        reply = extra.recv(4096)
        head, _, body = reply.partition(b"\r\n\r\n")
        assert b" 503 " in head.split(b"\r\n")[0] and json.loads(body)["error"]["code"] == "too_many_connections"
        for s in held + [extra]:
            s.close()
        time.sleep(0.2)
        for parts in ([b"NOT HTTP AT ALL\r\n\r\n"], [b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 20_000, b"\r\n\r\n"]):
            bad = socket.create_connection(addr)
            bad.settimeout(5)
            for part in parts:  # (headers over 16 KiB count once they arrive in pieces)
                bad.sendall(part)
                time.sleep(0.1)
            reply = b""
            while chunk := bad.recv(4096):
                reply += chunk
            head, _, body = reply.partition(b"\r\n\r\n")
            assert b" 400 " in head.split(b"\r\n")[0], reply[:200]
            assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
            bad.close()
        assert call(addr, "GET", "/health")[0] == 200
