"""The paper's results table for a model: `python -m launch.eval --run=WORKDIR` (the latest
checkpoint of a `launch.main` run), `--hf=DIR` (a local Hugging Face Qwen3 checkpoint) or
`--api_base=URL --model=NAME` (any OpenAI-compatible chat endpoint: vLLM, SGLang, a hosted API,
`launch.serve`; the same prompts, parser, validator and tables, with token usage).

Writes, in --out (default: the run's workdir, or ./eval_<name>): results_table.{md,csv,json}
(3/4/5 agents, acc./opt. per map size, Sum = mean over sizes, the paper's reported rows beside
ours, mean completion tokens per cell; then the out-of-distribution sets of --ood, at most
--per_cell of their 50 boards per cell; the JSON also holds `board_valid`, one 0/1 per board)
and heatmap.png; each records its decoding (--decoding: greedy, the default; qwen3_thinking; or
sampled at --temperature / --top_p / --top_k). Through an API, replies are cached under
--out/api_cache, so an interrupted evaluation reruns without repeating a finished request;
failed requests (after --retries) score as unparsable answers and are counted in the tables'
usage line.

    python -m launch.eval --run=runs/default --per_cell=30
    python -m launch.eval --run=runs/default --per_cell=30 --samples=8 --temperature=0.7   # + avg@8, pass@8
    python -m launch.eval --hf=/ckpt/Qwen3-4B --enable_thinking --max_new_tokens=8192 --out=eval_base \
        --decoding=qwen3_thinking        # the table sampled at Qwen3's thinking settings (0.6, 0.95, 20)
    python -m launch.eval --api_base=http://127.0.0.1:8000/v1 --model=Qwen/Qwen3-4B --enable_thinking \
        --max_new_tokens=8192 --concurrency=32 --api_key_env=OPENAI_API_KEY
"""

import json
import os

from absl import app, flags, logging

from t2t_jax import cli
from t2t_jax.cli import check_out
from t2t_jax.errors import UserError

_RUN = flags.DEFINE_string("run", "", "A launch.main workdir (its config.json and latest checkpoint).")
_HF = flags.DEFINE_string("hf", "", "A local Hugging Face Qwen3 checkpoint directory.")
_API_BASE = flags.DEFINE_string("api_base", "", "An OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1.")
_MODEL = flags.DEFINE_string("model", "", "The model name at --api_base.")
_API_KEY_ENV = flags.DEFINE_string("api_key_env", "", "The environment variable holding the API key (for --api_base).")
_CONCURRENCY = flags.DEFINE_integer(
    "concurrency", 8, "Requests in flight (for --api_base).", lower_bound=1, upper_bound=1024
)
_TIMEOUT = flags.DEFINE_float(
    "timeout", 600.0, "Seconds per request (for --api_base).", lower_bound=0.001, upper_bound=86400.0
)
_RETRIES = flags.DEFINE_integer(
    "retries", 4, "Retries of a failed request, with backoff (for --api_base).", lower_bound=0, upper_bound=100
)
_OUT = flags.DEFINE_string("out", "", "Output directory (default: the run's workdir, or ./eval_<name>).")
_PER_CELL = flags.DEFINE_integer(
    "per_cell", None, "Boards per (agents, size) cell (default: all 150).", lower_bound=1, upper_bound=150
)
_MAX_NEW = flags.DEFINE_integer(
    "max_new_tokens", None, "Token budget (default: the run's, or 4096).", lower_bound=1, upper_bound=1 << 17
)
_BATCH = flags.DEFINE_integer("batch_size", 64, "Boards per decode batch.", lower_bound=1, upper_bound=4096)
_THINKING = flags.DEFINE_bool("enable_thinking", False, "Thinking mode (for --hf and --api_base).")
_STYLE = flags.DEFINE_string("prompt_style", "full", "Prompt style for --hf and --api_base (full, compact, offsets).")
_LABEL = flags.DEFINE_string("label", "", "The row name of this model in the tables.")
_SAMPLES = flags.DEFINE_integer(
    "samples", 0, "k > 0: also k sampled completions per board (avg@k, pass@k).", lower_bound=0, upper_bound=1024
)
_TEMPERATURE = flags.DEFINE_float(
    "temperature", 1.0, "Sampling temperature of --samples (> 0).", lower_bound=0.0, upper_bound=100.0
)
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus of --samples, in (0, 1] (checked in main).")
_TOP_K = flags.DEFINE_integer(
    "top_k", 0, "The k most likely tokens of --samples (0: all).", lower_bound=0, upper_bound=1_000_000
)
_DECODING = flags.DEFINE_string(
    "decoding",
    "greedy",
    "The table's decoding: greedy, qwen3_thinking (Qwen3's thinking-mode settings: temperature 0.6, top-p 0.95, "
    "top-k 20, for the table and --samples) or sampled (one completion per board at --temperature / --top_p / "
    "--top_k); seeded by --seed.",
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the --samples draws.", lower_bound=0, upper_bound=2**32 - 1)
_OOD = flags.DEFINE_string(
    "ood", "ood_6_agents,ood_dense", "Out-of-distribution sets scored too (the table's decoding; '' for none)."
)

cli.finite("timeout", "temperature", "top_p")

MAX_RECORD_BYTES = 256 << 20  # a checkpoint's JSON record (and its checksums) larger than this is refused


def _read_json(path: str):
    """A JSON file, bounded (t2t_jax/env/io.py `loads_bounded`); UserError names the file."""
    from t2t_jax.env import io

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_RECORD_BYTES + 1)
        if len(raw) > MAX_RECORD_BYTES:
            raise ValueError(f"{path}: larger than {MAX_RECORD_BYTES} bytes")
        return io.loads_bounded(raw.decode("utf-8"), path)
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start + 1})") from None
    except (OSError, ValueError) as e:
        raise UserError(str(e) if not isinstance(e, OSError) else f"{path}: {e.strerror}") from None


