"""A model on this machine, ready to decode: a `launch.main` run's latest checkpoint, a local
Hugging Face checkpoint, or the embedded tiny model with random weights (`tiny=True`: load tests
and fault sweeps of the server) (what `launch.eval` and `launch.serve` load).

    local = load_local(run="runs/default")            # or hf="/ckpt/Qwen3-4B", enable_thinking=True
    local.policy, local.params, local.max_new_tokens, local.name
"""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass
class Local:
    policy: object  # a rollout.Policy
    params: object  # the weights to decode with (None: the model's own)
    max_new_tokens: int  # the run's rollout budget, or 4096 for a checkpoint
    name: str  # the directory's base name


def load_local(
    run: str = "", hf: str = "", enable_thinking: bool = False, style: str = "full", tiny: bool = False
) -> Local:
    """Exactly one of `run` (its config decides thinking and the prompt style), `hf` and `tiny`."""
    if sum(map(bool, (run, hf, tiny))) != 1:
        raise ValueError("give exactly one of run, hf and tiny")
    if tiny:
        from flax import nnx

        from t2t_jax.models import qwen3
        from t2t_jax.rollout import Policy
        from t2t_jax.sampling import make_sampler
        from t2t_jax.text.tokenizer import load_tokenizer, stop_ids

        tok = load_tokenizer()
        model = qwen3.Qwen3(qwen3.PRESETS["tiny"], rngs=nnx.Rngs(0))
        sampler = make_sampler(model, stop_ids(tok), tok.pad_token_id)
        policy = Policy(sampler, tok, enable_thinking=enable_thinking, style=style)
        return Local(policy, None, 64, "tiny")
    if run:
        from t2t_jax.stages import StageRunner

        runner = StageRunner.from_workdir(run)
        name = os.path.basename(os.path.abspath(run))
        return Local(runner.policy, runner.latest_params(), runner.config.rollout.max_new_tokens, name)
    from t2t_jax import models
    from t2t_jax.rollout import Policy
    from t2t_jax.sampling import make_sampler
    from t2t_jax.text.tokenizer import load_tokenizer, stop_ids

    tok = load_tokenizer(hf)
    model = models.from_pretrained(hf)
    policy = Policy(
        make_sampler(model, stop_ids(tok), tok.pad_token_id), tok, enable_thinking=enable_thinking, style=style
    )
    return Local(policy, None, 4096, os.path.basename(os.path.abspath(hf)))
