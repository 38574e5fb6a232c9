"""The OpenAI-compatible seam, over real HTTP on localhost: the client against scripted servers
(retries, timeouts, 500s, malformed bodies, servers without structured output, the disk cache),
the `api` engineer, and `launch.serve`'s backend over the embedded tiny model against the
in-process policy (the same texts, lengths and verdicts). The launchers end to end, as
processes, are in tests/test_stages.py."""

import asyncio
import json
import threading
import time
import types

import numpy as np
import pytest
import uvicorn
from conftest import free_port
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, PlainTextResponse

from t2t_jax.engineer import context, propose
from t2t_jax.engineer.engineer import Engineer
from t2t_jax.env.config import make_config
from t2t_jax.rl.rewards import ACCURACY_FIRST
from t2t_jax.rollout import Policy
from t2t_jax.serving.client import ChatClient, Request

CONFIG = make_config([{"size": [3, 4], "agents": 2, "hole_density": [0.0, 0.2]}])
MESSAGES = ({"role": "user", "content": "hello"},)


class Serve:
    """A uvicorn server in a thread: `with Serve(app) as url:` (url ends in /v1)."""

    def __init__(self, app):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


def completion(text, finish="stop"):
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }


def scripted(script, answer="Agent 0: RIGHT"):
    """An endpoint that answers request i by script[i] (the last entry repeats): ok, 500,
    garbage (a 200 whose body is not JSON), sleep (1 s, then ok), 400, no_schema (400 when
    response_format is sent). `app.state.seen` holds the request bodies."""
    app = FastAPI()
    app.state.seen = []

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest):
        body = await request.json()
        app.state.seen.append(body)
        mode = script[min(len(app.state.seen), len(script)) - 1]
        if mode == "500":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if mode == "garbage":
            return PlainTextResponse('{"choices": [', media_type="application/json")
        if mode == "400" or (mode == "no_schema" and "response_format" in body):
            return JSONResponse({"error": {"message": "unsupported", "type": "invalid_request_error"}}, 400)
        if mode == "sleep":
            await asyncio.sleep(1.0)
        return completion(answer)

    return app


def client(url, **kw):
    return ChatClient(url, "m", **{"retries": 3, "backoff": 0.01, **kw})


def test_retries_a_500_and_a_malformed_body_then_succeeds():
    app = scripted(["500", "garbage", "ok"])
    with Serve(app) as url:
        reply = client(url).complete(Request(MESSAGES, max_tokens=8))
    assert (reply.text, reply.finish_reason, reply.attempts) == ("Agent 0: RIGHT", "stop", 3)
    assert (reply.prompt_tokens, reply.completion_tokens, reply.error) == (7, 3, "")
    assert len(app.state.seen) == 3


def test_a_server_that_keeps_failing_is_recorded_not_raised_nor_cached(tmp_path):
    app = scripted(["500"])
    with Serve(app) as url:
        reply = client(url, retries=2, cache_dir=str(tmp_path)).complete(Request(MESSAGES, max_tokens=8))
    assert reply.finish_reason == "error" and reply.attempts == 3 and "InternalServerError" in reply.error
    assert len(app.state.seen) == 3 and not list(tmp_path.iterdir())


def test_a_timeout_is_retried_then_recorded():
    app = scripted(["sleep"])
    with Serve(app) as url:
        reply = client(url, retries=1, timeout=0.3).complete(Request(MESSAGES, max_tokens=8))
    assert reply.finish_reason == "error" and "Timeout" in reply.error and len(app.state.seen) == 2


def test_a_client_error_is_not_retried():
    app = scripted(["400"])
    with Serve(app) as url:
        reply = client(url).complete(Request(MESSAGES, max_tokens=8))
    assert reply.finish_reason == "error" and reply.attempts == 1 and "BadRequestError" in reply.error


def test_without_structured_output_the_request_is_sent_again_free():
    app = scripted(["no_schema"], answer='{"a": 1}')
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    with Serve(app) as url:
        reply = client(url).complete(Request(MESSAGES, max_tokens=8, response_format=fmt))
    assert reply.schema_dropped and reply.text == '{"a": 1}'
    assert "response_format" in app.state.seen[0] and "response_format" not in app.state.seen[1]


