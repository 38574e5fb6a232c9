"""The stage loop: the system the paper describes, end to end, as a linear driver over phases.

    warm start (rl/warm_start.py: SFT, with the warm-start check's extra rounds) -> evaluate ("warm_start")
    for each stage s:
        GRPO (rl/stage.py: the stage's EnvConfig -> certified training boards -> `grpo.steps` updates)
        -> the stage's end (here): held-out boards of the stage's config -> the failure account
           -> benchmark evaluation ("stage_s", evaluation/points.py) -> the engineer's proposal
           -> the next stage's config

Each phase is a function of an explicit `runrecord.RunState` (train state, reference params, the
JSON record with the cursor) returning the next one, given the run's collaborators (`loop.Loop`).
Everything a resumed run needs is checkpointed (Orbax): the train state, the reference params,
and the record (`runrecord.RunRecord`: cursor (phase, stage, step), the config and reward-weight
history, the accounts, the engineer records, the results). Randomness is a function of (seed,
stage, step) only, so a run killed at any point and resumed ends with the same parameters as one
that was never interrupted. SIGTERM (preemption) saves and exits cleanly (status 0) within one
unit of work (t2t_jax/preemption.py): a decode chunk of the engine (`rollout.chunk` steps, in a
step's rollouts, an evaluation or the engineer's proposal), an update, an evaluation batch or a
chunk of certified boards; interrupted work (a step whose rollouts were cut, a stage's end:
held-out evaluation, benchmark point, proposal) is redone on resume from its start.

Writes under `workdir`: checkpoints/, tb/ (TensorBoard), proposals.jsonl, results.json, and at
the end results_table.{md,csv,json} and heatmap.png.
"""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
from absl import logging

from t2t_jax import distributed, fields, models, storage
from t2t_jax import sharding as shd
from t2t_jax.checkpoint import Checkpointer, CheckpointError
from t2t_jax.engineer.context import build_account
from t2t_jax.engineer.engineer import Engineer, Proposal
from t2t_jax.env import io
from t2t_jax.env.config import EnvConfig
from t2t_jax.evaluation import benchmark
from t2t_jax.evaluation.points import MONITOR_KEY, TARGET_KEY, EvalSettings, Evaluator
from t2t_jax.logging import SummaryWriter
from t2t_jax.loop import Loop
from t2t_jax.perf import PhaseTimer, time_line
from t2t_jax.preemption import Preempted, Preemption  # noqa: F401 (Preempted: the stage loop's exit)
from t2t_jax.rl.stage import train_stage
from t2t_jax.rl.trainer import Trainer, TrainSettings
from t2t_jax.rl.warm_start import SftTrainers, warm_start
from t2t_jax.rollout import Policy
from t2t_jax.runrecord import RunRecord, RunState
from t2t_jax.sampling import make_sampler
from t2t_jax.text.tokenizer import load_tokenizer, stop_ids


