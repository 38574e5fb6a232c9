"""One jitted, sharded update: micro-batches, exact gradient accumulation, AdamW, NaN guard.

    trainer = Trainer(model, TrainSettings.from_config(config))
    state = trainer.init()                    # TrainState(params, opt_state, step)
    batch = trainer.shard(batch)              # host arrays -> global arrays on the mesh
    state, metrics = trainer.update(state, batch)

A batch is a dict of arrays with a leading batch axis B: `prompt_ids`, `prompt_mask` [B, P]
(left-padded), `completion_ids`, `completion_mask` [B, C] (1 up to and including the stop
token), and for GRPO `advantages` [B], `old_logps` [B, C] (or absent: on-policy, the current
log-probs with the gradient stopped) and `ref_logps` [B, C] (when beta != 0).

The Trainer reads only its typed slice of the config, `TrainSettings` (the `optim` section as
`OptimSettings`, `train.*`, `rollout.temperature` and grpo's loss as `grpo.LossSettings`).
With `train.share_prompts`, GRPO rows come in groups of `grpo.group_size` with one prompt, and
each prompt's forward runs once for its group (`completion_logprobs`). The batch is cut into
`micro_batches` strided slices (row i, or group i, goes to slice i mod M, so every slice spans
every data shard) scanned in one compiled call; each slice's loss is weighted by the
counts of the *full* batch (`grpo.Totals`), so the summed gradient is the full-batch gradient
exactly. Losses come from `LOSS_FNS` by name: `grpo` (the policy loss of grpo.py) and `sft`
(token-mean negative log-likelihood of the completion tokens). A non-finite loss or gradient
skips the update (optax.apply_if_finite) and counts it; `check_finite` raises after
`max_bad_steps` in a row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from t2t_jax import sharding as shd
from t2t_jax.rl import grpo


class TrainingError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class OptimSettings:
    """The optimizer (`optim.*`): AdamW with global-norm clipping, linear warmup and cosine decay."""

    learning_rate: float
    warmup_steps: int
    decay_steps: int
    end_lr_fraction: float
    b1: float
    b2: float
    weight_decay: float
    max_grad_norm: float

    @classmethod
    def from_config(cls, optim) -> OptimSettings:
        """From the config's `optim` section (a ConfigDict or mapping)."""
        return cls(**{f.name: optim[f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """What a Trainer reads of the config.

    optim: the optimizer; micro_batches: slices of each batch (`train.micro_batches`);
    max_bad_steps: non-finite updates in a row before `check_finite` raises; logprob_chunk:
    tokens per chunk of the vocabulary projection; temperature: the sampling temperature
    (`rollout.temperature`: GRPO log-probs are taken at it); loss: grpo's policy loss settings;
    group_size, share_prompts: GRPO rows come in groups of `group_size` sharing one prompt's
    forward when `share_prompts`.
    """

    optim: OptimSettings
    loss: grpo.LossSettings
    micro_batches: int = 1
    max_bad_steps: int = 5
    logprob_chunk: int = 1024
    temperature: float = 1.0
    group_size: int = 1
    share_prompts: bool = False

    @classmethod
    def from_config(cls, config, optim: OptimSettings | None = None) -> TrainSettings:
        """The slice of a run config (`optim`, `train`, `rollout.temperature`, `grpo`); `optim`
        replaces the config's optimizer (the SFT phase's, rl/warm_start.py)."""
        t = config.train
        return cls(
            optim=OptimSettings.from_config(config.optim) if optim is None else optim,
            loss=grpo.LossSettings.from_config(config.grpo),
            micro_batches=t.micro_batches,
            max_bad_steps=t.max_bad_steps,
            logprob_chunk=t.logprob_chunk,
            temperature=config.rollout.temperature,
            group_size=config.grpo.group_size,
            share_prompts=bool(t.get("share_prompts", False)),
        )


@chex.dataclass
class TrainState:
    params: Any
    opt_state: Any
    step: chex.Array


def learning_rate_schedule(optim: OptimSettings):
    """Linear warmup to `learning_rate` over `warmup_steps` updates, then cosine decay to
    `end_lr_fraction` of it by update `decay_steps`. Update 0 already moves: it runs at
    learning_rate / warmup_steps (optax's schedule is read one count ahead; its own value at
    count 0 is 0)."""
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.learning_rate,
        warmup_steps=optim.warmup_steps,
        decay_steps=max(optim.decay_steps, optim.warmup_steps + 1),
        end_value=optim.learning_rate * optim.end_lr_fraction,
    )
    return lambda count: schedule(count + 1)


def make_optimizer(optim: OptimSettings, max_bad_steps: int = 5) -> optax.GradientTransformation:
    """Global-norm clipping + AdamW (norm weights not decayed), skipping non-finite updates."""

    def decay_mask(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: not any("norm" in str(getattr(k, "key", k)) for k in path), params
        )

    inner = optax.chain(
        optax.clip_by_global_norm(optim.max_grad_norm),
        optax.adamw(
            learning_rate_schedule(optim), b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay, mask=decay_mask
        ),
    )
    # apply_if_finite applies anyway after max_consecutive_errors; the host stops first.
    return optax.apply_if_finite(inner, max_consecutive_errors=max_bad_steps + 1)


def completion_logprobs(model, batch, temperature: float, chunk: int, with_entropy: bool = False, group: int = 1):
    """Log-probs [B, C] of `completion_ids` after `prompt_ids` (and entropies [B, C]).

    `group` > 1: rows come in groups of `group` consecutive rows with one prompt (GRPO's samples
    of a board), and each prompt's forward runs once, its keys and values serving the group's
    completions (the same log-probs and gradients as `group` = 1, up to float rounding)."""
    p, c = batch["prompt_ids"].shape[1], batch["completion_ids"].shape[1]
    if group > 1:
        h = _shared_prompt_hidden(model, batch, group)
    else:
        ids = jnp.concatenate([batch["prompt_ids"], batch["completion_ids"]], axis=1)
        mask = jnp.concatenate([batch["prompt_mask"], batch["completion_mask"]], axis=1)
        h = model.hidden(ids, mask)[:, p - 1 : p + c - 1]
    return model.token_logprobs(
        h, batch["completion_ids"], chunk=chunk, temperature=temperature, with_entropy=with_entropy
    )


def _shared_prompt_hidden(model, batch, group: int):
    """[B, C, D] hidden states that predict the completion tokens: a prefill of the B / group
    distinct prompts into a KV cache, the cache repeated per row, then one cached forward of all
    completions (gradients flow through the cache into the prompt's forward)."""
    b, p = batch["prompt_ids"].shape
    c = batch["completion_ids"].shape[1]
    if b % group:
        raise ValueError(f"grpo.group_size: {group} does not divide the (micro-)batch of {b} rows")

    def first(x):  # [B, ...] -> [B / group, ...], the first row of each group
        return x.reshape((b // group, group) + x.shape[1:])[:, 0]

    def spread(x):  # [B / group, ...] -> [B, ...], each row repeated group times
        return jnp.broadcast_to(x[:, None], (x.shape[0], group) + x.shape[1:]).reshape((b,) + x.shape[1:])

    cache = model.init_cache(b // group, p + c)
    h_prompt, cache = model.hidden(first(batch["prompt_ids"]), first(batch["prompt_mask"]), cache, prefill=True)
    cache = cache.map_rows(spread)
    h_completion, _ = model.hidden(batch["completion_ids"], batch["completion_mask"], cache)
    return jnp.concatenate([spread(h_prompt[:, -1:]), h_completion[:, :-1]], axis=1)


def _grpo_loss(model, batch, totals, settings: TrainSettings, group: int):
    logps, entropies = completion_logprobs(
        model, batch, settings.temperature, settings.logprob_chunk, with_entropy=True, group=group
    )
    old = batch.get("old_logps")
    old = jax.lax.stop_gradient(logps) if old is None else old
    loss, metrics = grpo.policy_loss(
        logps,
        old,
        batch.get("ref_logps"),
        batch["advantages"],
        batch["completion_mask"],
        settings.loss,
        totals=totals,
        entropies=entropies,
    )
    if "sampler_logps" in batch:
        metrics.update(sampler_metrics(logps, batch["sampler_logps"], batch["completion_mask"], batch["sampled"]))
    return loss, metrics


def sampler_metrics(logps, sampler_logps, mask, sampled) -> dict:
    """How far the sampler's log-probs [B, C] are from the trainer's (same tokens, same
    temperature; they differ by float rounding, or by a bug): the mean of trainer - sampler
    and its largest |.| over the completion tokens of sampled rows (`sampled` [B] bool; guided
    rows have no sampler log-probs). Across micro-batches the mean is token-weighted like every
    metric (exact when no row is guided)."""
    m = jnp.asarray(mask, bool) & jnp.asarray(sampled, bool)[:, None]
    delta = jax.lax.stop_gradient(logps) - sampler_logps
    n = jnp.maximum(m.sum(), 1)
    return {
        "sampler_logratio": jnp.sum(jnp.where(m, delta, 0.0)) / n,
        "sampler_logratio_max": jnp.max(jnp.where(m, jnp.abs(delta), 0.0)),
    }


# Metrics combined across micro-batches by their maximum (the others: token-weighted means).
MAX_METRICS = ("sampler_logratio_max",)


def _sft_loss(model, batch, totals, settings: TrainSettings, group: int):
    logps = completion_logprobs(model, batch, 1.0, settings.logprob_chunk)
    mask = batch["completion_mask"].astype(jnp.float32)
    nll = -jnp.sum(logps * mask)
    return nll / totals.tokens, {"nll": nll / jnp.maximum(mask.sum(), 1.0)}


# name -> (model, micro-batch, Totals of the full batch, TrainSettings, rows per prompt) -> (loss share, metrics)
LOSS_FNS = {"grpo": _grpo_loss, "sft": _sft_loss}


def _micro(x, m, unit: int = 1):
    """[B, ...] -> [M, B / M, ...]: units of `unit` consecutive rows (a prompt's group), unit u to
    slice u mod M."""
    b = x.shape[0]
    x = x.reshape((b // (m * unit), m, unit) + x.shape[1:]).swapaxes(0, 1)
    return x.reshape((m, b // m) + x.shape[3:])


class Trainer:
    """Holds the model's graph, the optimizer and the jitted update (see the module docstring).

    Args:
      model: a Qwen3 (its weights, placed on `mesh` when given, are the initial params).
      settings: the TrainSettings (`TrainSettings.from_config(config)`).
      loss: a name in LOSS_FNS.
      mesh: the device mesh (None: the default device).
    """

    def __init__(self, model, settings: TrainSettings, loss: str = "grpo", mesh=None):
        if loss not in LOSS_FNS:
            raise ValueError(f"loss: {loss!r} is not one of {sorted(LOSS_FNS)}")
        self.settings, self.loss, self.mesh = settings, loss, mesh
        self.model_config = getattr(model, "config", None)  # (for model-FLOPs counts)
        self.group = settings.group_size if loss == "grpo" and settings.share_prompts else 1
        self.graphdef, self.initial_params = nnx.split(model)
        self.tx = make_optimizer(settings.optim, settings.max_bad_steps)
        self.schedule = learning_rate_schedule(settings.optim)
        self._update = jax.jit(self._update_fn, donate_argnums=(0,))
        self._logprobs = jax.jit(self._logprobs_fn)

    def init(self, params=None) -> TrainState:
        """A fresh state at `params` (default: the model's initial weights), copied: updates
        donate their input state, and the originals stay usable (the reference, the base). On a
        mesh every leaf spans the mesh (the optimizer's moments as their params, its counters and
        the step replicated), so a checkpoint of the state spans every process."""
        params = jax.tree.map(jnp.copy, self.initial_params if params is None else params)
        if self.mesh is None:
            return TrainState(params=params, opt_state=jax.jit(self.tx.init)(params), step=jnp.int32(0))
        replicated = NamedSharding(self.mesh, PartitionSpec())
        shapes = jax.eval_shape(self.tx.init, params)
        shardings = optax.tree_map_params(
            self.tx, lambda _, p: p.sharding, shapes, params, transform_non_params=lambda _: replicated
        )
        opt_state = jax.jit(self.tx.init, out_shardings=shardings)(params)
        step = jax.jit(lambda: jnp.int32(0), out_shardings=replicated)()
        return TrainState(params=params, opt_state=opt_state, step=step)

    def state_shapes(self) -> TrainState:
        """The state `init()` makes, as `jax.ShapeDtypeStruct`s with its shardings (nothing
        allocated; the model's params may be abstract): with `batch_shapes`, what `lower` takes
        to compile the update ahead of time (t2t_jax/aot.py)."""
        params = jax.tree.map(
            lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=getattr(p, "sharding", None)),
            self.initial_params,
        )
        shapes = jax.eval_shape(self.tx.init, params)
        if self.mesh is None:
            return TrainState(params=params, opt_state=shapes, step=jax.ShapeDtypeStruct((), jnp.int32))
        replicated = NamedSharding(self.mesh, PartitionSpec())
        shardings = optax.tree_map_params(
            self.tx, lambda _, p: p.sharding, shapes, params, transform_non_params=lambda _: replicated
        )
        opt_state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
        return TrainState(
            params=params, opt_state=opt_state, step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
        )

    def batch_shapes(self, shapes: dict) -> dict:
        """A batch's shapes and dtypes (`jax.ShapeDtypeStruct`s or arrays) with the shardings
        `shard` gives it."""
        if self.mesh is None:
            return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in shapes.items()}
        return {
            k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shd.batch_sharding(self.mesh, len(v.shape)))
            for k, v in shapes.items()
        }

    def lower(self, state, batch) -> jax.stages.Lowered:
        """`update`'s jitted function lowered for `state` and `batch` (arrays, or
        `state_shapes()` / `batch_shapes(...)`): `.compile()` gives its memory and cost analyses."""
        return self._update.lower(state, batch)

    def model(self, params):
        """A Qwen3 module view of `params` (for sampling)."""
        return nnx.merge(self.graphdef, params)

    def shard(self, batch: dict) -> dict:
        """The whole batch's host arrays (the same on every process) -> global arrays, batch axis
        over the data axes; each process copies only the rows its devices hold, so adding hosts
        divides an update's rows among them."""
        if self.mesh is None:
            return {k: jnp.asarray(v) for k, v in batch.items()}
        out = {}
        for k, v in batch.items():
            v = np.asarray(v)
            out[k] = jax.make_array_from_callback(v.shape, shd.batch_sharding(self.mesh, v.ndim), lambda i, v=v: v[i])
        return out

    def logprobs(self, params, batch, temperature: float | None = None) -> jax.Array:
        """[B, C] completion log-probs under `params` (at `rollout.temperature` by default),
        micro-batched like the update."""
        t = self.settings.temperature if temperature is None else temperature
        return self._logprobs(params, batch, jnp.float32(t))

    def _logprobs_fn(self, params, batch, temperature):
        model = nnx.merge(self.graphdef, params)
        m = self.settings.micro_batches
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
        micro = {k: _micro(batch[k], m, self.group) for k in keys}
        out = jax.lax.map(
            lambda mb: completion_logprobs(model, mb, temperature, self.settings.logprob_chunk, group=self.group),
            micro,
        )
        out = out.reshape((m, -1, self.group, out.shape[-1])).swapaxes(0, 1)
        return out.reshape(batch["completion_ids"].shape)

    def update(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        """One optimizer step on the full batch; metrics are host floats."""
        state, metrics = self._update(state, batch)
        return state, metrics

    def _update_fn(self, state, batch):
        m = self.settings.micro_batches
        b = batch["completion_ids"].shape[0]
        if b % (m * self.group):
            raise ValueError(
                f"train.micro_batches: {m} does not divide the batch of {b} rows"
                + (f" in groups of {self.group} (grpo.group_size, train.share_prompts)" if self.group > 1 else "")
            )
        totals = grpo.totals_of(batch["completion_mask"], chunks=m)
        micro = jax.tree.map(lambda x: _micro(x, m, self.group), batch)

        def loss_of(params, mb):
            model = nnx.merge(self.graphdef, params)
            return LOSS_FNS[self.loss](model, mb, totals, self.settings, self.group)

        grad_fn = jax.value_and_grad(loss_of, has_aux=True)

        def body(carry, mb):
            grads, loss, metric_sums = carry
            (mb_loss, metrics), g = grad_fn(state.params, mb)
            tokens = jnp.sum(mb["completion_mask"])
            metric_sums = {
                k: jnp.maximum(s, metrics[k]) if k in MAX_METRICS else s + metrics[k] * tokens
                for k, s in metric_sums.items()
            }
            return (jax.tree.map(jnp.add, grads, g), loss + mb_loss, metric_sums), None

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        shapes = jax.eval_shape(loss_of, state.params, jax.tree.map(lambda x: x[0], micro))[1]
        metric_zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        (grads, loss, metric_sums), _ = jax.lax.scan(body, (zeros, jnp.float32(0), metric_zero), micro)
        finite = jnp.isfinite(loss)
        grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.nan), grads)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {k: s if k in MAX_METRICS else s / totals.tokens for k, s in metric_sums.items()}
        metrics.update(
            loss=loss,
            grad_norm=optax.global_norm(grads),
            learning_rate=self.schedule(state.step),
            tokens=totals.tokens,
            skipped=opt_state.notfinite_count > 0,
            bad_in_a_row=opt_state.notfinite_count,
        )
        return TrainState(params=params, opt_state=opt_state, step=state.step + 1), metrics

    def check_finite(self, metrics: dict) -> None:
        """Raise TrainingError after `max_bad_steps` non-finite updates in a row."""
        bad = int(metrics["bad_in_a_row"])
        if bad >= self.settings.max_bad_steps:
            raise TrainingError(
                f"{bad} updates in a row had a non-finite loss or gradient (train.max_bad_steps = "
                f"{self.settings.max_bad_steps}); last loss {float(metrics['loss'])}, grad norm "
                f"{float(metrics['grad_norm'])}. Lower optim.learning_rate or check the rewards."
            )