def checkpoint_problem(step_dir: str) -> str | None:
    """What is wrong with a checkpoint directory, read-only (None: intact): its checksums record
    (t2t_jax/checkpoint.py CHECKSUMS) must exist, list every file of the step as [size, sha256]
    and match them, and its JSON record (meta/metadata, a RunRecord) must hold the record's
    fields with their types."""
    from t2t_jax.checkpoint import CHECKSUMS, file_digests
    from t2t_jax.runrecord import PHASES

    path = os.path.join(step_dir, CHECKSUMS)
    if not os.path.isfile(path):
        return f"{path} is missing: the checkpoint cannot be verified"
    try:
        expected = _read_json(path)
    except UserError as e:
        return str(e)
    if not isinstance(expected, dict) or not expected:
        return f"{path}: not a record of the checkpoint's files (a JSON object of path: [size, sha256])"
    for rel, entry in expected.items():
        ok = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str)
        if not ok or not isinstance(entry[0], int) or isinstance(entry[0], bool) or entry[0] < 0:
            return f"{path}: {rel}: {entry!r} is not [size, sha256]"
    actual = file_digests(step_dir)
    for rel in sorted(set(actual) | set(expected)):
        if rel not in expected:
            return f"{path} does not list {rel}"
        if rel not in actual:
            return f"{os.path.join(step_dir, rel)} is missing"
        if actual[rel] != expected[rel]:
            return f"{os.path.join(step_dir, rel)} differs from what was written ({CHECKSUMS})"
    meta_path = os.path.join(step_dir, "meta", "metadata")
    if not os.path.isfile(meta_path):
        return f"{meta_path} is missing (the run's record)"
    try:
        meta = _read_json(meta_path)
    except UserError as e:
        return str(e)
    if not isinstance(meta, dict):
        return f"{meta_path}: the run's record is not a JSON object"
    if meta.get("phase") not in PHASES:
        return f"{meta_path}: phase: {meta.get('phase')!r} is not one of {list(PHASES)}"
    for name in ("stage", "step", "counter"):
        value = meta.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 2**31 - 1:
            return f"{meta_path}: {name}: {value!r} is not an integer in [0, {2**31 - 1}]"
    for name in ("history", "weights", "records", "results", "accounts"):
        if not isinstance(meta.get(name), list):
            return f"{meta_path}: {name}: {meta.get(name)!r} is not a list"
    return None