def setup_compilation_cache(path: str) -> None:
    """JAX's persistent compilation cache in `path` (~ expanded; empty: off). Every compiled
    function is kept (no minimum compile time), so a rerun or a resumed run of the same shapes
    skips XLA compilation (timings: docs/stage_loop.md)."""
    if not path:
        return
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class StageRunner:
    """The pieces of one run, wired once; `run()` executes (or resumes) it. The config is taken
    as checked (`config.schema.validate`, which every launcher runs before any work)."""

    def __init__(self, config, workdir: str, progress: bool = True):
        c = self.config = config
        self.workdir, self.progress = storage.resolve(workdir), progress  # (a local path or gs://)
        distributed.initialize(c.distributed)  # (launch.main has done it before the run directory)
        setup_compilation_cache(c.compilation_cache)
        self.mesh = shd.make_mesh(dict(c.mesh)) if c.mesh else None
        self.tokenizer = load_tokenizer(c.model.tokenizer or c.model.checkpoint or None)
        self.model = models.build(c.model, c.seed, self.mesh)
        self.preemption = Preemption(self._stop)
        self.timer = PhaseTimer()  # where each stage's time goes (t2t_jax/perf.py)
        self.target: list[dict] = []  # eval.target's boards (drawn by run())
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
            r.enable_thinking,
            r.prompt_style,
            check=self.preemption.check,  # (between the engine's decode chunks)
            timer=self.timer,
        )
        self.evaluator = Evaluator(
            self.policy, EvalSettings.from_config(c), check=self.preemption.check, timer=self.timer, progress=progress
        )
        self.sft_trainers = SftTrainers(self.model, c, self.mesh)
        self.trainer = Trainer(self.model, TrainSettings.from_config(c), loss="grpo", mesh=self.mesh)
        self.ckpt = Checkpointer(storage.join(self.workdir, "checkpoints"), keep=c.checkpoint.keep)
        self.loop = Loop(
            c,
            self.policy,
            self.evaluator,
            self.preemption,
            self.timer,
            self.save,
            lambda: SummaryWriter(storage.join(self.workdir, "tb")),
            progress,
        )

    @classmethod
    def from_workdir(cls, workdir: str, progress: bool = False) -> StageRunner:
        """The runner of an existing run, from its config (config.json and the resumes' changes,
        t2t_jax/rundir.py); it reads the run and writes nothing."""
        import ml_collections as mlc

        from t2t_jax import rundir

        return cls(mlc.ConfigDict(rundir.current_config(workdir)), workdir, progress)

    # ---- the driver ---------------------------------------------------------------------------
    def run(self, resume: bool = False) -> list[dict]:
        """The whole run (or the rest of it, with `resume`): the evaluation points (results.json)."""
        c = self.config
        with self.preemption.handling():
            run = self.start(resume)
            first_boards = benchmark.benchmark_boards(c.eval.per_cell)
            mid_boards = benchmark.benchmark_boards(c.eval.mid_per_cell)
            monitor = self.loop.guard(run, self.monitor_boards) if c.eval.monitor else []
            self.target = self.loop.guard(run, self.target_boards) if c.eval.get("target") else []
            if run.record.phase == "sft":
                run = warm_start(self.loop, run, self.sft_trainers).replace(phase="warm", step=0)
            if run.record.phase == "warm":
                run = self.save(self.loop.guard(run, lambda: self._warm_point(run, first_boards, monitor)))
            engineer = Engineer(c.engineer, self.policy, base_params=self.base_params(run), seed=fields.grpo_seed(c))
            while run.record.stage < c.stages:
                self.timer.reset()
                started = time.time()
                run = train_stage(self.loop, run, self.trainer)
                ends = (first_boards if run.record.stage == c.stages - 1 else mid_boards), monitor, started
                run = self.save(self.loop.guard(run, lambda: self._end_stage(run, engineer, *ends)))
        if jax.process_index() == 0:
            benchmark.write_tables(self.workdir, run.record.results[-1])
        self.loop.close()
        return run.record.results

    def start(self, resume: bool) -> RunState:
        """A fresh run's state, or (`resume`) the latest intact checkpoint's."""
        c = self.config
        if not resume and self.ckpt.latest() is not None:  # (launch.main's rundir.open_run refuses first)
            raise FileExistsError(
                f"{self.workdir} already holds checkpoints: pass --resume to continue it, or choose another --workdir"
            )
        latest = self.ckpt.latest_intact() if resume else None
        if latest is not None:
            run = self.restore(latest)
            print(
                f"resumed from checkpoint {latest}: phase {run.record.phase}, stage {run.record.stage}, step "
                f"{run.record.step}"
            )
            return run
        train = self.sft_trainers(0).init() if c.sft.steps else self.trainer.init()
        return RunState(train, {}, RunRecord.start(self.first.to_json(), c.rewards.to_dict(), sft=bool(c.sft.steps)))

    def monitor_boards(self) -> list[dict]:
        """The training-distribution monitor: `eval.monitor` boards of env.initial, one fixed draw."""
        return self.loop.boards(self.first, jax.random.key(MONITOR_KEY), self.config.eval.monitor)

    def target_boards(self) -> list[dict]:
        """The target distribution: `eval.target_boards` boards of eval.target, one fixed draw."""
        c = self.config
        return self.loop.boards(EnvConfig.from_json(c.eval.target), jax.random.key(TARGET_KEY), c.eval.target_boards)

    # ---- phases of the driver ------------------------------------------------------------------
    def _warm_point(self, run: RunState, boards, monitor) -> RunState:
        """The first evaluation point, then the GRPO phase's start: a fresh optimizer at the warm
        start's params and, when kept, those params as the reference."""
        c = self.config
        checks = {"sft_checks": run.record.sft_checks} if run.record.sft_checks else {}
        name = "warm_start" if c.sft.steps else "initial"
        run = self._point(run, name, boards, 0, monitor, extra=checks)
        train = self.trainer.init(run.train.params) if c.sft.steps else run.train
        ref = jax.tree.map(lambda x: x.copy(), train.params) if self.keeps_ref else {}
        return run.replace(train=train, ref=ref, phase="grpo", stage=0, step=0)

    def _end_stage(self, run: RunState, engineer: Engineer, boards, monitor, started: float) -> RunState:
        """A stage's end (changes no parameters): held-out boards of the stage's config -> the
        failure account -> the evaluation point -> the engineer's proposal (not after the last)."""
        c, s = self.config, run.record.stage
        env_config, weights = EnvConfig.from_json(run.record.history[-1]), run.record.weights[-1]
        global_step = (s + 1) * c.grpo.steps
        heldout, replaced = self.loop.draw(env_config, self.loop.grpo_key(200, s), c.eval.heldout)
        ro = self.evaluator.evaluate(run.train.params, heldout, f"held-out {s}")
        history = [a.history_entry() for a in run.record.accounts]
        account = build_account(
            s,
            env_config,
            weights,
            ro,
            cases=c.engineer.failure_cases,
            previous=run.record.accounts[-1] if run.record.accounts else None,
            history=history,
            breakdown_cells=c.engineer.breakdown_cells,
            trajectory=[t for t in run.record.trajectory if t["stage"] == s],
            replaced=replaced,
        )
        run = run.replace(accounts=[*run.record.accounts, account])
        self._log_failures(global_step, ro)
        last = s == c.stages - 1
        summary = {"grpo": grpo_summary([t for t in run.record.trajectory if t["stage"] == s])}
        run = self._point(run, f"stage_{s}", boards, global_step, monitor, paired=last, extra=summary)
        proposal = None
        if not last:
            self.preemption.check()
            with self.timer.phase("engineer"):
                proposal = engineer.propose(run.train.params, account, env_config, self.first, weights)
            proposal = Proposal.from_json(distributed.from_host0(proposal.to_json()))  # (host 0's is the record)
            run = run.replace(
                records=[*run.record.records, proposal],
                history=[*run.record.history, proposal.config],
                weights=[*run.record.weights, proposal.reward_weights],
            )
            keys = ("prompt", "reasoning", "text", "accepted", "reason", "config", "reward_weights")
            text = json.dumps({k: getattr(proposal, k) for k in keys}, indent=1)
            self.loop.writer.text(global_step, "engineer/proposal", text)
            self._write_records(run.record)
        seconds = time.time() - started
        times = self.timer.totals(jax.devices())
        self._log_times(global_step, times, seconds)
        self._summary(s, env_config, account, run.record.results[-1], proposal, seconds, times)
        return run.replace(stage=s + 1, step=0)

    def _point(self, run: RunState, name: str, boards, step: int, monitor, paired=False, extra=None) -> RunState:
        """Evaluation point `name` appended to the record (evaluation/points.py), logged, written."""
        entry, values = self.evaluator.point(
            name, run.train.params, boards, run.record.results, monitor, paired=paired, extra=extra, target=self.target
        )
        self.loop.writer.scalars(step, values)
        run = run.replace(results=[*run.record.results, entry])
        self._write_records(run.record)
        return run

    # ---- checkpoints -------------------------------------------------------------------------
    @property
    def keeps_ref(self) -> bool:
        """The GRPO phase's starting params are kept (in checkpoints as `ref`): the KL reference
        when grpo.beta > 0, the `base` engineer's model."""
        return bool(self.config.grpo.beta) or self.config.engineer.kind == "base"

    def base_params(self, run: RunState):
        """The `base` engineer's params: those the GRPO phase started from (after the warm start)."""
        if self.config.engineer.kind != "base":
            return None
        if jax.tree.leaves(run.ref):
            return run.ref
        logging.warning(
            "engineer.kind=base: this run's GRPO phase began without keeping its starting params "
            "(grpo.beta = 0 and another engineer kind); the base engineer decodes with the initial params"
        )
        return self.trainer.initial_params

    def save(self, run: RunState) -> RunState:
        """Checkpoint `run` (the next counter); returns it with the counter it was saved under."""
        run = run.replace(counter=run.record.counter + 1, has_ref=bool(jax.tree.leaves(run.ref)))
        self.ckpt.save(run.record.counter, {"state": run.train, "ref": run.ref}, run.record.to_json())
        return run

    def restore(self, step: int) -> RunState:
        """The RunState of checkpoint `step`; the reference params exist from the GRPO phase on
        when grpo.beta > 0 (a clear error when beta changed across a resume)."""
        beta = self.config.grpo.beta
        saved = RunRecord.from_json(self.ckpt.meta(step), self.config)
        if saved.phase not in ("sft", "warm") and beta and not saved.has_ref:
            raise CheckpointError(
                f"grpo.beta: {beta} on resume, but this run's GRPO phase began with beta = 0 (no "
                "reference model kept); resume with the run's own grpo.beta (config.json)"
            )
        like = {"state": self.trainer.init(), "ref": self.trainer.initial_params if saved.has_ref else {}}
        restored, meta = self.ckpt.restore(step, like)
        return RunState(restored["state"], restored["ref"], RunRecord.from_json(meta, self.config))

    def latest_params(self):
        """The policy params of the latest intact checkpoint."""
        latest = self.ckpt.latest_intact()
        if latest is None:
            raise CheckpointError(f"no checkpoint under {self.ckpt.directory}")
        return self.restore(latest).train.params

    def _stop(self, run: RunState) -> None:
        """The preemption's checkpoint: `run` and its records (results.json, proposals.jsonl
        as the checkpoint has them: a stage's end cut short is written again on resume)."""
        self._write_records(self.save(run).record)
        self.loop.close()

    def _write_records(self, record: RunRecord) -> None:
        """results.json and proposals.jsonl from `record` (process 0; none before the first point)."""
        if jax.process_index() == 0 and record.results:
            io.write_jsonl(storage.join(self.workdir, "proposals.jsonl"), [r.to_json() for r in record.records])
            io.write_atomic(storage.join(self.workdir, "results.json"), json.dumps(record.results, indent=1))

    # ---- logs ---------------------------------------------------------------------------------
    def _log_failures(self, step: int, ro) -> None:
        from t2t_jax.render.board import boards_grid

        bad = np.flatnonzero(~np.asarray(ro.verdicts.valid))[:8]
        if len(bad):
            self.loop.writer.image(step, "failures", boards_grid([ro.boards[i] for i in bad]))
        self.loop.writer.flush()

    def _log_times(self, step: int, times: dict, seconds: float) -> None:
        """TensorBoard `time/<phase>_s` (and `_tokens_per_s`, `_mfu` where counted), `time/stage_s`."""
        values = {"time/stage_s": seconds}
        for phase, row in times.items():
            values[f"time/{phase}_s"] = row["seconds"]
            values.update({f"time/{phase}_{k}": row[k] for k in ("tokens_per_s", "mfu") if k in row})
        self.loop.writer.scalars(step, values)

    def _summary(self, s, env_config, account, entry, proposal, seconds, times) -> None:
        if jax.process_index() != 0:
            return
        lines = [
            f"=== stage {s} ({seconds:.0f} s) " + "=" * 40,
            f"config: {json.dumps(env_config.to_json()['buckets'])}",
        ]
        for b in account.buckets:
            lines.append(
                f"  held-out bucket {b['bucket']}: {b['boards']} boards, valid {b['valid']:.2f} "
                f"{b['valid_ci']}, optimal {b['optimal']:.2f}, mean tokens {b['mean_tokens']:.0f}, truncated "
                f"{b['truncated']:.2f}"
            )
        lines.append(
            f"benchmark ({entry['boards']} boards): valid {entry['valid']:.3f}, optimal "
            f"{entry['optimal']:.3f}, mean tokens {entry['mean_tokens']:.0f}, truncated {entry['truncated']:.3f}"
        )
        if "monitor_vs_first" in entry:
            m, d = entry["monitor"], entry["monitor_vs_first"]
            lines.append(
                f"monitor ({m['boards']} boards, avg@{m['k']}): valid {m['avg_valid']:.3f}, "
                f"{d['diff']:+.3f} {d['ci95']} vs {d['against']} (paired permutation p = {d['p_value']:.4f})"
            )
        if proposal is not None:
            lines.append(f"engineer ({proposal.kind}): {proposal.reason}")
            lines.append(f"next config: {json.dumps(proposal.config['buckets'])}")
        lines.append("time: " + time_line(times, seconds))
        print("\n".join(lines), flush=True)


def grpo_summary(trajectory: list[dict]) -> dict:
    """A stage's GRPO steps in brief (its trajectory points, rl/step.py): steps, steps without an
    update (no group differed), the mean share of informative groups (groups whose accuracy
    differs: the curriculum's signal) and samples drawn per step (dynamic sampling's cost);
    None where the points predate the fields."""
    share = [t["informative_groups"] for t in trajectory if t.get("informative_groups") is not None]
    drawn = [t["samples"] for t in trajectory if t.get("samples") is not None]
    return {
        "steps": len(trajectory),
        "no_signal": sum(1 for t in trajectory if t.get("no_signal")),
        "informative_groups": round(float(np.mean(share)), 4) if share else None,
        "samples_per_step": round(float(np.mean(drawn)), 2) if drawn else None,
    }
