"""Defaults shared by every stage-loop config; `configs/stage.py` and `configs/qwen3_4b.py`
start from `base()` and change what differs. Every field is overridable on the command line:
`--config.grpo.steps=20`, `--config.engineer.kind=frontier`."""

import json

import ml_collections as mlc

from t2t_jax.rl.rewards import ACCURACY_FIRST


def base() -> mlc.ConfigDict:
    c = mlc.ConfigDict()
    c.seed = 0
    # The GRPO phase's and the curriculum's seed (training boards, rollouts, held-out boards, the
    # engineer); None: `seed`. Runs that differ only in it share one warm start (launch.study --grpo_seeds).
    c.grpo_seed = mlc.config_dict.placeholder(int)
    c.stages = 3
    # JAX's persistent compilation cache (reruns and resumes skip XLA compilation); "": off.
    c.compilation_cache = "~/.cache/t2t_jax/jax"

    # attention: the kernel (auto: splash on TPU, cudnn on GPU, chunked / xla on CPU; or xla, chunked,
    # splash, cudnn: t2t_jax/models/attention.py); attn_chunk: the query block of `chunked` (0: off);
    # scan_layers: one scanned layer body (False: unrolled; compile time grows with depth), see Qwen3.
    c.model = mlc.ConfigDict(
        dict(
            preset="tiny",
            checkpoint="",
            tokenizer="",
            dtype="float32",
            remat="none",
            attention="auto",
            attn_chunk=0,
            scan_layers=True,
        )
    )
    c.mesh = mlc.ConfigDict()  # axis sizes, e.g. {"data": 1, "fsdp": -1, "tensor": 1}; empty: one device
    c.distributed = mlc.ConfigDict(dict(enabled=False, coordinator_address="", num_processes=-1, process_id=-1))

    # The first stage's environment (EnvConfig JSON); the engineer writes the later ones.
    c.env = mlc.ConfigDict(
        dict(
            initial=json.dumps(
                {
                    "max_size": 10,
                    "max_agents": 5,
                    "buckets": [{"size": [3, 5], "agents": 2, "hole_density": [0.0, 0.3], "min_distance": 1}],
                }
            ),
            horizon=64,
            chunk=256,
        )
    )
    c.rewards = mlc.ConfigDict(dict(ACCURACY_FIRST))

    # engine: "continuous" (t2t_jax/sampling/engine.py: `slots` rows in flight, `chunk` decode
    # steps between admissions, per-row budgets) or "static" (the Sampler: one batch to its
    # longest row); the same outputs for the same seed. kv: the engine's cache, "dense" (slots x
    # length per layer), "paged" (a pool of `pages` pages of `page_size` tokens shared by the slots:
    # memory follows the tokens held; pages 0: enough for every slot's full length) or "auto"
    # (paged on TPU, dense elsewhere); t2t_jax/models/paged.py.
    c.rollout = mlc.ConfigDict(
        dict(
            max_new_tokens=256,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            enable_thinking=False,
            prompt_style="full",
            engine="continuous",
            slots=64,
            chunk=32,
            kv="auto",
            page_size=64,
            pages=0,
        )
    )
    # SFT warm start (off unless steps > 0): AdamW as in `optim`, with its own rate and warmup,
    # cosine-decayed over the SFT steps; boards from `env` (EnvConfig JSON; empty: env.initial);
    # targets "witness" (the solver's plan), "canonical" (the straight plan where it is valid,
    # the witness elsewhere) or "straight" (only the boards whose straight plan is valid), see
    # rl/sft.py; answers cut at answer_length tokens. The warm-start check (off while
    # check_boards = 0): avg@check_samples valid on check_boards boards of env.initial at the
    # rollout temperature; below min_valid, another extra_steps of SFT on extra_targets (empty:
    # targets) on a restarted schedule, at most extra_rounds times (GRPO learns nothing where no
    # sample succeeds).
    c.sft = mlc.ConfigDict(
        dict(
            steps=0,
            batch_size=16,
            boards=4096,
            env="",
            learning_rate=1e-4,
            warmup_steps=10,
            targets="witness",
            answer_length=256,
            check_boards=0,
            check_samples=4,
            min_valid=0.0,
            extra_steps=400,
            extra_rounds=2,
            extra_targets="",
        )
    )
    # guidance: "witness" / "canonical" puts the certified plan into each group without a valid
    # sample (t2t_jax/rollout.py guide); "none" is plain GRPO. old_logprobs: "recompute" (the trainer's,
    # before the first of num_iterations updates) or "sampler" (the sampler's, the same full-softmax
    # log-probs). Dynamic sampling keeps groups whose `informative` terms differ: "accuracy"
    # (valid / optimal) or "reward" (the total, shaping terms included); groups that fill the
    # batch up when too few differ get advantage 0 (padding, not signal). control: "shuffle"
    # permutes the advantages within each group, the no-signal baseline of a learning claim.
    # replay: the share ([0, 1)) of each round's boards replayed from a buffer of the `replay_size`
    # most learnable boards seen (p(1-p) of the group's valid rate; PLR / SFL-style, rl/replay.py),
    # drawn by rank (temperature) mixed with staleness; 0 turns replay off.
    c.grpo = mlc.ConfigDict(
        dict(
            steps=50,
            prompts=16,
            group_size=8,
            loss_type="dapo",
            epsilon_low=0.2,
            epsilon_high=0.28,
            beta=0.0,
            scale_rewards="group",
            num_iterations=1,
            old_logprobs="recompute",
            dynamic_sampling=False,
            dynamic_sampling_rounds=0,
            informative="accuracy",
            guidance="none",
            control="none",
            replay=0.0,
            replay_size=64,
            replay_temperature=0.3,
            replay_staleness=0.1,
        )
    )
    c.optim = mlc.ConfigDict(
        dict(
            learning_rate=1e-6,
            warmup_steps=10,
            decay_steps=1000,
            end_lr_fraction=0.1,
            b1=0.9,
            b2=0.99,
            weight_decay=0.0,
            max_grad_norm=1.0,
        )
    )
    # share_prompts: a GRPO update runs each board's prompt once for its group of samples. The
    # update's log-probs are at rollout.temperature (one temperature: a mismatch biases the gradient).
    c.train = mlc.ConfigDict(dict(micro_batches=1, max_bad_steps=5, logprob_chunk=256, share_prompts=True))

    # The proposal schema bounds a proposal's length (about 130 characters per edit), so with
    # constrained decoding max_tokens = 640 never truncates up to max_edits = 4.
    # reward_guard: a self/base proposal's reward weights stay accuracy-first until the held-out
    # valid rate reaches efficiency_threshold (the paper's rule; False: the proposal's own).
    # sections: the account's sections in the prompt (each a context ablation: drop one to test
    # it); breakdown_cells: the worst (size, agents, hole band) cells shown.
    c.engineer = mlc.ConfigDict(
        dict(
            kind="self",
            edit_mode="selective",
            evidence="raw",
            failure_cases=4,
            constrained=True,
            max_tokens=640,
            # thinking: reason freely in <think>...</think> (at most thinking_tokens tokens, closed by
            # force at the budget), then the answer, under the schema when constrained (kinds self, base)
            thinking=False,
            thinking_tokens=4096,
            temperature=0.7,
            top_p=0.95,
            agent_range=(1, 5),
            max_edits=4,
            efficiency_threshold=0.6,
            reward_guard=True,
            sections="statistics,breakdown,training,cases,history",
            breakdown_cells=8,
            # kind=api: an OpenAI-compatible endpoint writes the proposals (see launch/serve.py)
            api_base="",
            model="",
            api_key_env="",
            api_timeout=300.0,
            api_retries=4,
        )
    )
    # Benchmark evaluation: per_cell boards of each (agents, size) cell at the first and last
    # points (None: all 150), mid_per_cell at the points between; heldout boards per stage.
    # samples > 0 adds avg@k / pass@k (k = samples, at rollout.temperature / top_p) to greedy.
    # monitor: a fixed set of that many boards from env.initial (the same for every seed and arm),
    # scored by avg@monitor_samples at every point: on-distribution learning with a small error.
    # target: a target distribution the curriculum does not train on (EnvConfig JSON; "": none):
    # target_boards boards of it, one fixed draw (the same for every seed and arm), scored by
    # avg@target_samples with its standard error at every point, beside the monitor.
    # ood: the out-of-distribution sets scored at the last point (the table's decoding; "" for none),
    # ood_per_cell boards of each of their cells (None: all 50).
    # decoding: how the table's one completion per board is decoded (t2t_jax/evaluation/decoding.py):
    # "greedy", "qwen3_thinking" (Qwen3's thinking-mode advice: temperature 0.6, top-p 0.95, top-k 20)
    # or "sampled" at temperature / top_p / top_k (read only then); a sampling decoding draws the
    # avg@k samples too. Every results file records it.
    c.eval = mlc.ConfigDict(
        dict(
            per_cell=None,
            mid_per_cell=30,
            heldout=128,
            batch_size=64,
            samples=0,
            monitor=0,
            monitor_samples=8,
            target="",
            target_boards=256,
            target_samples=8,
            ood="ood_6_agents,ood_dense",
            ood_per_cell=None,
            decoding="greedy",
            temperature=1.0,
            top_p=1.0,
            top_k=0,
        ),
        type_safe=False,
    )
    c.checkpoint = mlc.ConfigDict(dict(every=10, keep=3))
    c.logging = mlc.ConfigDict(dict(text_every=10))
    return c
