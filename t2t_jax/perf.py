"""Where the time goes: wall time per phase of a stage (`PhaseTimer`), model FLOPs per token and
model-FLOPs utilisation against the chip's peak (`CHIPS`), shared by the stage loop and
launch/aot.py.

    timer = PhaseTimer()
    with timer.phase("generation"):   # phases nest: the outermost one is charged
        ...
        timer.add("generation", tokens=n)
    timer.totals(jax.devices())   # {"generation": {"seconds", "tokens", "tokens_per_s"}, "update": {..., "mfu"}}
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

# Per chip, by jax device_kind: (HBM bytes, peak dense bf16 FLOP/s, HBM bandwidth bytes/s), from
# the published specifications.
CHIPS = {
    "TPU v4": (32 * 2**30, 275e12, 1228e9),
    "TPU v5 lite": (16 * 2**30, 197e12, 819e9),
    "TPU v5": (95 * 2**30, 459e12, 2765e9),
    "TPU v5p": (95 * 2**30, 459e12, 2765e9),
    "TPU v6 lite": (32 * 2**30, 918e12, 1640e9),
    "NVIDIA H100 80GB HBM3": (80 * 2**30, 989e12, 3350e9),
    "NVIDIA H200": (141 * 2**30, 989e12, 4800e9),
    "NVIDIA A100-SXM4-80GB": (80 * 2**30, 312e12, 2039e9),
}
PHASES = ("generation", "certification", "scoring", "logprobs", "update", "evaluation", "engineer")


def model_flops(config, what: str, rows: int, length: int, cache_length: int = 0) -> float:
    """Model FLOPs of one step over `rows` x `length` tokens (the MFU convention: no remat
    recompute): 2 per matmul weight per token forward (the LM head included), attention's two
    [T, S] products (causal: S = T / 2 on average; `decode` attends over all `cache_length`
    slots, `paged_decode` over the `cache_length` tokens a row holds on average), and x3 for the
    backward pass of `train`. `config`: a Qwen3Config."""
    from t2t_jax.models.qwen3.model import num_params

    c = config
    matmul = num_params(c) - c.hidden_size - (0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size)
    keys = cache_length if what in ("decode", "paged_decode") else length / 2
    forward = 2 * matmul + 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * keys
    return (3 if what == "train" else 1) * forward * rows * length


def peak_flops(device) -> float | None:
    """A device's peak bf16 FLOP/s (None: unknown, e.g. a CPU)."""
    chip = CHIPS.get(getattr(device, "device_kind", ""))
    return chip[1] if chip else None


class PhaseTimer:
    """Wall seconds, tokens and model FLOPs per phase. Nested phases are charged to the outermost
    one, so the phases of a stage never overlap and sum to at most its wall time (an
    evaluation's own generation counts as evaluation)."""

    def __init__(self):
        self.seconds, self.tokens, self.flops = defaultdict(float), defaultdict(int), defaultdict(float)
        self._open = None

    @contextlib.contextmanager
    def phase(self, name: str):
        if self._open is not None:  # (inside another phase: that one is charged)
            yield
            return
        self._open, start = name, time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
            self._open = None

    def add(self, name: str, tokens: int = 0, flops: float = 0.0) -> None:
        """Work of the phase `name`, counted when it is the phase charged now (call it inside)."""
        if self._open == name:
            self.tokens[name] += int(tokens)
            self.flops[name] += float(flops)

    def totals(self, devices=()) -> dict:
        """{phase: {"seconds"[, "tokens", "tokens_per_s"][, "mfu"]}}: tokens where counted, and
        model-FLOPs utilisation where FLOPs were counted and the `devices`' peak is known."""
        peaks = [peak_flops(d) for d in devices]
        peak = sum(peaks) if peaks and all(peaks) else None
        out = {}
        for name, seconds in self.seconds.items():
            row = out[name] = {"seconds": round(seconds, 3)}
            if self.tokens[name]:
                row |= {"tokens": self.tokens[name], "tokens_per_s": round(self.tokens[name] / max(seconds, 1e-9), 1)}
            if self.flops[name] and peak:
                row["mfu"] = round(self.flops[name] / max(seconds, 1e-9) / peak, 4)
        return out

    def reset(self) -> None:
        for d in (self.seconds, self.tokens, self.flops):
            d.clear()


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
