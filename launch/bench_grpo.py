"""The whole GRPO step against TRL's `GRPOTrainer` on this CPU: same weights, prompts, reward, settings.

  python -m launch.bench_grpo [--shapes=tiny,100m] [--prompts=4] [--group_size=8] [--max_new_tokens=64]
      [--temperature=1.0] [--repeats=3] [--learning_steps=0] [--learning_shapes=tiny] [--torch_threads=0]

Both sides start from one Qwen3 preset's random weights, exported by `qwen3.save_pretrained` and
loaded back by each (`qwen3.from_pretrained`, transformers' `Qwen3ForCausalLM`), and take the
same MAPF boards (the shipped 3-agent eval set, cut to boards whose prompts fall in one length
bucket), in order: step i trains on boards [i * prompts, (i + 1) * prompts). Ours is the stage
loop's step (rl/step.py `grpo_step`: the Policy's rollout on the continuous-batching engine, the
Trainer's jitted update with shared prompts); TRL's is `GRPOTrainer` with `transformers.generate`,
our validator as its reward function (the same `Policy.score` on the same decoded text). Both:
group size, prompts, completion budget, temperature (top-k 0, top-p 1), `dapo` loss, clip
0.2 / 0.28, beta 0, rewards scaled by the group's std, AdamW (constant rate, b2 0.99, no
decay, grad norm 1), one optimizer step per batch, float32. The sides alternate step by step
(TRL's step, then ours, from a TRL callback); the first step of each is a warm-up (our
compiles), the next --repeats are timed, from prompts to updated weights.

Prints JSON lines: `platform`; `grpo_step_{shape}`: seconds per step (median of the repeats;
every repeat in `*_steps_s`), the rollout's share (generation and reward) and the update's
(the rest), completion tokens/s and `ratio` = TRL's seconds / ours (> 1: ours is faster).
--learning_steps=N adds `grpo_learning_{shape}`: N steps of each side from the same weights at
--learning_rate on fresh boards, the mean reward per step (with a `length` penalty: random
weights earn no accuracy reward, so the signal is learning to stop) and whether the curves
agree within two standard errors. Without TRL (`pip install -e ".[bench]"`) our side runs alone
and a `skipped` row says why.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import numpy as np
from absl import flags
from flax import nnx

from t2t_jax import cli
from t2t_jax.env.io import read_jsonl
from t2t_jax.models import qwen3
from t2t_jax.perf import PhaseTimer
from t2t_jax.rl.grpo import LossSettings
from t2t_jax.rl.rewards import ACCURACY_FIRST
from t2t_jax.rl.step import StepSettings, grpo_step
from t2t_jax.rl.trainer import OptimSettings, Trainer, TrainSettings
from t2t_jax.rollout import Policy
from t2t_jax.sampling.engine import make_sampler
from t2t_jax.text.prompts import PROMPT_STYLES, bucket_length, render_chat
from t2t_jax.text.tokenizer import load_tokenizer, stop_ids

FLAGS = flags.FLAGS
flags.DEFINE_list("shapes", ["tiny", "100m"], "Presets to measure.")
flags.DEFINE_integer("prompts", 4, "Boards (groups) per step.", lower_bound=1, upper_bound=256)
flags.DEFINE_integer("group_size", 8, "Samples per board.", lower_bound=2, upper_bound=256)
flags.DEFINE_integer("max_new_tokens", 64, "Completion budget.", lower_bound=1, upper_bound=4096)
flags.DEFINE_float("temperature", 1.0, "Sampling temperature (top-k 0, top-p 1).", lower_bound=0.05, upper_bound=10)
flags.DEFINE_integer("repeats", 3, "Timed steps per side after one warm-up step.", lower_bound=1, upper_bound=100)
flags.DEFINE_float("learning_rate", 1e-6, "AdamW's rate of the timed steps.", lower_bound=0, upper_bound=1)
flags.DEFINE_integer("learning_steps", 0, "Steps of the learning check (0: none).", lower_bound=0, upper_bound=1000)
flags.DEFINE_list("learning_shapes", ["tiny"], "Shapes of the learning check.")
flags.DEFINE_float("learning_check_rate", 1e-3, "AdamW's rate of the learning check.", lower_bound=0, upper_bound=1)
flags.DEFINE_string("style", "offsets", "Prompt style (configs/stage.py's).")
flags.DEFINE_integer(
    "torch_threads", 0, "PyTorch's threads on TRL's side (0: torch's default).", lower_bound=0, upper_bound=1024
)
flags.DEFINE_integer("seed", 0, "Sampling seed of both sides.", lower_bound=0, upper_bound=2**31 - 1)
cli.one_of("shapes", qwen3.PRESETS)
cli.one_of("learning_shapes", qwen3.PRESETS)
cli.one_of("style", PROMPT_STYLES)
cli.finite("temperature", "learning_rate", "learning_check_rate")

BOARDS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "t2t_jax/evaluation/data")
LEARNING_WEIGHTS = ACCURACY_FIRST | {"length": 1.0}


def boards(tok, style: str, count: int, offset: int = 0) -> list[dict]:
    """`count` boards of the 3-agent eval set whose prompts fall in its most common length bucket
    (one compiled shape per side), from the `offset`-th such board on."""
    pool = read_jsonl(os.path.join(BOARDS, "mapf_3_agents.jsonl"))
    texts = [render_chat(tok, b, False, style) for b in pool]
    lengths = [bucket_length(len(tok(t, add_special_tokens=False).input_ids)) for t in texts]
    bucket = collections.Counter(lengths).most_common(1)[0][0]
    picked = [b for b, n in zip(pool, lengths) if n == bucket][offset : offset + count]
    if len(picked) < count:
        raise ValueError(f"only {len(picked)} boards of the bucket {bucket} from {offset} on; asked for {count}")
    return picked


def settings(lr: float) -> dict:
    """Every setting both sides share (printed beside the figures)."""
    return dict(
        prompts=FLAGS.prompts,
        group_size=FLAGS.group_size,
        max_new_tokens=FLAGS.max_new_tokens,
        temperature=FLAGS.temperature,
        top_k=0,
        top_p=1.0,
        loss_type="dapo",
        epsilon_low=0.2,
        epsilon_high=0.28,
        beta=0.0,
        scale_rewards="group",
        learning_rate=lr,
        adam_b1=0.9,
        adam_b2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        prompt_style=FLAGS.style,
        dtype="float32",
    )


def scorer(policy: Policy, weights: dict, budget: int):
    """Completion token lists (each ending at its stop token, if any) of `boards` -> Rollouts,
    scored as our rollout scores its own samples (decoded, parsed, validated, rewarded)."""
    stops = set(np.asarray(policy.sampler.stop_ids).tolist())

    def score(boards, completion_ids):
        lengths = np.array([len(c) for c in completion_ids], np.int32)
        tokens = np.zeros((len(boards), budget), np.int32)
        for row, ids in zip(tokens, completion_ids):
            row[: len(ids)] = ids
        truncated = np.array([n == budget and c[-1] not in stops for n, c in zip(lengths, completion_ids)])
        empty = np.zeros((len(boards), 1), np.int32)
        return policy.score(
            boards,
            policy.decode(tokens, lengths),
            truncated,
            lengths,
            budget,
            weights,
            prompt=(empty, empty.astype(bool)),
            tokens=tokens,
            logprobs=np.zeros(tokens.shape, np.float32),
        )

    return score


class Ours:
    """The stage loop's GRPO step on the checkpoint at `path`."""

    def __init__(self, path: str, tok, lr: float, weights: dict):
        model = qwen3.from_pretrained(path)
        self.timer = PhaseTimer()
        sampler = make_sampler(model, stop_ids(tok), tok.pad_token_id)  # (the stage's default: the engine)
        self.policy = Policy(sampler, tok, style=FLAGS.style, timer=self.timer)
        optim = OptimSettings(lr, 1, 2, 1.0, 0.9, 0.99, 0.0, 1.0)  # (constant: warm-up 1, decay to 1.0 x)
        loss = LossSettings("dapo", epsilon_low=0.2, epsilon_high=0.28, beta=0.0)
        train = TrainSettings(optim, loss, logprob_chunk=256, temperature=FLAGS.temperature)
        train = dataclasses.replace(train, group_size=FLAGS.group_size, share_prompts=True)
        self.trainer = Trainer(model, train)
        self.state = self.trainer.init()
        self.weights = weights
        self.settings = StepSettings(
            prompts=FLAGS.prompts,
            group_size=FLAGS.group_size,
            dynamic_sampling=False,
            dynamic_sampling_rounds=0,
            informative="accuracy",
            guidance="none",
            scale_rewards="group",
            control="none",
            old_logprobs="recompute",
            num_iterations=1,
            beta=0.0,
            max_new_tokens=FLAGS.max_new_tokens,
            temperature=FLAGS.temperature,
            top_k=0,
            top_p=1.0,
            seed=FLAGS.seed,
        )

    def step(self, boards: list[dict], i: int) -> dict:
        """Step i: the update on boards [i * prompts, (i + 1) * prompts)."""
        before = dict(self.timer.seconds)
        t = time.perf_counter()
        out = grpo_step(self.policy, self.trainer, self.settings, self.state, None, boards, i, self.weights, i)
        self.state = jax.block_until_ready(out.state)
        seconds = time.perf_counter() - t
        rollout = sum(self.timer.seconds[k] - before.get(k, 0.0) for k in ("generation", "scoring"))
        return record(seconds, rollout, out.drawn.lengths, out.drawn.rewards)


