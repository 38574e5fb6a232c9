"""The OpenAI client (`launch.eval --api_base`, `engineer.kind=api`) against hostile and failing
servers (issue 31): absurd or broken usage, corrupt cache files, two endpoints sharing a cache,
Retry-After and backoff, Ctrl-C while requests hang."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, Response
from test_serving import MESSAGES, Serve, completion

from t2t_jax.rl.rewards import ACCURACY_FIRST
from t2t_jax.serving import client as client_lib
from t2t_jax.serving.api_policy import ApiPolicy
from t2t_jax.serving.client import ChatClient, Request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def endpoint(replies, answer="Agent 0: RIGHT"):
    """A server answering request i with replies[i] (the last repeats): a dict merged into the
    completion's usage, ("status", code, headers), or ("hang", seconds)."""
    app = FastAPI()
    app.state.seen, app.state.times = [], []

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest):
        import asyncio

        app.state.seen.append(await request.json())
        app.state.times.append(time.monotonic())
        what = replies[min(len(app.state.seen), len(replies)) - 1]
        if isinstance(what, tuple) and what[0] == "status":
            return JSONResponse({"error": {"message": "later"}}, status_code=what[1], headers=what[2])
        if isinstance(what, tuple) and what[0] == "hang":
            await asyncio.sleep(what[1])
        body = completion(answer)
        if isinstance(what, dict):
            body["usage"] = {**body["usage"], **what}
        return Response(json.dumps(body), media_type="application/json")  # (Infinity too)

    return app


def make(url, **kw):
    return ChatClient(url, "m", **{"retries": 2, "backoff": 0.01, **kw})


def test_absurd_usage_is_clamped_and_broken_usage_is_an_uncached_error(tmp_path):
    app = endpoint([{"completion_tokens": 1e12, "prompt_tokens": 1e30}])
    with Serve(app) as url:
        reply = make(url, cache_dir=str(tmp_path)).complete(Request(MESSAGES, max_tokens=8))
        assert (reply.completion_tokens, reply.prompt_tokens, reply.error) == (8, 2**31 - 1, "")
        # the evaluation's policy scores it (no OverflowError), and so does a rerun from the cache
        boards = [{"size": 3, "holes": [], "starts": [[0, 0]], "goals": [[0, 1]], "optimal_makespan": 1, "bucket": 0}]
        for _ in range(2):
            policy = ApiPolicy(make(url, cache_dir=str(tmp_path / "eval")), style="compact")
            ro = policy.rollout(None, boards, n=1, max_new_tokens=8, reward_weights=ACCURACY_FIRST, temperature=0)
            assert ro.lengths.tolist() == [8]
        assert policy.usage["cached"] == 1 and policy.usage["endpoint"] == url
    for bad in ({"completion_tokens": -3}, {"completion_tokens": "many"}, {"prompt_tokens": float("inf")}):
        app = endpoint([bad])
        cache = tmp_path / f"bad_{len(os.listdir(tmp_path))}"
        with Serve(app) as url:
            reply = make(url, cache_dir=str(cache)).complete(Request(MESSAGES, max_tokens=8))
        assert reply.finish_reason == "error" and "usage" in reply.error and reply.attempts == 3, reply
        assert len(app.state.seen) == 3 and not os.listdir(cache)


def test_a_corrupt_cache_entry_is_dropped_with_a_warning_and_sent_again(tmp_path, caplog):
    app = endpoint([{}])
    with Serve(app) as url:
        c = make(url, cache_dir=str(tmp_path))
        request = Request(MESSAGES, max_tokens=8)
        first = c.complete(request)
        path = c._cache_path(request)
        for corrupt in (
            b'{"text": "Agent',
            b"\x00\xff garbage",
            b"[1, 2]",
            b'{"text": 3}',
            json.dumps(
                {
                    **json.loads(json.dumps(first.__dict__)),
                    "completion_tokens": -5,
                }
            ).encode(),
        ):
            with open(path, "wb") as f:
                f.write(corrupt)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger=client_lib.__name__):
                again = c.complete(request)
            assert not again.cached and again.text == first.text and again.error == ""
            assert any(path in r.getMessage() for r in caplog.records), caplog.text
            assert c.complete(request).cached  # (the request was sent again and cached anew)
    assert len(app.state.seen) == 6 and len(c.dropped_cache) == 5