def check_run(run: str) -> None:
    """--run, checked read-only before any work: a launch.main run directory (config.json, a JSON
    object) whose newest checkpoint is intact (`checkpoint_problem`). launch.eval evaluates that
    checkpoint and writes nothing into the run: a damaged one is refused, naming the file
    (`launch.main --resume` is what falls back to an older one, moving the damaged aside)."""
    if "://" in run:
        return  # (remote run directories: the checkpointer's own checks)
    if not os.path.isdir(run):
        raise UserError(f"--run: {run} is not a directory")
    config = os.path.join(run, "config.json")
    if not os.path.isfile(config):
        raise UserError(f"--run: {run} holds no config.json (not a launch.main run directory)")
    if not isinstance(_read_json(config), dict):
        raise UserError(f"--run: {config} is not a JSON object (the run's config)")
    directory = os.path.join(run, "checkpoints")
    steps = sorted(int(d) for d in (os.listdir(directory) if os.path.isdir(directory) else ()) if d.isdigit())
    if not steps:
        raise UserError(f"--run: no checkpoint under {directory}")
    problem = checkpoint_problem(os.path.join(directory, str(steps[-1])))
    if problem:
        raise UserError(
            f"--run: the latest checkpoint ({steps[-1]}) is damaged: {problem}; launch.eval evaluates only an "
            "intact latest checkpoint (launch.main --resume falls back to an older one)"
        )


