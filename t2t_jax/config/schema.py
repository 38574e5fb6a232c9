"""The stage loop's config schema: every field's type and legal values, checked in one pass.

    from t2t_jax.config import schema
    schema.validate(config)      # ConfigError naming the field, the value and the legal values

`fields()` declares each leaf of `t2t_jax/config/defaults.py:base()` (dotted path -> spec); `validate` checks
the leaves that are present (a run begun before a field existed lacks it and reads as its old
behaviour), refuses unknown ones, then checks what spans fields (`_cross_checks`: micro-batches
dividing the batch, the engineer's agents inside the environment, sampler log-probs with
guidance). `launch.main`, `launch.eval --run` and `launch.study` call it before any work.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from typing import Any

from t2t_jax.errors import UserError
from t2t_jax.fields import leaves, parse_names  # noqa: F401 (leaves: schema.leaves for callers)


class ConfigError(UserError, ValueError):
    """A config field outside its declared type or legal values (the message names the field)."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """A field's type and legal values: `check(value) -> None or the legal values, as text`."""

    legal: str
    check: Callable[[Any], bool]
    optional: bool = False  # None is legal too

    def __call__(self, field: str, value) -> None:
        if value is None and self.optional:
            return
        try:
            ok = self.check(value)
        except ConfigError as e:  # a nested check's own message (an EnvConfig's bucket field)
            raise ConfigError(f"{field}: {e}") from None
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            raise ConfigError(f"{field}: {value!r} is not {self.legal}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def integer(lo: int, hi: int | None = None, optional: bool = False) -> Spec:
    legal = f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}"
    return Spec(
        legal + (" or None" if optional else ""), lambda v: _is_int(v) and v >= lo and (hi is None or v <= hi), optional
    )


def real(lo: float, hi: float | None = None, lo_open: bool = False, hi_open: bool = False) -> Spec:
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    legal = f"a finite number in {left}{lo}, {hi if hi is not None else 'inf'}{right}"
    return Spec(
        legal,
        lambda v: _is_real(v) and (v > lo if lo_open else v >= lo) and (hi is None or (v < hi if hi_open else v <= hi)),
    )


def choice(*values) -> Spec:
    return Spec(f"one of {list(values)}", lambda v: isinstance(v, str) and v in values)


BOOL = Spec("True or False", lambda v: isinstance(v, bool))
TEXT = Spec("a string", lambda v: isinstance(v, str))


def _env_json(v) -> bool:
    from t2t_jax.env.config import EnvConfig

    if not isinstance(v, str):
        return False
    try:
        EnvConfig.from_json(v)
    except ValueError as e:  # the environment's own error names the bucket's field
        raise ConfigError(str(e)) from None
    return True


ENV_JSON = Spec("an EnvConfig JSON string (t2t_jax/env/config.py)", _env_json)


def names(legal) -> Spec:
    """A comma-separated list of names from `legal` ("" for none), as `parse_names` reads it."""
    return Spec(f"comma-separated names from {list(legal)}, or ''", lambda v: parse_names(v, legal, "") is not None)


def _agent_range(v) -> bool:
    from t2t_jax.env.config import MAX_AGENT_SLOTS

    return (
        isinstance(v, (list, tuple))
        and len(v) == 2
        and all(_is_int(x) for x in v)
        and 1 <= v[0] <= v[1] <= MAX_AGENT_SLOTS
    )


def _is_url(v) -> bool:
    return isinstance(v, str) and v.startswith(("http://", "https://")) and len(v) > len("https://")


def _mesh(v) -> bool:
    sizes = dict(v)
    return (
        all(isinstance(k, str) and _is_int(s) and (s >= 1 or s == -1) for k, s in sizes.items())
        and sum(s == -1 for s in sizes.values()) <= 1
    )


