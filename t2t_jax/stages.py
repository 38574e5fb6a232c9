"""The stage loop: the system the paper describes, end to end.

    warm start (optional SFT) -> evaluate ("warm_start")
    for each stage s:
        the stage's EnvConfig -> certified training boards -> GRPO for `grpo.steps` updates
        -> held-out boards of the stage's config -> the failure account
        -> benchmark evaluation ("stage_s") -> the engineer's proposal -> the next config

Everything a resumed run needs is checkpointed (Orbax): the train state, the reference params,
and the JSON record (`runrecord.RunRecord`) with the cursor (phase, stage, step), the config
and reward-weight history, the accounts, the engineer records and the results. Randomness is a
function of (seed, stage, step) only, so a run killed at any point and resumed ends with the
same parameters as one that was never interrupted. SIGTERM (preemption) saves and exits cleanly
(status 0) within one unit of work: a decode chunk of the engine (`rollout.chunk` steps, in a
step's rollouts, an evaluation or the engineer's proposal), an update, an evaluation batch or a
chunk of certified boards; interrupted work (a step whose rollouts were cut, a stage's end:
held-out evaluation, benchmark point, proposal) is redone on resume from its start.

Writes under `workdir`: checkpoints/, tb/ (TensorBoard), proposals.jsonl, results.json, and at
the end results_table.{md,csv,json} and heatmap.png.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import signal
import time

import jax
import numpy as np
from absl import logging

from t2t_jax import models
from t2t_jax import sharding as shd
from t2t_jax.checkpoint import Checkpointer, CheckpointError
from t2t_jax.engineer.context import build_account
from t2t_jax.engineer.engineer import Engineer
from t2t_jax.env import io
from t2t_jax.env.certified import CertifiedGenerator
from t2t_jax.env.config import EnvConfig
from t2t_jax.evaluation import benchmark, sets
from t2t_jax.logging import SummaryWriter
from t2t_jax.perf import PHASES, PhaseTimer
from t2t_jax.rl import sft
from t2t_jax.rl.rewards import TERMS
from t2t_jax.rl.step import grpo_step, trajectory_point
from t2t_jax.rl.trainer import Trainer
from t2t_jax.rollout import Policy
from t2t_jax.runrecord import RunRecord
from t2t_jax.sampling import make_sampler
from t2t_jax.text.tokenizer import load_tokenizer, stop_ids


class Preempted(SystemExit):
    """Raised after the SIGTERM checkpoint is written (exit status 0)."""


class _Stop(Exception):
    """SIGTERM seen between two units of a long phase (raised by `StageRunner._check_stop`)."""


def setup_distributed(config) -> None:
    """`jax.distributed.initialize` when `distributed.enabled` (coordinator, processes and
    process id from the config, or auto-detected on TPU pods / SLURM when left empty)."""
    if not config.enabled:
        return
    kwargs = {
        k: v
        for k, v in (
            ("coordinator_address", config.coordinator_address),
            ("num_processes", config.num_processes),
            ("process_id", config.process_id),
        )
        if v not in (None, "", -1)
    }
    jax.distributed.initialize(**kwargs)


def setup_compilation_cache(path: str) -> None:
    """JAX's persistent compilation cache in `path` (~ expanded; empty: off). Every compiled
    function is kept (no minimum compile time), so a rerun or a resumed run of the same shapes
    skips XLA compilation: the smoke run takes ~80 s cold and ~25 s warm on 2 CPU cores."""
    if not path:
        return
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


GUIDANCE = ("none", "witness", "canonical")
OLD_LOGPROBS = ("recompute", "sampler")
# The monitor's boards: one fixed draw from env.initial, the same for every seed and arm.
MONITOR_KEY = 20261202


def check_config(c) -> None:
    """Every field against its declared type and legal values (t2t_jax/config/schema.py), before any
    work; ConfigError names the field (a config.json of a run begun before a field existed
    lacks it, and reads as its old behaviour)."""
    from t2t_jax.config import schema

    schema.validate(c)


class StageRunner:
    """Holds the pieces of one run; `run()` executes (or resumes) it. See the module docstring."""

    def __init__(self, config, workdir: str, progress: bool = True):
        self.config, self.workdir, self.progress = config, os.path.abspath(workdir), progress
        c = config
        check_config(c)
        setup_distributed(c.distributed)
        setup_compilation_cache(c.compilation_cache)
        self.mesh = shd.make_mesh(dict(c.mesh)) if c.mesh else None
        self.tokenizer = load_tokenizer(c.model.tokenizer or c.model.checkpoint or None)
        self.model = models.build(c.model, c.seed, self.mesh)
        r = c.rollout
        sampler = make_sampler(
            self.model,
            stop_ids(self.tokenizer),
            self.tokenizer.pad_token_id,
            r.engine,
            r.slots,
            r.chunk,
            kv=r.kv,
            page_size=r.page_size,
            pages=r.pages,
        )
        self.first = first = EnvConfig.from_json(c.env.initial)
        self.policy = Policy(
            sampler,
            self.tokenizer,
            first.max_size,
            first.max_agents,
            c.env.horizon,
            c.rollout.enable_thinking,
            c.rollout.prompt_style,
        )
        self.sft_trainer = Trainer(self.model, c, loss="sft", mesh=self.mesh, optim=self._sft_optim())
        self.trainer = Trainer(self.model, c, loss="grpo", mesh=self.mesh)
        self.engineer = Engineer(c.engineer, self.policy, seed=c.seed)
        self.timer = self.policy.timer = PhaseTimer()  # where each stage's time goes (t2t_jax/perf.py)
        self.ckpt = Checkpointer(os.path.join(self.workdir, "checkpoints"), keep=c.checkpoint.keep)
        self._writer = None
        self._term = False
        self.policy.check = self._check_stop  # (between the engine's decode chunks)

    @property
    def writer(self) -> SummaryWriter:
        """TensorBoard events under tb/, the file made at the first write (reading a run adds none)."""
        if self._writer is None:
            self._writer = SummaryWriter(os.path.join(self.workdir, "tb"))
        return self._writer

    @classmethod
    def from_workdir(cls, workdir: str, progress: bool = False) -> StageRunner:
        """The runner of an existing run, from its config (config.json and the resumes' changes,
        t2t_jax/rundir.py); it reads the run and writes nothing."""
        import ml_collections as mlc

        from t2t_jax import rundir

        return cls(mlc.ConfigDict(rundir.current_config(workdir)), workdir, progress)

    def latest_params(self):
        """The policy params of the latest checkpoint."""
        latest = self.ckpt.latest_intact()
        if latest is None:
            raise CheckpointError(f"no checkpoint under {self.ckpt.directory}")
        return self._restore(latest, self.trainer.init())[0].params

    # ---- bookkeeping -------------------------------------------------------------------------
    def _save(self, state, ref, meta):
        meta.counter += 1
        meta.has_ref = bool(jax.tree.leaves(ref))  # how to shape `ref` when restoring
        self.ckpt.save(meta.counter, {"state": state, "ref": ref}, meta.to_json())

    @property
    def keeps_ref(self) -> bool:
        """The GRPO phase's starting params are kept (in checkpoints as `ref`): the KL reference
        when grpo.beta > 0, the `base` engineer's model."""
        return bool(self.config.grpo.beta) or self.config.engineer.kind == "base"

    def _base_params(self, ref, meta):
        """The `base` engineer's params: those the GRPO phase started from (after the warm start)."""
        if self.config.engineer.kind != "base":
            return None
        if jax.tree.leaves(ref):
            return ref
        logging.warning(
            "engineer.kind=base: this run's GRPO phase began without keeping its starting params "
            "(grpo.beta = 0 and another engineer kind); the base engineer decodes with the initial params"
        )
        return self.trainer.initial_params

    def _restore(self, step, state):
        """(state, ref, meta) of checkpoint `step`; the reference params exist from the GRPO
        phase on when grpo.beta > 0 (a clear error when beta changed across a resume)."""
        beta = self.config.grpo.beta
        saved = RunRecord.from_json(self.ckpt.meta(step), self.config)
        has_ref = saved.has_ref
        if saved.phase not in ("sft", "warm") and beta and not has_ref:
            raise CheckpointError(
                f"grpo.beta: {beta} on resume, but this run's GRPO phase began with beta = 0 (no "
                "reference model kept); resume with the run's own grpo.beta (config.json)"
            )
        restored, meta = self.ckpt.restore(
            step, {"state": state, "ref": self.trainer.initial_params if has_ref else {}}
        )
        return restored["state"], restored["ref"], RunRecord.from_json(meta, self.config)

    def _maybe_preempted(self, state, ref, meta):
        if self._term:
            self._save(state, ref, meta)
            self.close()
            raise Preempted(0)

    def _check_stop(self) -> None:
        """Called between the units of long phases: evaluation batches, certified chunks and,
        through `Policy.check`, the engine's decode chunks (rollouts, evaluation, the engineer)."""
        if self._term:
            raise _Stop

    @contextlib.contextmanager
    def _resumable(self, state, ref, meta):
        """A phase that changes no parameters: on SIGTERM inside it, checkpoint (state, ref) with
        `meta` as it was on entry (the resume redoes the phase), then exit (Preempted)."""
        entry = copy.deepcopy(meta)
        try:
            yield
        except _Stop:
            entry.counter = meta.counter
            self._save(state, ref, entry)
            self._write_records(entry)  # results.json / proposals.jsonl as the checkpoint has them
            self.close()
            raise Preempted(0) from None

    def _write_records(self, meta):
        if jax.process_index() == 0:
            io.write_jsonl(os.path.join(self.workdir, "proposals.jsonl"), meta.records)
            io.write_atomic(os.path.join(self.workdir, "results.json"), json.dumps(meta.results, indent=1))

    def _boards(self, env_config: EnvConfig, key, num: int) -> list[dict]:
        gen = CertifiedGenerator(env_config, horizon=self.config.env.horizon, chunk=self.config.env.chunk)
        with self.timer.phase("certification"):
            return io.boards_with_plans_to_json(*gen(key, num, check=self._check_stop))

    def _key(self, *parts):
        key = jax.random.key(self.config.seed)
        for p in parts:
            key = jax.random.fold_in(key, p)
        return key

    def _eval_kw(self) -> dict:
        """`benchmark.evaluate`'s settings every evaluation of the run shares."""
        c = self.config
        return dict(
            max_new_tokens=c.rollout.max_new_tokens,
            batch_size=c.eval.batch_size,
            reward_weights=c.rewards.to_dict(),
            progress=self.progress,
            check=self._check_stop,
        )

    def _evaluate(self, params, boards, desc, samples: int = 0):
        """Greedy rollouts of `boards`, or `samples` per board at the rollout temperature / top_p
        (seeded by the run's seed alone: every point draws the same random numbers)."""
        c = self.config
        with self.timer.phase("evaluation"):
            return benchmark.evaluate(
                self.policy,
                params,
                boards,
                desc=desc,
                samples=samples,
                temperature=c.rollout.temperature,
                top_p=c.rollout.top_p,
                seed=c.seed,
                **self._eval_kw(),
            )

    def _sampled(self, params, boards, k, desc):
        c = self.config
        return benchmark.sampled_entry(
            self._evaluate(params, boards, desc, samples=k), k, c.rollout.temperature, c.rollout.top_p
        )

    def monitor_boards(self) -> list[dict]:
        """The training-distribution monitor: `eval.monitor` boards of env.initial, one fixed draw."""
        return self._boards(self.first, jax.random.key(MONITOR_KEY), self.config.eval.monitor)

    def _record_point(self, meta, point, params, boards, step, monitor, paired: bool = False, extra=None):
        """Evaluate on `boards` (greedy; avg@k too with eval.samples) and on the `monitor` boards
        (avg@k), append the entry. `paired` (the last point): `vs_first`, the boards gained and
        lost since the first point, which used the same boards, and `ood`, the out-of-distribution
        sets of eval.ood; the monitor is always paired (`monitor_vs_first`). `extra`: more keys."""
        c = self.config
        entry = benchmark.results_entry(point, self._evaluate(params, boards, f"eval {point}"))
        entry.update(extra or {})
        if c.eval.samples:
            entry["sampled"] = self._sampled(params, boards, c.eval.samples, f"eval {point} avg@{c.eval.samples}")
        first = meta.results[0] if meta.results else None
        if paired and "board_valid" in first:  # (absent in runs begun before it existed)
            entry["vs_first"] = benchmark.paired_change(first, entry)
        values = {
            "benchmark/valid": entry["valid"],
            "benchmark/optimal": entry["optimal"],
            "benchmark/mean_tokens": entry["mean_tokens"],
        }
        if paired and c.eval.ood:  # the last point: the out-of-distribution sets too
            entry["ood"] = benchmark.evaluate_ood(
                self.policy, params, sets.parse_ood(c.eval.ood), c.eval.ood_per_cell, **self._eval_kw()
            )
            values.update({f"ood/{n}/{k}": e[k] for n, e in entry["ood"].items() for k in ("valid", "optimal")})
        if monitor:
            entry["monitor"] = self._sampled(params, monitor, c.eval.monitor_samples, f"monitor {point}")
            values.update({f"monitor/{k}": entry["monitor"][k] for k in ("avg_valid", "avg_optimal", "pass_valid")})
            if first is not None and "monitor" in first:
                entry["monitor_vs_first"] = {
                    **benchmark.paired_sampled_change(first["monitor"], entry["monitor"]),
                    "against": first["point"],
                }
        meta.results.append(entry)
        self.writer.scalars(step, values)
        self._write_records(meta)
        return entry

    # ---- phases -----------------------------------------------------------------------------
    def run(self, resume: bool = False) -> list[dict]:
        previous = signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_term", True))
        try:
            return self._run(resume)
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _run(self, resume):
        c = self.config
        latest = self.ckpt.latest_intact() if resume else None
        if not resume and self.ckpt.latest() is not None:  # (launch.main's rundir.open_run refuses first)
            raise FileExistsError(
                f"{self.workdir} already holds checkpoints: pass --resume to continue it, or choose another --workdir"
            )
        state = self.sft_trainer.init() if c.sft.steps else self.trainer.init()
        ref = {}
        meta = RunRecord.start(self.first.to_json(), c.rewards.to_dict(), sft=bool(c.sft.steps))
        if latest is not None:
            state, ref, meta = self._restore(latest, state)
            print(f"resumed from checkpoint {latest}: phase {meta.phase}, stage {meta.stage}, step {meta.step}")
        first_boards = benchmark.benchmark_boards(c.eval.per_cell)
        mid_boards = benchmark.benchmark_boards(c.eval.mid_per_cell)
        with self._resumable(state, ref, meta):
            monitor = self.monitor_boards() if c.eval.monitor else []
        if meta.phase == "sft":
            state = self._sft(state, meta)
            meta.phase, meta.step = "warm", 0
        if meta.phase == "warm":
            with self._resumable(state, ref, meta):
                point = "warm_start" if c.sft.steps else "initial"
                checks = {"sft_checks": meta.sft_checks} if meta.sft_checks else {}
                self._record_point(meta, point, state.params, first_boards, 0, monitor, extra=checks)
            state = self.trainer.init(state.params) if c.sft.steps else state
            ref = jax.tree.map(lambda x: x.copy(), state.params) if self.keeps_ref else {}
            meta.phase, meta.stage, meta.step = "grpo", 0, 0
            self._save(state, ref, meta)
        self.engineer.base_params = self._base_params(ref, meta)
        while meta.stage < c.stages:
            state = self._stage(state, ref, meta, first_boards, mid_boards, monitor)
        entry = meta.results[-1]
        if jax.process_index() == 0:
            benchmark.write_tables(self.workdir, entry)
        self.close()
        return meta.results

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _sft(self, state, meta):
        """The SFT warm start: `sft.steps` updates, then, with the warm-start check on
        (`sft.check_boards` > 0), up to `sft.extra_rounds` rounds of `sft.extra_steps` more (on
        `sft.extra_targets`) while the check's avg@k valid stays below `sft.min_valid`; each round
        on a restarted schedule and a fresh optimizer (`meta.sft_round`, `meta.step` and
        `meta.sft_checks` resume it)."""
        c = self.config
        env = EnvConfig.from_json(c.sft.env) if c.sft.env else self.first
        with self._resumable(state, {}, meta):
            boards = self._boards(env, self._key(7), c.sft.boards)
        pool = functools.cache(lambda field: self._sft_pool(boards, field, c.sft[field], env))
        while True:
            field = "extra_targets" if meta.sft_round and c.sft.extra_targets else "targets"
            state = self._sft_round(state, meta, pool(field))
            if not c.sft.check_boards:
                return state
            if len(meta.sft_checks) <= meta.sft_round:  # (a resume after the check skips it)
                with self._resumable(state, {}, meta):
                    meta.sft_checks.append(self._sft_check(state.params, meta))
            check = meta.sft_checks[meta.sft_round]
            more = not check["passed"] and meta.sft_round < c.sft.extra_rounds
            then = f"; another {c.sft.extra_steps} steps (round {meta.sft_round + 1} of {c.sft.extra_rounds})"
            print(
                f"sft check after {check['steps']} steps: avg@{check['k']} valid {check['avg_valid']:.4f} on "
                f"{check['boards']} boards of env.initial (sft.min_valid {c.sft.min_valid})" + (then if more else "")
            )
            if not more:
                if not check["passed"]:
                    logging.warning(
                        "sft: the warm start stays below sft.min_valid after %d extra rounds; GRPO groups "
                        "will rarely hold a success (raise sft.extra_rounds or sft.steps)",
                        c.sft.extra_rounds,
                    )
                return state
            meta.sft_round, meta.step = meta.sft_round + 1, 0
            state = self._sft_extra_trainer.init(state.params)

    @staticmethod
    def _sft_pool(boards, field, targets, env) -> list[dict]:
        """The SFT pool of `targets` (rl/sft.py SFT_TARGETS, the value of `sft.<field>`) from the
        certified `boards`."""
        pool = sft.sft_targets(boards, targets, env.max_size, env.max_agents)
        if not pool:
            raise ValueError(
                f"sft.{field}={targets!r}: none of the {len(boards)} boards of sft.env has a valid "
                "straight plan; raise sft.boards or use 'canonical'"
            )
        if len(pool) < len(boards):
            print(f"sft: {len(pool)} of {len(boards)} boards have a valid straight plan (sft.{field}={targets!r})")
        return pool

    @functools.cached_property
    def _sft_extra_trainer(self) -> Trainer:
        """The SFT trainer of the extra rounds: warmup and cosine decay over `sft.extra_steps`."""
        c = self.config
        optim = self._sft_optim()
        optim.update(decay_steps=c.sft.extra_steps)
        return Trainer(self.model, c, loss="sft", mesh=self.mesh, optim=optim)

    def _sft_optim(self):
        """The SFT phase's optimizer settings: `optim` with the `sft` rate, warmup and length."""
        s = self.config.sft
        optim = self.config.optim.copy_and_resolve_references()
        optim.update(learning_rate=s.learning_rate, warmup_steps=s.warmup_steps, decay_steps=max(s.steps, 1))
        return optim

    def _sft_updates(self, rounds: int) -> int:
        """SFT updates in the first `rounds` rounds: `sft.steps`, then `sft.extra_steps` each."""
        s = self.config.sft
        return s.steps + (rounds - 1) * s.extra_steps if rounds else 0

    def _sft_round(self, state, meta, boards):
        """SFT round `meta.sft_round` from its step `meta.step` (checkpointed every
        `checkpoint.every` steps); round r > 0 draws its batches with the seed (seed, r)."""
        c, r = self.config, meta.sft_round
        steps = c.sft.steps if r == 0 else c.sft.extra_steps
        done = self._sft_updates(r)

        def callback(step, st, metrics):
            self.writer.scalars(
                done + step,
                {f"sft/{k}": v for k, v in metrics.items() if k in ("nll", "grad_norm", "learning_rate")},
            )
            meta.step = step + 1
            if (step + 1) % c.checkpoint.every == 0 and step + 1 < steps:
                self._save(st, {}, meta)
            self._maybe_preempted(st, {}, meta)

        return sft.run_sft(
            self._sft_extra_trainer if r else self.sft_trainer,
            state,
            self.policy,
            boards,
            steps=steps,
            batch_size=c.sft.batch_size,
            answer_length=c.sft.answer_length,
            seed=c.seed if r == 0 else [c.seed, r],
            start=meta.step,
            callback=callback,
            progress=self.progress,
        )

    @functools.cached_property
    def _sft_check_boards(self) -> list[dict]:
        """The warm-start check's boards: `sft.check_boards` of env.initial, certified once for
        every round's check."""
        return self._boards(self.first, self._key(8), self.config.sft.check_boards)

    def _sft_check(self, params, meta) -> dict:
        """The warm-start check: avg@k valid (k = sft.check_samples, the rollout temperature) on
        `sft.check_boards` boards of env.initial (their own draw, not the monitor's)."""
        c = self.config
        boards = self._sft_check_boards
        k = c.sft.check_samples
        entry = self._sampled(params, boards, k, f"sft check {meta.sft_round}")
        steps = self._sft_updates(meta.sft_round + 1)
        self.writer.scalars(steps, {"sft/check_avg_valid": entry["avg_valid"]})
        return {
            "round": meta.sft_round,
            "steps": steps,
            "boards": len(boards),
            "k": k,
            "avg_valid": entry["avg_valid"],
            "pass_valid": entry["pass_valid"],
            "passed": entry["avg_valid"] >= c.sft.min_valid,
        }

    def _stage(self, state, ref, meta, first_boards, mid_boards, monitor):
        from tqdm import tqdm

        c, s = self.config, meta.stage
        env_config = EnvConfig.from_json(meta.history[-1])
        weights = meta.weights[-1]
        need = c.grpo.steps * c.grpo.prompts * (1 + c.grpo.dynamic_sampling_rounds)
        self.timer.reset()
        started = time.time()
        with self._resumable(state, ref, meta):
            pool = self._boards(env_config, self._key(100, s), need)
        if c.grpo.guidance == "canonical":
            pool = sft.canonical_plans(pool, env_config.max_size, env_config.max_agents)
        for step in tqdm(
            range(meta.step, c.grpo.steps),
            desc=f"stage {s}",
            disable=not self.progress,
            initial=meta.step,
            total=c.grpo.steps,
        ):
            global_step = s * c.grpo.steps + step
            # A SIGTERM during the step's rollouts checkpoints the state before it (the resume redoes it).
            with self._resumable(state, ref, meta):
                state, ro, drawn, metrics = grpo_step(
                    self.policy, self.trainer, c, state, ref, pool, step, weights, global_step
                )
            self._log_step(global_step, ro, drawn, metrics, env_config)
            meta.trajectory.append({"stage": s, "step": step, **trajectory_point(drawn, metrics)})
            meta.step = step + 1
            if (step + 1) % c.checkpoint.every == 0 and step + 1 < c.grpo.steps:
                self._save(state, ref, meta)
            self._maybe_preempted(state, ref, meta)
        global_step = (s + 1) * c.grpo.steps
        # The stage's end changes no parameters: a SIGTERM inside it checkpoints the trained state
        # and the resume redoes the end from here.
        with self._resumable(state, ref, meta):
            heldout = self._boards(env_config, self._key(200, s), c.eval.heldout)
            ro = self._evaluate(state.params, heldout, f"held-out {s}")
            previous = meta.accounts[-1] if meta.accounts else None
            history = [
                {"stage": a["stage"], "config": a["config"], "valid": a["overall"]["valid"]} for a in meta.accounts
            ]
            account = build_account(
                s,
                env_config,
                weights,
                ro,
                cases=c.engineer.failure_cases,
                previous=previous,
                history=history,
                breakdown_cells=c.engineer.breakdown_cells,
                trajectory=[t for t in meta.trajectory if t["stage"] == s],
            )
            meta.accounts.append(account)
            self._log_failures(global_step, ro)
            last = s == c.stages - 1
            boards = first_boards if last else mid_boards
            entry = self._record_point(meta, f"stage_{s}", state.params, boards, global_step, monitor, paired=last)
            record = None
            if not last:
                self._check_stop()
                with self.timer.phase("engineer"):
                    record = self.engineer.propose(state.params, account, env_config, self.first, weights)
                meta.records.append(record)
                meta.history.append(record["config"])
                meta.weights.append(record["reward_weights"])
                self.writer.text(
                    global_step,
                    "engineer/proposal",
                    json.dumps(
                        {k: record[k] for k in ("prompt", "text", "accepted", "reason", "config", "reward_weights")},
                        indent=1,
                    ),
                )
                self._write_records(meta)
        seconds = time.time() - started
        times = self.timer.totals(jax.devices())
        self._log_times(global_step, times, seconds)
        self._summary(s, env_config, account, entry, record, seconds, times)
        meta.stage, meta.step = s + 1, 0
        self._save(state, ref, meta)
        if self._term:  # (a signal during the engineer's decode: that checkpoint is the last)
            self.close()
            raise Preempted(0)
        return state

    # ---- logs -------------------------------------------------------------------------------
    def _log_step(self, step, ro, drawn, metrics, env_config):
        """Scalars of one update: `reward/*` are the policy's own samples as drawn (every round,
        before selection), `selected/*` the batch the update trained on (guided rows excluded)."""
        values = {f"train/{k}": v for k, v in metrics.items() if k != "bad_in_a_row"}
        for prefix, rows in (("reward", drawn), ("selected", ro.select(np.flatnonzero(~ro.guided)))):
            values.update({f"{prefix}/{t}": float(np.mean(rows.terms[t])) for t in TERMS})
            values[f"{prefix}/total"] = float(np.mean(rows.rewards))
        ro = drawn
        values["completion/mean_tokens"] = float(np.mean(ro.lengths))
        values["completion/truncated"] = float(np.mean(ro.truncated))
        buckets = np.array([b.get("bucket", 0) for b in ro.boards])
        for i in range(len(env_config.buckets)):
            rows = buckets == i
            if rows.any():
                values[f"bucket_{i}/valid"] = float(ro.verdicts.valid[rows].mean())
                values[f"bucket_{i}/optimal"] = float(ro.verdicts.optimal[rows].mean())
        self.writer.scalars(step, values)
        if step % self.config.logging.text_every == 0:
            self.writer.text(
                step,
                "samples",
                "\n\n".join(f"{io.board_text(b)}\n--> {t}" for b, t in zip(ro.boards[:2], ro.texts[:2])),
            )

    def _log_failures(self, step, ro):
        from t2t_jax.render.board import boards_grid

        bad = np.flatnonzero(~np.asarray(ro.verdicts.valid))[:8]
        if len(bad):
            self.writer.image(step, "failures", boards_grid([ro.boards[i] for i in bad]))
        self.writer.flush()

    def _log_times(self, step, times, seconds):
        """TensorBoard `time/<phase>_s` (and `_tokens_per_s`, `_mfu` where counted), `time/stage_s`."""
        values = {"time/stage_s": seconds}
        for phase, row in times.items():
            values[f"time/{phase}_s"] = row["seconds"]
            values.update({f"time/{phase}_{k}": row[k] for k in ("tokens_per_s", "mfu") if k in row})
        self.writer.scalars(step, values)

    def _summary(self, s, env_config, account, entry, record, seconds, times):
        if jax.process_index() != 0:
            return
        lines = [
            f"=== stage {s} ({seconds:.0f} s) " + "=" * 40,
            f"config: {json.dumps(env_config.to_json()['buckets'])}",
        ]
        for b in account["buckets"]:
            lines.append(
                f"  held-out bucket {b['bucket']}: {b['boards']} boards, valid {b['valid']:.2f} "
                f"{b['valid_ci']}, optimal {b['optimal']:.2f}, mean tokens {b['mean_tokens']:.0f}"
            )
        lines.append(
            f"benchmark ({entry['boards']} boards): valid {entry['valid']:.3f}, optimal "
            f"{entry['optimal']:.3f}, mean tokens {entry['mean_tokens']:.0f}"
        )
        if "monitor_vs_first" in entry:
            m, d = entry["monitor"], entry["monitor_vs_first"]
            lines.append(
                f"monitor ({m['boards']} boards, avg@{m['k']}): valid {m['avg_valid']:.3f}, "
                f"{d['diff']:+.3f} {d['ci95']} vs {d['against']} (paired permutation p = {d['p_value']:.4f})"
            )
        if record is not None:
            lines.append(f"engineer ({record['kind']}): {record['reason']}")
            lines.append(f"next config: {json.dumps(record['config']['buckets'])}")
        lines.append("time: " + time_line(times, seconds))
        print("\n".join(lines), flush=True)


def time_line(times: dict, seconds: float) -> str:
    """`PhaseTimer.totals` in one line, phases in PHASES order, the rest as `other`."""
    parts = []
    for phase in [p for p in PHASES if p in times] + sorted(set(times) - set(PHASES)):
        row = times[phase]
        extra = [f"{row['tokens_per_s']:,.0f} tok/s"] if "tokens_per_s" in row else []
        extra += [f"MFU {row['mfu']:.1%}"] if "mfu" in row else []
        parts.append(f"{phase} {row['seconds']:.0f} s" + (f" ({', '.join(extra)})" if extra else ""))
    other = seconds - sum(r["seconds"] for r in times.values())
    return ", ".join(parts + [f"other {max(other, 0):.0f} s"])
