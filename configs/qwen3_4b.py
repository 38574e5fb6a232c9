"""The paper-scale run: Qwen3-4B from a local Hugging Face checkpoint, sharded over a mesh,
groups of 8, thinking on, training on 2-agent boards only (the 3-5-agent benchmark then
measures transfer), the engineer editing the other axes between stages.

    python -m launch.main --config=configs/qwen3_4b.py --config.model.checkpoint=/path/to/Qwen3-4B \
        --workdir=gs://bucket/t2t/run1
    # multi-host (TPU pods: addresses are auto-detected)
    python -m launch.main --config=configs/qwen3_4b.py --config.distributed.enabled=True ...

No SFT (a pretrained model already answers in the format). Full benchmark sets (150 boards per
cell) at the first and last points.
"""

import json

from t2t_jax.config.defaults import base


def get_config(arg: str = ""):
    c = base()
    # attention auto: splash on TPU, cuDNN on GPU (attn_chunk 512: the chunked kernel elsewhere).
    # Micro-batches of 32 sequences of 512 + 8,192 tokens fit v5e-16 at fsdp=16 (12.3 GiB of 15.75;
    # `python -m launch.aot --config=configs/qwen3_4b.py --suggest`, docs/model.md); the engine's
    # 64 decode slots fit it too (5.3 GiB). v5p-64 takes the 256 rows in one micro-batch.
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
    # the whole batch; on TPU its cache is paged (rollout.kv=auto), a pool of every slot's 8,704
    # tokens (pages=0: no row waits). A pool of fewer pages holds more slots in the same memory:
    # slots=256 with pages=8720 (557,056 tokens, a mean of 2,176 per row) fit v5e-16 in 5.4 GiB
    # (`launch.aot --what=paged_decode`, docs/model.md); rows beyond it wait or are recomputed.
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
    c.grpo.update(steps=100, prompts=32, group_size=8, loss_type="dapo", beta=0.0)
    c.optim.update(learning_rate=1e-6, warmup_steps=10, decay_steps=300)
    # share_prompts off: prompts are ~300 of up to ~8,500 tokens here (little to save), and the
    # cached forward holds every row's keys/values for the layer scan, which the AOT memory
    # figures (measured for the plain step) do not cover.
    c.train.update(micro_batches=8, logprob_chunk=512, share_prompts=False)
    c.engineer.update(agent_range=(2, 2), failure_cases=8)
    c.eval.update(per_cell=None, mid_per_cell=30, heldout=256, batch_size=64)
    if arg:
        raise ValueError(f"configs/qwen3_4b.py: unknown argument {arg!r}")
    return c
