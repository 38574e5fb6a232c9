"""Serve a model as an OpenAI-compatible endpoint: `python -m launch.serve --run=WORKDIR` (a
`launch.main` run's latest checkpoint) or `--hf=DIR` (a local Hugging Face checkpoint).

    python -m launch.serve --run=runs/default --port=8000
    python -m launch.eval --api_base=http://127.0.0.1:8000/v1 --model=default --per_cell=30
    python -m launch.main --config.engineer.kind=api --config.engineer.api_base=http://127.0.0.1:8000/v1 \
        --config.engineer.model=default --workdir=runs/api_engineer

GET /v1/models and POST /v1/chat/completions (messages, max_tokens, temperature, top_p, n, seed,
response_format json_schema, chat_template_kwargs.enable_thinking) over the project's Sampler:
t2t_jax/serving/server.py. Prints one JSON line (its URL) once the model is loaded; /v1/models
answers as soon as it listens. Serves until Ctrl-C / SIGTERM.
"""

if __name__ == "__main__":  # restart with the malloc tunable before jax loads: t2t_jax/hostenv.py
    from t2t_jax import hostenv

    hostenv.reexec_with_malloc_tunables()

import json

from absl import app, flags, logging

_RUN = flags.DEFINE_string("run", "", "A launch.main workdir (its config.json and latest checkpoint).")
_HF = flags.DEFINE_string("hf", "", "A local Hugging Face checkpoint directory.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.", lower_bound=1, upper_bound=65535)
_NAME = flags.DEFINE_string("name", "", "The model id clients ask for (default: the directory's name).")
_MAX_TOKENS = flags.DEFINE_integer(
    "max_tokens",
    None,
    "The largest max_tokens a request may ask (default: 4096, or the run's budget if larger).",
    lower_bound=1,
)
_THINKING = flags.DEFINE_bool("enable_thinking", False, "Thinking mode by default (for --hf; a request may override).")


def main(argv):
    del argv
    if bool(_RUN.value) == bool(_HF.value):
        raise app.UsageError("give exactly one of --run and --hf")
    logging.set_verbosity(logging.WARNING)
    import uvicorn

    from t2t_jax.serving.local import load_local
    from t2t_jax.serving.server import Backend, make_app

    local = load_local(_RUN.value, _HF.value, _THINKING.value)
    name = _NAME.value or local.name
    backend = Backend(local.policy, local.params, name, _MAX_TOKENS.value or max(local.max_new_tokens, 4096))
    config = uvicorn.Config(make_app(backend), host=_HOST.value, port=_PORT.value, log_level="warning")
    server = uvicorn.Server(config)
    url = f"http://{_HOST.value}:{_PORT.value}/v1"
    print(json.dumps({"serving": url, "model": name, "max_tokens": backend.max_tokens}), flush=True)
    server.run()


if __name__ == "__main__":
    from t2t_jax import cli

    cli.run(main)