def test_the_cache_resumes_without_repeating_requests_and_duplicates_go_once(tmp_path):
    app = scripted(["ok"])
    one, two = Request(MESSAGES, max_tokens=8), Request(MESSAGES, max_tokens=8, temperature=0.7, seed=3)
    with Serve(app) as url:
        first = client(url, cache_dir=str(tmp_path)).complete_many([one, one, two])
        assert len(app.state.seen) == 2 and [r.cached for r in first] == [False] * 3
        again = client(url, cache_dir=str(tmp_path)).complete_many([two, one])
    assert len(app.state.seen) == 2 and all(r.cached for r in again)
    assert sorted(s.get("seed", -1) for s in app.state.seen) == [-1, 3]
    assert [r.text for r in again] == [first[2].text, first[0].text]


def account_of(texts):
    """The failure account of two 3x3 boards answered with `texts`."""
    boards = [
        {"size": 3, "holes": [], "starts": [[0, 0], [2, 2]], "goals": [[0, 1], [2, 1]], "optimal_makespan": 1},
        {"size": 3, "holes": [[1, 1]], "starts": [[0, 0], [2, 0]], "goals": [[1, 0], [2, 1]], "optimal_makespan": 1},
    ]
    boards = [{**b, "bucket": 0} for b in boards]
    none = np.zeros((2, 0), np.int32)
    ro = Policy(None, None, style="compact").score(
        boards, texts, np.zeros(2, bool), np.full(2, 5), 64, ACCURACY_FIRST, (none, none > 0), none, none * 1.0
    )
    return context.build_account(0, CONFIG, ACCURACY_FIRST, ro, cases=1)


def api_config(url, **kw):
    return types.SimpleNamespace(
        **{
            "kind": "api",
            "api_base": url,
            "model": "m",
            "api_key_env": "",
            "api_timeout": 5.0,
            "api_retries": 1,
            "edit_mode": "selective",
            "evidence": "raw",
            "failure_cases": 1,
            "constrained": True,
            "max_tokens": 200,
            "temperature": 0.7,
            "top_p": 1.0,
            "agent_range": (1, 5),
            "max_edits": 2,
            "sections": "statistics,breakdown,training,cases,history",
            "efficiency_threshold": 0.6,
            "reward_guard": True,
            **kw,
        }
    )


def test_the_api_engineer_sends_the_schema_and_its_proposal_is_checked():
    edit = {"bucket": 0, "size": [3, 5], "agents": [2, 2], "hole_density": [0.0, 0.1], "min_distance": 1, "weight": 1}
    text = json.dumps({"edits": [edit], "reward_weights": {"valid": 1.0, "optimal": 0.5, "efficiency": 0, "length": 0}})
    account = account_of(["Agent 0: RIGHT\nAgent 1: LEFT", "nonsense"])
    app = scripted(["ok"], answer=text)
    with Serve(app) as url:
        record = Engineer(api_config(url), None).propose(None, account, CONFIG, CONFIG, ACCURACY_FIRST)
    assert record["kind"] == "api" and record["accepted"] and record["text"] == text
    assert record["config"]["buckets"][0]["size"] == [3, 5]
    assert record["api_calls"] == [{"attempts": 1, "schema_dropped": False, "prompt_tokens": 7, "completion_tokens": 3}]
    sent = app.state.seen[0]
    assert sent["response_format"]["json_schema"]["schema"] == propose.proposal_schema(CONFIG, (1, 5), 2)
    assert sent["messages"][-1]["content"] == record["prompt"] and sent["temperature"] == 0.7
    # Unconstrained, no response_format goes out; a server that fails is a rejection, not a crash.
    app = scripted(["500"])
    with Serve(app) as url:
        record = Engineer(api_config(url, constrained=False), None).propose(
            None, account, CONFIG, CONFIG, ACCURACY_FIRST
        )
    assert not record["accepted"] and "the API call failed after 2 attempts" in record["reason"]
    assert record["config"] == CONFIG.to_json() and "response_format" not in app.state.seen[0]