def record(seconds: float, rollout: float, lengths, rewards) -> dict:
    return {
        "seconds": seconds,
        "rollout": rollout,
        "tokens": int(np.sum(lengths)),
        "reward": float(np.mean(rewards)),
        "reward_se": float(np.std(rewards, ddof=1) / np.sqrt(len(rewards))),
    }


def trl_available() -> str | None:
    """None when TRL imports, else why not."""
    try:
        import trl  # noqa: F401
    except ImportError as e:
        return f"TRL is not installed ({e}); pip install -e '.[bench]'"
    return None


def run_trl(path: str, tok, lr: float, score, boards: list[dict], steps: int, after_step) -> list[dict]:
    """`steps` GRPOTrainer steps on `boards` in order, rewarded by `score` (see `scorer`);
    `after_step(i)` runs after step i's timing."""
    import datasets
    import torch
    import transformers
    import trl

    if FLAGS.torch_threads:
        torch.set_num_threads(FLAGS.torch_threads)
    model = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    model.generation_config.eos_token_id = stop_ids(tok)
    model.generation_config.pad_token_id = tok.pad_token_id
    rows = [{"prompt": render_chat(tok, b, False, FLAGS.style), "board": json.dumps(b)} for b in boards]
    records, current = [], {}

    def reward(prompts, completions, completion_ids, board, **kwargs):
        ro = score([json.loads(b) for b in board], completion_ids)
        current.update(lengths=ro.lengths, rewards=ro.rewards)
        return ro.rewards.tolist()

    class Timing(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            current.update(start=time.perf_counter(), rollout=0.0)

        def on_step_end(self, args, state, control, **kwargs):
            seconds = time.perf_counter() - current["start"]
            records.append(record(seconds, current["rollout"], current["lengths"], current["rewards"]))
            after_step(len(records) - 1)

    g = FLAGS.group_size
    config = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1000,
        disable_tqdm=True,
        seed=FLAGS.seed,
        max_steps=steps,
        per_device_train_batch_size=FLAGS.prompts * g,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=g,
        shuffle_dataset=False,
        max_completion_length=FLAGS.max_new_tokens,
        temperature=FLAGS.temperature,
        top_k=0,
        top_p=1.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        scale_rewards="group",
        mask_truncated_completions=False,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[Timing()],
    )
    generate = trainer._generate_and_score_completions

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            current["rollout"] += time.perf_counter() - t

    trainer._generate_and_score_completions = timed
    with contextlib.redirect_stdout(sys.stderr):  # (the Trainer prints its summary: stdout is JSON lines)
        trainer.train()
    return records


