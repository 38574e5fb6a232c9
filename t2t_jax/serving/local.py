"""A model on this machine, ready to decode: a `launch.main` run's latest checkpoint or a local
Hugging Face checkpoint (what `launch.eval` and `launch.serve` load).

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


def load_local(run: str = "", hf: str = "", enable_thinking: bool = False, style: str = "full") -> Local:
    """Exactly one of `run` (its config decides thinking and the prompt style) and `hf`."""
    if bool(run) == bool(hf):
        raise ValueError("give exactly one of run and hf")
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