@pytest.fixture(scope="module")
def served():
    """The embedded tiny model (random weights) in process and behind launch.serve's backend."""
    from flax import nnx

    from t2t_jax.models import qwen3
    from t2t_jax.sampling import Sampler
    from t2t_jax.serving.server import Backend, make_app
    from t2t_jax.text.tokenizer import load_tokenizer, stop_ids

    tok = load_tokenizer()
    model = qwen3.Qwen3(qwen3.PRESETS["tiny"], rngs=nnx.Rngs(0))
    policy = Policy(Sampler(model, stop_ids(tok), tok.pad_token_id), tok, style="compact")
    with Serve(make_app(Backend(policy, None, "tiny", max_tokens=64))) as url:
        yield policy, url


def test_the_served_model_answers_as_the_in_process_one(served):
    """Greedy through HTTP (one request per board) = greedy in process (a batch of boards):
    the same texts, completion lengths, truncation and verdicts."""
    import jax

    from t2t_jax.env import io
    from t2t_jax.env.certified import CertifiedGenerator
    from t2t_jax.evaluation import benchmark
    from t2t_jax.serving.api_policy import ApiPolicy

    policy, url = served
    boards = io.boards_with_plans_to_json(*CertifiedGenerator(CONFIG, chunk=64)(jax.random.key(1), 4))
    kw = dict(max_new_tokens=24, batch_size=4, reward_weights=ACCURACY_FIRST)
    here = benchmark.evaluate(policy, None, boards, **kw)
    api = ApiPolicy(ChatClient(url, "tiny"), style="compact")
    there = benchmark.evaluate(api, None, boards, **kw)
    assert there.texts == here.texts
    assert there.lengths.tolist() == here.lengths.tolist() and there.truncated.tolist() == here.truncated.tolist()
    assert np.array_equal(there.verdicts.valid, here.verdicts.valid)
    assert np.array_equal(there.plans.parse_status, here.plans.parse_status)
    assert api.usage["requests"] == 4 and api.usage["completion_tokens"] == int(here.lengths.sum())


def test_the_server_samples_n_decodes_under_a_schema_and_names_bad_fields(served):
    import jsonschema
    import openai

    _, url = served
    api = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
    assert [m.id for m in api.models.list().data] == ["tiny"]
    out = api.chat.completions.create(
        model="tiny", messages=list(MESSAGES), max_tokens=12, temperature=1.0, n=3, seed=5
    )
    assert len(out.choices) == 3 and out.usage.completion_tokens <= 36
    assert {c.finish_reason for c in out.choices} <= {"stop", "length"}
    schema = {
        "type": "object",
        "properties": {"size": {"enum": [3, 4, 5]}, "ok": {"type": "boolean"}},
        "required": ["size", "ok"],
    }
    out = api.chat.completions.create(
        model="tiny",
        messages=list(MESSAGES),
        max_tokens=40,
        temperature=1.0,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    )
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)
    for bad, field in (
        ({"max_tokens": 10_000}, "max_tokens"),
        ({"temperature": 5.0}, "temperature"),
        ({"stream": True}, "stream"),
        ({"model": "gpt-9"}, "model"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ):
        kw = {"model": "tiny", "messages": list(MESSAGES), "max_tokens": 8, **bad}
        with pytest.raises(openai.BadRequestError) as e:
            api.chat.completions.create(**kw)
        assert field in str(e.value), (bad, str(e.value))


def test_the_served_model_refuses_a_prompt_beyond_its_context_and_answers_the_next(served):
    """A prompt of ~4,200 tokens on the tiny model's 4,096 context is a 400 naming both lengths
    (nothing allocated for it), and a normal request is answered after it."""
    import openai

    _, url = served
    api = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
    long = [{"role": "user", "content": "word " * 1400}]
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model="tiny", messages=long, max_tokens=8)
    assert "maximum context length is 4096 tokens" in str(e.value) and "in the messages" in str(e.value)
    out = api.chat.completions.create(model="tiny", messages=list(MESSAGES), max_tokens=8, temperature=0)
    assert out.choices[0].finish_reason in ("stop", "length") and out.usage.completion_tokens <= 8