def test_the_cache_is_keyed_by_endpoint(tmp_path):
    one, two = endpoint([{}], answer="first"), endpoint([{}], answer="second")
    requests = [Request(MESSAGES, max_tokens=8), Request(MESSAGES, max_tokens=8, temperature=0.5, seed=1)]
    with Serve(one) as a, Serve(two) as b:
        first = make(a, cache_dir=str(tmp_path)).complete_many(requests)
        second = make(b, cache_dir=str(tmp_path)).complete_many(requests)
        again = make(a + "/", cache_dir=str(tmp_path)).complete_many(requests)
    assert [r.text for r in first] == ["first"] * 2 and [r.text for r in second] == ["second"] * 2
    assert len(one.state.seen) == 2 and len(two.state.seen) == 2 and all(r.cached for r in again)
    assert Request(MESSAGES, 8).key("m", a) != Request(MESSAGES, 8).key("m", b)
    assert Request(MESSAGES, 8).key("m", a) != Request(MESSAGES, 8, top_p=0.9).key("m", a)


def test_429_and_5xx_honour_retry_after_then_back_off_with_jitter():
    app = endpoint([("status", 429, {"Retry-After": "1"}), ("status", 503, {"retry-after-ms": "300"}), {}])
    with Serve(app) as url:
        reply = make(url).complete(Request(MESSAGES, max_tokens=8))
    t = app.state.times
    assert reply.error == "" and reply.attempts == 3
    assert 0.95 <= t[1] - t[0] < 1.6 and 0.28 <= t[2] - t[1] < 0.8, np.diff(t)
    # longer than two minutes: not waited for
    app = endpoint([("status", 429, {"Retry-After": "3600"})])
    with Serve(app) as url:
        start = time.monotonic()
        reply = make(url).complete(Request(MESSAGES, max_tokens=8))
    assert reply.finish_reason == "error" and time.monotonic() - start < 2 and len(app.state.seen) == 1
    # no header: 0.5 x 2^k s, at most 8, less up to 25% jitter
    c = make("http://127.0.0.1:9/v1", backoff=0.5)
    delays = [[c._delay(k, None) for _ in range(200)] for k in (1, 2, 3, 6)]
    for want, got in zip((0.5, 1.0, 2.0, 8.0), delays):
        assert 0.75 * want <= min(got) < max(got) <= want and np.std(got) > 0
    assert client_lib.retry_after({"retry-after": "nonsense"}) is None
    assert client_lib.retry_after({"retry-after": "1e999"}) > 120


CTRL_C = """
import json, sys, time
from t2t_jax.serving.client import ChatClient, Request
c = ChatClient(sys.argv[1], "m", timeout=600, retries=4, concurrency=4, cache_dir=sys.argv[2])
requests = [Request(({"role": "user", "content": str(i)},), max_tokens=8) for i in range(6)]
print("ready", flush=True)
c.complete_many(requests)
"""


def test_ctrl_c_while_requests_hang_exits_within_2_s_keeping_what_finished(tmp_path):
    app = endpoint([{}, {}, ("hang", 60)])
    with Serve(app) as url:
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        proc = subprocess.Popen(
            [sys.executable, "-c", CTRL_C, url, str(tmp_path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.time() + 90
        while len(app.state.seen) < 6 and time.time() < deadline:
            time.sleep(0.05)
        assert len(app.state.seen) >= 5, len(app.state.seen)  # (2 answered, the rest hanging)
        time.sleep(0.3)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        finally:
            proc.kill()
        took = time.monotonic() - start
    assert took < 2.0, took
    assert len(os.listdir(tmp_path)) == 2  # (the two that finished)


def test_launch_faults_sweeps_the_server_and_the_client():
    from launch import faults, faults_serving

    assert {"serve", "client"} <= set(faults.AREAS) and {"serve", "client"} <= set(faults.FLAGS["areas"].default)
    names = [c[0] for c in faults_serving.serve_cases()]
    assert len(names) == len(set(names)) >= 40
    assert len(faults_serving.client_cases()) >= 15
