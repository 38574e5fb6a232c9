"""Qwen3 configurations: the published dense shapes and `tiny`, the embedded default."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """The fields of Hugging Face's Qwen3Config that the dense model uses."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 40960

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")

    def to_hf(self) -> dict:
        """config.json contents that transformers loads as Qwen3ForCausalLM."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            **dataclasses.asdict(self),
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "torch_dtype": "float32",
            "rope_scaling": None,
        }

    @classmethod
    def from_hf(cls, data: dict) -> Qwen3Config:
        """From a config.json dict; ValueError for anything this port does not implement."""
        arch = data.get("architectures") or []
        if data.get("model_type") != "qwen3" and "Qwen3ForCausalLM" not in arch:
            raise ValueError(
                f"unsupported architecture {arch or data.get('model_type')!r}: "
                "only dense Qwen3 (Qwen3ForCausalLM) is implemented"
            )
        if data.get("attention_bias"):
            raise ValueError("unsupported: attention_bias=true")
        if data.get("use_sliding_window"):
            raise ValueError("unsupported: use_sliding_window=true")
        rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise ValueError(f"unsupported rope type {rope.get('rope_type')!r}")
        theta = data.get("rope_theta", rope.get("rope_theta", 1_000_000.0))
        heads = data["num_attention_heads"]
        return cls(
            vocab_size=data["vocab_size"],
            hidden_size=data["hidden_size"],
            intermediate_size=data["intermediate_size"],
            num_hidden_layers=data["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=data.get("num_key_value_heads", heads),
            head_dim=data.get("head_dim") or data["hidden_size"] // heads,
            rms_norm_eps=data.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            tie_word_embeddings=data.get("tie_word_embeddings", False),
            max_position_embeddings=data.get("max_position_embeddings", 40960),
        )


PRESETS = {
    # Sized for the embedded tokenizer (1,024 tokens) and a 2-core CPU: about 0.72M parameters,
    # ~0.35-0.55 s per SFT step of 16 boards, so the embedded default's warm start reaches a few
    # percent valid on the benchmark within its budget (a 3.4M shape was 3x slower per step
    # and had learned nothing usable at the same wall time).
    "tiny": Qwen3Config(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
    ),
    # About 100M parameters: the bench shape.
    "100m": Qwen3Config(
        vocab_size=32768,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        tie_word_embeddings=True,
    ),
    "qwen3-0.6b": Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
    "qwen3-1.7b": Qwen3Config(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
    "qwen3-4b": Qwen3Config(
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
    "qwen3-8b": Qwen3Config(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
    ),
}
