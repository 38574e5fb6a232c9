"""How the benchmark table is decoded, by name (a leaf module: the schema and launchers import it).

    decoding.resolve("qwen3_thinking")           # {"decoding": "qwen3_thinking", "temperature": 0.6,
                                                 #  "top_p": 0.95, "top_k": 20}
    decoding.resolve("sampled", 0.8, 0.9, 40)    # one completion per board at these settings
    decoding.resolve("greedy")                   # temperature 0: the argmax completion

The table scores one completion per board. `greedy` takes the argmax token (how this codebase has
read the paper's table, whose decoding the paper does not state); a preset samples it at fixed
settings (seeded); `sampled` samples it at settings the caller gives. Every results file records
the resolved settings (`record`), so two tables say whether they were decoded alike.
"""

from __future__ import annotations

# Presets: (temperature, top_p, top_k). qwen3_thinking: the Qwen3 model card's advice for thinking
# mode, which warns against greedy decoding there (repetition).
PRESETS: dict[str, tuple[float, float, int]] = {"qwen3_thinking": (0.6, 0.95, 20)}
DECODINGS = ("greedy", "sampled", *PRESETS)
# The settings `sampled` starts from (eval.temperature / top_p / top_k and launch.eval's flags).
DEFAULTS = (1.0, 1.0, 0)


def resolve(name: str, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0) -> dict:
    """A decoding by name -> {"decoding", "temperature", "top_p", "top_k"}: greedy (temperature 0,
    no filter), a preset's settings, or `sampled` at the given ones. ValueError names an unknown
    decoding."""
    if name == "greedy":
        temperature, top_p, top_k = 0.0, 1.0, 0
    elif name in PRESETS:
        temperature, top_p, top_k = PRESETS[name]
    elif name != "sampled":
        raise ValueError(f"decoding: {name!r} is not one of {list(DECODINGS)}")
    return {"decoding": name, "temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k)}


def unused_settings(name: str, temperature: float, top_p: float, top_k: int) -> list[str]:
    """The names among temperature / top_p / top_k given away from `DEFAULTS` that decoding `name`
    would ignore (greedy and the presets fix all three; only `sampled` reads them)."""
    if name == "sampled":
        return []
    given = zip(("temperature", "top_p", "top_k"), (temperature, top_p, top_k), DEFAULTS)
    return [n for n, v, default in given if v != default]


def record(settings: dict, seed: int, max_new_tokens: int, enable_thinking: bool | None = None) -> dict:
    """What a results file records of its decoding: `resolve`'s settings, the seed of the sampled
    draws, the token budget and (where known) the thinking mode."""
    out = {**settings, "seed": int(seed), "max_new_tokens": int(max_new_tokens)}
    if enable_thinking is not None:
        out["enable_thinking"] = bool(enable_thinking)
    return out


def describe(rec: dict | None) -> str:
    """One line of a recorded decoding (`record`), for tables; "not recorded" for older files."""
    if not rec:
        return "not recorded"
    if rec.get("decoding") == "greedy" or not rec.get("temperature"):
        text = f"{rec.get('decoding', 'greedy')} (temperature 0)"
    else:
        text = f"{rec['decoding']} (temperature {rec['temperature']:g}, top-p {rec['top_p']:g}, top-k {rec['top_k']})"
    keys = ("seed", "max_new_tokens") if rec.get("temperature") else ("max_new_tokens",)
    extra = [f"{k.replace('_', ' ')} {rec[k]}" for k in keys if k in rec]
    if "enable_thinking" in rec:
        extra.append("thinking on" if rec["enable_thinking"] else "thinking off")
    return text + (", " + ", ".join(extra) if extra else "")