def fields() -> dict[str, Spec]:
    """Dotted field path -> its Spec (every leaf of `defaults.base()`)."""
    from t2t_jax.engineer.context import SECTIONS
    from t2t_jax.engineer.engineer import EVIDENCE, KINDS
    from t2t_jax.engineer.propose import EDIT_MODES
    from t2t_jax.evaluation.decoding import DECODINGS
    from t2t_jax.evaluation.sets import OOD
    from t2t_jax.models.attention import KERNELS
    from t2t_jax.models.qwen3.model import REMAT_POLICIES
    from t2t_jax.models.qwen3.presets import PRESETS
    from t2t_jax.rl import grpo, sft
    from t2t_jax.rl.rewards import TERMS
    from t2t_jax.rl.step import GUIDANCE, OLD_LOGPROBS
    from t2t_jax.sampling.engine import ENGINES, KV_CHOICES
    from t2t_jax.text.prompts import PROMPT_STYLES

    rate = real(0.0, lo_open=True)
    out = {
        "seed": integer(0),
        "grpo_seed": integer(0, optional=True),
        "stages": integer(0),
        "compilation_cache": TEXT,
        "model.preset": choice(*PRESETS),
        "model.checkpoint": TEXT,
        "model.tokenizer": TEXT,
        "model.dtype": choice("float32", "bfloat16", "float16"),
        "model.remat": choice(*REMAT_POLICIES),
        "model.attention": choice(*KERNELS),
        "model.attn_chunk": integer(0),
        "model.scan_layers": BOOL,
        "mesh": Spec("a mapping of axis names to sizes >= 1 (one may be -1: the rest of the devices)", _mesh),
        "distributed.enabled": BOOL,
        "distributed.coordinator_address": TEXT,
        "distributed.num_processes": integer(-1),
        "distributed.process_id": integer(-1),
        "env.initial": ENV_JSON,
        "env.horizon": integer(1, 1024),
        "env.chunk": integer(1),
        "rollout.max_new_tokens": integer(1),
        "rollout.temperature": real(0.0, lo_open=True),
        "rollout.top_k": integer(0),
        "rollout.top_p": real(0.0, 1.0, lo_open=True),
        "rollout.enable_thinking": BOOL,
        "rollout.prompt_style": choice(*PROMPT_STYLES),
        "rollout.engine": choice(*ENGINES),
        "rollout.slots": integer(1),
        "rollout.chunk": integer(1),
        "rollout.kv": choice(*KV_CHOICES),
        "rollout.page_size": integer(1),
        "rollout.pages": integer(0),
        "sft.steps": integer(0),
        "sft.batch_size": integer(1),
        "sft.boards": integer(1),
        "sft.env": Spec("'' (env.initial) or " + ENV_JSON.legal, lambda v: v == "" or _env_json(v)),
        "sft.learning_rate": rate,
        "sft.warmup_steps": integer(0),
        "sft.targets": choice(*sft.SFT_TARGETS),
        "sft.answer_length": integer(1),
        "sft.check_boards": integer(0),
        "sft.check_samples": integer(1),
        "sft.min_valid": real(0.0, 1.0),
        "sft.extra_steps": integer(1),
        "sft.extra_rounds": integer(0),
        "sft.extra_targets": choice("", *sft.SFT_TARGETS),  # "": sft.targets
        "grpo.steps": integer(0),
        "grpo.prompts": integer(1),
        "grpo.group_size": integer(2),  # (with 1 every advantage is 0)
        "grpo.loss_type": choice(*grpo.LOSSES),
        "grpo.epsilon_low": real(0.0, 1.0),
        "grpo.epsilon_high": real(0.0),
        "grpo.beta": real(0.0),
        "grpo.scale_rewards": choice(*grpo.SCALES),
        "grpo.num_iterations": integer(1),
        "grpo.old_logprobs": choice(*OLD_LOGPROBS),
        "grpo.dynamic_sampling": BOOL,
        "grpo.dynamic_sampling_rounds": integer(0),
        "grpo.informative": choice(*grpo.INFORMATIVE),
        "grpo.guidance": choice(*GUIDANCE),
        "grpo.control": choice(*grpo.CONTROLS),
        "grpo.replay": real(0.0, 1.0, hi_open=True),  # (< 1: every round keeps a fresh board)
        "grpo.replay_size": integer(1, 4096),  # (the buffer rides in every checkpoint's record)
        "grpo.replay_temperature": real(0.0, lo_open=True),
        "grpo.replay_staleness": real(0.0, 1.0),
        "optim.learning_rate": rate,
        "optim.warmup_steps": integer(0),
        "optim.decay_steps": integer(1),
        "optim.end_lr_fraction": real(0.0, 1.0),
        "optim.b1": real(0.0, 1.0, hi_open=True),
        "optim.b2": real(0.0, 1.0, hi_open=True),
        "optim.weight_decay": real(0.0),
        "optim.max_grad_norm": real(0.0, lo_open=True),
        "train.micro_batches": integer(1),
        "train.max_bad_steps": integer(1),
        "train.logprob_chunk": integer(1),
        "train.share_prompts": BOOL,
        "engineer.kind": choice(*KINDS),
        "engineer.edit_mode": choice(*EDIT_MODES),
        "engineer.evidence": choice(*EVIDENCE),
        "engineer.failure_cases": integer(0),
        "engineer.constrained": BOOL,
        "engineer.max_tokens": integer(1),
        "engineer.thinking": BOOL,
        "engineer.thinking_tokens": integer(0, 32768),  # (the free prefix is a table row a token)
        "engineer.temperature": real(0.0),
        "engineer.top_p": real(0.0, 1.0, lo_open=True),
        "engineer.agent_range": Spec("a pair [low, high] of integers, 1 <= low <= high <= 16", _agent_range),
        "engineer.max_edits": integer(1),
        "engineer.efficiency_threshold": real(0.0, 1.0),
        "engineer.reward_guard": BOOL,
        "engineer.sections": names(SECTIONS),
        "engineer.breakdown_cells": integer(0),
        "engineer.api_base": Spec("'' or an http:// or https:// URL", lambda v: v == "" or _is_url(v)),
        "engineer.model": TEXT,
        "engineer.api_key_env": TEXT,
        "engineer.api_timeout": real(0.0, lo_open=True),
        "engineer.api_retries": integer(0),
        "eval.per_cell": integer(1, 150, optional=True),
        "eval.mid_per_cell": integer(1, 150, optional=True),
        "eval.heldout": integer(1),
        "eval.batch_size": integer(1),
        "eval.samples": integer(0),
        "eval.monitor": integer(0),
        "eval.monitor_samples": integer(1),
        "eval.target": Spec("'' (none) or " + ENV_JSON.legal, lambda v: v == "" or _env_json(v)),
        "eval.target_boards": integer(1),
        "eval.target_samples": integer(1),
        "eval.ood": names(OOD),
        "eval.ood_per_cell": integer(1, 50, optional=True),
        "eval.decoding": choice(*DECODINGS),
        "eval.temperature": real(0.0, lo_open=True),
        "eval.top_p": real(0.0, 1.0, lo_open=True),
        "eval.top_k": integer(0),
        "checkpoint.every": integer(1),
        "checkpoint.keep": integer(1),
        "logging.text_every": integer(1),
    }
    out.update({f"rewards.{t}": real(-10.0, 10.0) for t in TERMS})
    return out


