"""Serve a model as an OpenAI-compatible endpoint: `python -m launch.serve --run=WORKDIR` (a
`launch.main` run's latest checkpoint), `--hf=DIR` (a local Hugging Face checkpoint) or `--tiny`
(the embedded tiny model, random weights: load tests and fault sweeps).

    python -m launch.serve --run=runs/default --port=8000
    python -m launch.eval --api_base=http://127.0.0.1:8000/v1 --model=default --per_cell=30
    python -m launch.main --config.engineer.kind=api --config.engineer.api_base=http://127.0.0.1:8000/v1 \
        --config.engineer.model=default --workdir=runs/api_engineer
    T2T_JAX_API_KEY=secret python -m launch.serve --run=runs/default --host=0.0.0.0   # beyond loopback: a key

GET /health, GET /v1/models and POST /v1/chat/completions (messages, max_tokens, temperature,
top_p, n, seed, response_format json_schema, chat_template_kwargs.enable_thinking) over the
project's sampler: t2t_jax/serving/server.py (its limits: the flags below). Listens on 127.0.0.1
unless --host says otherwise, and then only with an API key (--api_key or $T2T_JAX_API_KEY,
checked as `Authorization: Bearer KEY`). Prints one JSON line (its URL) once the model is loaded
and the port is bound. Serves until Ctrl-C / SIGTERM.
"""

import json
import os

from absl import app, flags, logging

_RUN = flags.DEFINE_string("run", "", "A launch.main workdir (its config.json and latest checkpoint).")
_HF = flags.DEFINE_string("hf", "", "A local Hugging Face checkpoint directory.")
_TINY = flags.DEFINE_bool("tiny", False, "Serve the embedded tiny model with random weights (load tests).")
_HOST = flags.DEFINE_string(
    "host", "127.0.0.1", "Address to listen on (beyond loopback, e.g. 0.0.0.0, only with an API key)."
)
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on (0: any free port).", lower_bound=0, upper_bound=65535)
_NAME = flags.DEFINE_string("name", "", "The model id clients ask for (default: the directory's name).")
_MAX_TOKENS = flags.DEFINE_integer(
    "max_tokens",
    None,
    "The largest max_tokens a request may ask (default: 4096, or the run's budget if larger).",
    lower_bound=1,
)
_THINKING = flags.DEFINE_bool("enable_thinking", False, "Thinking mode by default (for --hf; a request may override).")
_API_KEY = flags.DEFINE_string(
    "api_key", None, "Require `Authorization: Bearer KEY` (default: $T2T_JAX_API_KEY; needed beyond loopback)."
)
_DOCS = flags.DEFINE_bool("docs", False, "Serve /docs and /openapi.json.")
_CONTEXT = flags.DEFINE_integer(
    "max_model_len", 0, "Prompt + max_tokens limit (0: the model's max_position_embeddings).", lower_bound=0
)
_MAX_QUEUE = flags.DEFINE_integer(
    "max_queue", 64, "Requests in flight before the server answers 429 (with Retry-After).", lower_bound=1
)
_MAX_BODY = flags.DEFINE_integer("max_body_bytes", 1 << 20, "Largest request body (413 beyond).", lower_bound=1024)
_MAX_MESSAGES = flags.DEFINE_integer("max_messages", 1024, "Most messages in one request.", lower_bound=1)
_READ_TIMEOUT = flags.DEFINE_float(
    "read_timeout", 10.0, "Seconds a request's headers and body may take to arrive.", lower_bound=0.1
)
_MAX_CONNECTIONS = flags.DEFINE_integer(
    "max_connections", 512, "Open connections before the server answers 503.", lower_bound=1
)
_SCHEMA_TIMEOUT = flags.DEFINE_float(
    "schema_timeout", 10.0, "Seconds a response_format schema may take to compile.", lower_bound=0.1
)
_SCHEMA_CACHE = flags.DEFINE_integer("schema_cache", 16, "Compiled schemas kept (an LRU).", lower_bound=1)
_MAX_STATES = flags.DEFINE_integer("schema_states", 20_000, "Most states of a schema's automaton.", lower_bound=1)


def main(argv):
    del argv
    if sum(map(bool, (_RUN.value, _HF.value, _TINY.value))) != 1:
        raise app.UsageError("give exactly one of --run, --hf and --tiny")
    from t2t_jax.serving.server import Limits, is_loopback

    key = _API_KEY.value if _API_KEY.value is not None else os.environ.get("T2T_JAX_API_KEY", "")
    if not is_loopback(_HOST.value) and not key:
        raise app.UsageError(
            f"--host: {_HOST.value} is reachable beyond this machine; give --api_key (or set T2T_JAX_API_KEY)"
        )
    limits = Limits(
        context=_CONTEXT.value,
        max_body_bytes=_MAX_BODY.value,
        max_messages=_MAX_MESSAGES.value,
        max_queue=_MAX_QUEUE.value,
        read_timeout=_READ_TIMEOUT.value,
        max_connections=_MAX_CONNECTIONS.value,
        schema_timeout=_SCHEMA_TIMEOUT.value,
        schema_cache=_SCHEMA_CACHE.value,
        max_states=_MAX_STATES.value,
        api_key=key,
        docs=_DOCS.value,
    )
    logging.set_verbosity(logging.WARNING)
    import socket

    import uvicorn

    from t2t_jax.serving.local import load_local
    from t2t_jax.serving.server import Backend, make_app, server_config

    local = load_local(_RUN.value, _HF.value, _THINKING.value, tiny=_TINY.value)
    name = _NAME.value or local.name
    backend = Backend(local.policy, local.params, name, _MAX_TOKENS.value or max(local.max_new_tokens, 4096), limits)
    backend.compiler.warm()
    import gc

    gc.collect()
    gc.freeze()  # (the model's and libraries' objects out of the collector's sweeps: no long GC pauses mid-request)
    family = socket.AF_INET6 if ":" in _HOST.value else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((_HOST.value.strip("[]"), _PORT.value))
    except OSError as e:
        raise app.UsageError(f"--port: cannot listen on {_HOST.value}:{_PORT.value} ({e.strerror})") from None
    sock.listen(2048)  # (connections wait in the backlog until the server accepts them)
    port = sock.getsockname()[1]
    server = uvicorn.Server(server_config(make_app(backend), _HOST.value, port, limits))
    host = f"[{_HOST.value}]" if ":" in _HOST.value and not _HOST.value.startswith("[") else _HOST.value
    line = {"serving": f"http://{host}:{port}/v1", "model": name, "max_tokens": backend.max_tokens}
    print(json.dumps({**line, "context": backend.context, "auth": bool(key)}), flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        backend.close()


if __name__ == "__main__":
    from t2t_jax import cli

    cli.run(main)
