"""The paper-scale run: Qwen3-4B from a local Hugging Face checkpoint, sharded over a mesh,
groups of 8 with dynamic sampling, thinking on (the policy's and the engineer's), training on
2-agent boards only (the 3-5-agent benchmark then measures transfer), the engineer editing the
other axes between stages: four stages, so three engineered rounds.

    python -m launch.main --config=configs/qwen3_4b.py --config.model.checkpoint=/path/to/Qwen3-4B \
        --workdir=gs://bucket/t2t/run1
    # multi-host: the same command on every host (TPU pods: addresses are auto-detected)
    python -m launch.main --config=configs/qwen3_4b.py --config.distributed.enabled=True ...
    # the rehearsal: every code path of this config with the tiny model, on CPU in minutes
    python -m launch.main --config=configs/qwen3_4b.py:rehearsal --workdir=/tmp/rehearsal
    # the paper's "GRPO (random)" row, in both readings (docs/evaluation.md); ',' joins arguments
    python -m launch.main --config=configs/qwen3_4b.py:grpo_random ...   # a random environment per stage
    python -m launch.main --config=configs/qwen3_4b.py:grpo_broad ...    # one fixed broad environment

No SFT (a pretrained model already answers in the format). Full benchmark sets (150 boards per
cell) at the first and last points. Memory and time per chip of this config's compiled steps:
`python -m launch.aot --config=configs/qwen3_4b.py --suggest` (docs/model.md).
"""

import json

from t2t_jax.config.defaults import base

# Every environment the engineer may propose within agent_range (2, 2): all sizes, all densities.
BROAD = {"size": [3, 10], "agents": 2, "hole_density": [0.0, 0.5], "min_distance": 1, "weight": 1.0}
# grpo_random: a random mixture per stage, as engineer.kind=random draws it; grpo_broad: BROAD every stage.
BASELINES = ("grpo_random", "grpo_broad")


def get_config(arg: str = ""):
    c = base()
    # attention auto: splash on TPU, cuDNN on GPU (attn_chunk 512: the chunked kernel elsewhere).
    # 8 micro-batches of 32 sequences of 512 + 8,192 tokens at fsdp over every chip (what fits
    # where: `launch.aot --suggest`, docs/model.md).
    c.model.update(preset="qwen3-4b", checkpoint="", dtype="bfloat16", remat="full", attention="auto", attn_chunk=512)
    c.mesh = {"data": 1, "fsdp": -1, "tensor": 1}
    c.env.initial = json.dumps(
        {
            "max_size": 10,
            "max_agents": 5,
            "buckets": [
                {"size": [3, 5], "agents": 2, "hole_density": [0.0, 0.2], "min_distance": 1, "weight": 1.0},
                {"size": [6, 8], "agents": 2, "hole_density": [0.1, 0.3], "min_distance": 2, "weight": 1.0},
            ],
        }
    )
    # The continuous-batching engine: 64 rows in flight, so a 7,000-token reply holds one slot, not
    # the whole batch; on TPU its cache is paged (rollout.kv=auto), a pool of every slot's full
    # length (pages=0: no row waits). A pool of fewer pages holds more slots in the same memory;
    # rows beyond it wait or are recomputed (`launch.aot --what=paged_decode`, docs/model.md).
    c.rollout.update(
        max_new_tokens=8192,
        temperature=1.0,
        top_p=1.0,
        enable_thinking=True,
        prompt_style="full",
        engine="continuous",
        slots=64,
        chunk=32,
    )
    c.sft.steps = 0
    # Dynamic sampling on, 4 rounds of draws at most. The base model solves these boards 2-15% of the
    # time; a group of 8 carries signal with probability 1-(1-p)^8-p^8: 0.15, 0.34, 0.57, 0.73 at
    # p = 0.02, 0.05, 0.10, 0.15 (less where rates differ between boards). Without it an update of 32
    # groups holds 4.8-23 informative ones, and `dapo` divides by every row's tokens, so the step
    # shrinks with that share (up to 5x between stages as the engineer moves the difficulty). With it:
    # 19 (p = 0.02; 4 rounds, then filled at advantage 0) to 32 informative groups an update, at 4.0,
    # 3.4, 2.1, 2.0 rounds of generation (1.2 at the frontier, p = 0.5). docs/grpo.md.
    c.grpo.update(
        steps=100,
        prompts=32,
        group_size=8,
        loss_type="dapo",
        beta=0.0,
        dynamic_sampling=True,
        dynamic_sampling_rounds=3,
    )
    c.optim.update(learning_rate=1e-6, warmup_steps=10, decay_steps=300)
    # share_prompts off: prompts are ~300 of up to ~8,500 tokens here (little to save), and the
    # cached forward holds every row's keys/values for the layer scan.
    c.train.update(micro_batches=8, logprob_chunk=512, share_prompts=False)
    # The engineer thinks (up to 4,096 tokens, then its JSON under the schema), as Qwen3 does by default.
    # Three engineered rounds, as the paper's case study ("after three rounds of LLM-engineered
    # curriculum"): the last stage makes no proposal, so 4 stages = env.initial, then 3 proposed configs.
    c.engineer.update(agent_range=(2, 2), failure_cases=8, thinking=True, thinking_tokens=4096)
    c.stages = 4
    # The table's decoding: Qwen3's thinking-mode settings (temperature 0.6, top-p 0.95, top-k 20), as its
    # model card advises against greedy decoding with thinking on; the paper does not state its
    # own. One seeded sample per board; every results file records it (docs/evaluation.md).
    c.eval.update(per_cell=None, mid_per_cell=30, heldout=256, batch_size=64, decoding="qwen3_thinking")
    args = [a for a in arg.split(",") if a]
    for a in args:
        if a not in ("rehearsal", *BASELINES):
            raise ValueError(f"configs/qwen3_4b.py: unknown argument {a!r} (known: rehearsal, {', '.join(BASELINES)})")
    if "grpo_random" in args and "grpo_broad" in args:
        raise ValueError("configs/qwen3_4b.py: grpo_random and grpo_broad are two baselines; give one")
    if "grpo_random" in args:
        c.engineer.kind = "random"
    if "grpo_broad" in args:
        c.engineer.kind = "fixed"
        c.env.initial = json.dumps({"max_size": 10, "max_agents": 5, "buckets": [BROAD]})
    if "rehearsal" in args:  # every code path above, with the tiny model (tests/test_pod.py)
        c.model.update(preset="tiny", checkpoint="", tokenizer="", attn_chunk=16)  # the embedded tokenizer
        c.rollout.update(max_new_tokens=24, slots=8, chunk=8, kv="paged", page_size=8)
        c.grpo.update(steps=2, prompts=4, group_size=4, dynamic_sampling_rounds=1)  # (the path, at half the draws)
        c.train.update(micro_batches=2, logprob_chunk=8)
        c.stages = 2
        c.engineer.update(failure_cases=1, max_tokens=200, max_edits=1, thinking_tokens=16)
        c.eval.update(
            per_cell=1, mid_per_cell=1, heldout=8, batch_size=16, monitor=8, monitor_samples=2, ood_per_cell=1
        )
        c.checkpoint.update(every=1)
        c.logging.update(text_every=1)
    return c