def main(argv):
    del argv
    if sum(map(bool, (_RUN.value, _HF.value, _API_BASE.value))) != 1:
        raise app.UsageError("give exactly one of --run, --hf and --api_base")
    if _API_BASE.value and not _MODEL.value:
        raise app.UsageError("--model: the model name at --api_base is required")
    if _API_BASE.value and not _API_BASE.value.startswith(("http://", "https://")):
        raise app.UsageError(f"--api_base: {_API_BASE.value!r} is not an http:// or https:// URL")
    if _API_KEY_ENV.value and _API_KEY_ENV.value not in os.environ:
        raise app.UsageError(f"--api_key_env: the environment variable {_API_KEY_ENV.value} is not set")
    if (_SAMPLES.value or _DECODING.value == "sampled") and not _TEMPERATURE.value > 0:
        raise app.UsageError(f"--temperature {_TEMPERATURE.value} must be > 0 with --samples or --decoding=sampled")
    if not 0 < _TOP_P.value <= 1:
        raise app.UsageError(f"--top_p {_TOP_P.value} must be in (0, 1]")
    from t2t_jax.evaluation import decoding

    try:
        table = decoding.resolve(_DECODING.value, _TEMPERATURE.value, _TOP_P.value, _TOP_K.value)
    except ValueError as e:
        raise app.UsageError(f"--{e}") from None
    if table["temperature"]:  # a preset fixes all three; given flags would be ignored
        for name in ("temperature", "top_p", "top_k"):
            if flags.FLAGS[name].present and _DECODING.value != "sampled":
                raise app.UsageError(
                    f"--{name}: --decoding={_DECODING.value} fixes it ({table[name]}); use --decoding=sampled"
                )
    # --samples draw at the table's settings where it samples, else at --temperature / --top_p / --top_k
    given = decoding.resolve("sampled", _TEMPERATURE.value, _TOP_P.value, _TOP_K.value)
    sampling = table if table["temperature"] else given
    logging.set_verbosity(logging.WARNING)
    from t2t_jax.evaluation import benchmark, sets
    from t2t_jax.text.prompts import PROMPT_STYLES

    if _STYLE.value not in PROMPT_STYLES:
        raise app.UsageError(f"--prompt_style: {_STYLE.value!r} is not one of {PROMPT_STYLES}")
    try:
        ood_sets = sets.parse_ood(_OOD.value)
    except ValueError as e:
        raise app.UsageError(f"--{e}") from None

    if _API_BASE.value:
        from t2t_jax.serving.api_policy import ApiPolicy
        from t2t_jax.serving.client import ChatClient

        out = _OUT.value or f"eval_{_MODEL.value.replace('/', '_')}"
        check_out(out)
        client = ChatClient(
            _API_BASE.value,
            _MODEL.value,
            api_key=os.environ[_API_KEY_ENV.value] if _API_KEY_ENV.value else None,
            timeout=_TIMEOUT.value,
            retries=_RETRIES.value,
            concurrency=_CONCURRENCY.value,
            cache_dir=os.path.join(out, "api_cache"),
        )
        policy = ApiPolicy(client, enable_thinking=_THINKING.value, style=_STYLE.value)
        params, budget, label = None, _MAX_NEW.value or 4096, _LABEL.value or _MODEL.value
    else:
        from t2t_jax.serving.local import load_local

        check_out(_OUT.value or (_RUN.value or "."))
        if _RUN.value:
            check_run(_RUN.value)
        elif not os.path.isfile(os.path.join(_HF.value, "config.json")):
            raise UserError(f"--hf: {_HF.value} holds no config.json (a Hugging Face checkpoint directory)")
        local = load_local(_RUN.value, _HF.value, _THINKING.value, _STYLE.value)
        policy, params, name = local.policy, local.params, local.name
        budget = _MAX_NEW.value or local.max_new_tokens
        out, label = _OUT.value or (_RUN.value or f"eval_{name}"), _LABEL.value or name
    boards = benchmark.benchmark_boards(_PER_CELL.value)
    kw = dict(max_new_tokens=budget, batch_size=_BATCH.value, reward_weights={"valid": 1.0}, progress=True)
    table_kw = benchmark.table_decoding(table, _SEED.value)
    rollouts = benchmark.evaluate(policy, params, boards, **table_kw, **kw)
    draws = {k: sampling[k] for k in ("temperature", "top_p", "top_k")}  # (of --samples)
    sampled = None
    if _SAMPLES.value:
        k = _SAMPLES.value
        sampled = benchmark.evaluate(
            policy, params, boards, samples=k, seed=_SEED.value, desc=f"avg@{k}", **draws, **kw
        )
    record = decoding.record(table, _SEED.value, budget, policy.enable_thinking)
    entry = benchmark.results_entry(label, rollouts, sampled, k=_SAMPLES.value, decoding=record, **draws)
    if ood_sets:
        per_cell = min(_PER_CELL.value, 50) if _PER_CELL.value else None
        entry["ood"] = benchmark.evaluate_ood(policy, params, ood_sets, per_cell, **table_kw, **kw)
    if _API_BASE.value:
        entry["usage"] = dict(policy.usage)
    paths = benchmark.write_tables(out, entry, label=label)
    summary = {
        "valid": entry["valid"],
        "optimal": entry["optimal"],
        "boards": entry["boards"],
        "mean_tokens": entry["mean_tokens"],
        "decoding": entry["decoding"],
    }
    if "usage" in entry:
        summary["usage"] = entry["usage"]
    if entry.get("ood"):
        summary["ood"] = {n: {"valid": e["valid"], "optimal": e["optimal"]} for n, e in entry["ood"].items()}
    if sampled is not None:
        k = _SAMPLES.value
        summary.update(
            {
                f"avg@{k}_valid": entry["sampled"]["avg_valid"],
                f"pass@{k}_valid": entry["sampled"]["pass_valid"],
                f"avg@{k}_optimal": entry["sampled"]["avg_optimal"],
                f"pass@{k}_optimal": entry["sampled"]["pass_optimal"],
            }
        )
    print(json.dumps({**summary, **paths}))


if __name__ == "__main__":
    cli.run(main)