def validate(config) -> None:
    """Check every field of `config` (a ConfigDict or its dict) and the cross-field rules; raise
    ConfigError naming the first bad field, its value and the legal values."""
    specs = fields()
    values = leaves(config.to_dict() if hasattr(config, "to_dict") else config)
    if "train.temperature" in values:  # (runs begun when the update had its own temperature)
        if values["train.temperature"] != values.get("rollout.temperature"):
            raise ConfigError(
                f"train.temperature: {values['train.temperature']} differs from rollout.temperature: "
                f"{values.get('rollout.temperature')}; the update's log-probs are at the sampling "
                "temperature"
            )
        del values["train.temperature"]
    unknown = sorted(set(values) - set(specs))
    if unknown:
        raise ConfigError(
            f"{unknown[0]}: unknown field (known fields: see t2t_jax/config/defaults.py)"
            + (f"; also unknown: {', '.join(unknown[1:])}" if len(unknown) > 1 else "")
        )
    for path, value in values.items():
        specs[path](path, value)
    _cross_checks(values)


def _cross_checks(v: dict) -> None:
    get = v.get
    group = get("grpo.group_size", 2) if get("train.share_prompts", True) else 1
    m, rows = get("train.micro_batches", 1), get("grpo.prompts", 1) * get("grpo.group_size", 2)
    if rows % (m * group):
        raise ConfigError(
            f"train.micro_batches: {m} does not divide the GRPO batch of {get('grpo.prompts')} "
            f"prompts x {get('grpo.group_size')} (in whole groups when train.share_prompts)"
        )
    if get("sft.steps", 0) and get("sft.batch_size", 1) % m:
        raise ConfigError(f"train.micro_batches: {m} does not divide sft.batch_size {get('sft.batch_size')}")
    if get("grpo.guidance", "none") != "none" and get("grpo.old_logprobs") == "sampler":
        raise ConfigError("grpo.guidance: guided rows have no sampler log-probs; use grpo.old_logprobs='recompute'")
    if get("grpo.guidance", "none") != "none" and get("rollout.enable_thinking"):
        raise ConfigError("grpo.guidance: certified plans carry no think block; use rollout.enable_thinking=False")
    if get("grpo.dynamic_sampling") and not get("grpo.dynamic_sampling_rounds"):
        raise ConfigError(
            "grpo.dynamic_sampling_rounds: 0 with grpo.dynamic_sampling=True; "
            "give at least 1 extra round (or turn dynamic sampling off)"
        )
    if get("engineer.kind") == "api":
        for field in ("engineer.api_base", "engineer.model"):
            if not get(field):
                raise ConfigError(f"{field}: '' with engineer.kind='api'; give the endpoint's URL and model name")
        key = get("engineer.api_key_env")
        if key and key not in os.environ:
            raise ConfigError(f"engineer.api_key_env: the environment variable {key} is not set")
    if "eval.decoding" in v:
        from t2t_jax.evaluation.decoding import unused_settings

        name = v["eval.decoding"]
        unused = unused_settings(name, get("eval.temperature", 1.0), get("eval.top_p", 1.0), get("eval.top_k", 0))
        if unused:
            raise ConfigError(
                f"eval.{unused[0]}: {get('eval.' + unused[0])!r} is read only with eval.decoding='sampled' "
                f"(eval.decoding is {name!r}, which fixes it)"
            )
    if get("eval.target") and "env.initial" in v:
        target, first = json.loads(v["eval.target"]), json.loads(v["env.initial"])
        for key, default in (("max_size", 10), ("max_agents", 5)):
            if target.get(key, default) != first.get(key, default):
                raise ConfigError(
                    f"eval.target: its {key} {target.get(key, default)} differs from env.initial's "
                    f"{first.get(key, default)} (the policy's prompts and plans are shaped by env.initial)"
                )
    if "env.initial" in v and "engineer.agent_range" in v:
        max_agents = json.loads(v["env.initial"]).get("max_agents", 5)
        lo, hi = v["engineer.agent_range"]
        if hi > max_agents:
            raise ConfigError(f"engineer.agent_range: {[lo, hi]} goes above env.initial's max_agents {max_agents}")


def check_inputs(config) -> None:
    """The files the config names exist: a local HF checkpoint (model.checkpoint, a directory with
    config.json) and a tokenizer directory (model.tokenizer)."""
    import os

    for field in ("model.checkpoint", "model.tokenizer"):
        path = leaves(config.to_dict() if hasattr(config, "to_dict") else config).get(field, "")
        if path and not os.path.isdir(path):
            raise ConfigError(f"{field}: {path!r} is not a directory")
        if path and field == "model.checkpoint" and not os.path.exists(os.path.join(path, "config.json")):
            raise ConfigError(f"{field}: {path!r} holds no config.json (a Hugging Face checkpoint directory)")