def summary(side: str, records: list[dict]) -> dict:
    timed = records[1:]
    seconds = statistics.median(r["seconds"] for r in timed)
    share = sum(r["rollout"] for r in timed) / sum(r["seconds"] for r in timed)
    return {
        f"{side}_s_per_step": round(seconds, 3),
        f"{side}_rollout_share": round(share, 3),
        f"{side}_update_share": round(1 - share, 3),
        f"{side}_completion_tokens_per_s": round(sum(r["tokens"] for r in timed) / sum(r["seconds"] for r in timed), 1),
        f"{side}_completion_tokens_per_step": round(statistics.mean(r["tokens"] for r in timed), 1),
        f"{side}_steps_s": [round(r["seconds"], 3) for r in timed],
        f"{side}_warmup_s": round(records[0]["seconds"], 2),
    }


def sides(shape: str, lr: float, weights: dict, steps: int, offset: int, skip: str | None):
    """(our records, TRL's or None) of `steps` alternating steps from one fresh checkpoint."""
    tok = load_tokenizer()
    chosen = boards(tok, FLAGS.style, steps * FLAGS.prompts, offset)
    with tempfile.TemporaryDirectory() as tmp:
        qwen3.save_pretrained(qwen3.Qwen3(qwen3.PRESETS[shape], rngs=nnx.Rngs(0)), tmp)
        ours = Ours(tmp, tok, lr, weights)
        ours_records = []

        def ours_step(i):
            ours_records.append(ours.step(chosen, i))

        if skip:
            for i in range(steps):
                ours_step(i)
            return ours_records, None
        score = scorer(ours.policy, weights, FLAGS.max_new_tokens)
        trl_records = run_trl(tmp, tok, lr, score, chosen, steps, ours_step)
    return ours_records, trl_records


def bench(shape: str, skip: str | None) -> None:
    ours, theirs = sides(shape, FLAGS.learning_rate, ACCURACY_FIRST, 1 + FLAGS.repeats, 0, skip)
    row = {"name": f"grpo_step_{shape}", "params": qwen3.num_params(qwen3.PRESETS[shape]), **summary("ours", ours)}
    if theirs is None:
        row["skipped"] = skip
    else:
        row |= summary("trl", theirs)
        row["ratio"] = round(row["trl_s_per_step"] / row["ours_s_per_step"], 2)
        row["baseline"] = "trl_grpo_trainer"
    emit(row | {"rewards": ACCURACY_FIRST, "repeats": FLAGS.repeats} | settings(FLAGS.learning_rate))


def learning(shape: str, skip: str | None) -> None:
    if skip:
        emit({"name": f"grpo_learning_{shape}", "skipped": skip})
        return
    offset = (1 + FLAGS.repeats) * FLAGS.prompts  # (boards the timed steps did not use)
    ours, theirs = sides(shape, FLAGS.learning_check_rate, LEARNING_WEIGHTS, FLAGS.learning_steps, offset, skip)
    diff = [a["reward"] - b["reward"] for a, b in zip(ours, theirs)]
    se = [np.hypot(a["reward_se"], b["reward_se"]) for a, b in zip(ours, theirs)]
    half = len(diff) // 2  # (the second half of the run: after the models moved)
    mean, mean_se = float(np.mean(diff[half:])), float(np.sqrt(np.sum(np.square(se[half:]))) / (len(diff) - half))
    emit(
        {
            "name": f"grpo_learning_{shape}",
            "steps": FLAGS.learning_steps,
            "ours_reward": [round(r["reward"], 4) for r in ours],
            "trl_reward": [round(r["reward"], 4) for r in theirs],
            "ours_tokens": [r["tokens"] for r in ours],
            "trl_tokens": [r["tokens"] for r in theirs],
            "ours_gain": round(ours[-1]["reward"] - ours[0]["reward"], 4),
            "trl_gain": round(theirs[-1]["reward"] - theirs[0]["reward"], 4),
            "second_half_diff": round(mean, 4),
            "second_half_diff_se": round(mean_se, 4),
            "agree": abs(mean) <= 2 * mean_se,
            "rewards": LEARNING_WEIGHTS,
            **settings(FLAGS.learning_check_rate),
        }
    )


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def main(argv):
    del argv
    skip = trl_available()
    versions = {}
    with contextlib.suppress(ImportError):
        import torch
        import transformers
        import trl

        versions = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
        versions["torch_threads"] = FLAGS.torch_threads or torch.get_num_threads()
    emit(
        {
            "name": "platform",
            "backend": jax.default_backend(),
            "jax": jax.__version__,
            "cpus": os.cpu_count(),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
            **versions,
        }
    )
    for shape in FLAGS.shapes:
        bench(shape, skip)
        if FLAGS.learning_steps and shape in FLAGS.learning_shapes:
            learning(shape, skip)


if __name__ == "__main__":
    cli.run(main)
