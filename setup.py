"""t2t_jax: Trainee-to-Trainer in JAX (MAPF-FrozenLake, Qwen3 in Flax, GRPO, the environment engineer)."""
from setuptools import find_packages, setup

setup(
    name="t2t_jax",
    version="0.1.0",
    description="Trainee-to-Trainer: an RL policy LLM that engineers its own next training environment (JAX).",
    python_requires=">=3.11,<3.13",
    packages=find_packages(include=["t2t_jax", "t2t_jax.*", "launch", "configs"]),
    package_data={"t2t_jax": ["evaluation/data/*.jsonl", "evaluation/data/*.json", "text/embedded/*"]},
    install_requires=[
        "jax>=0.7,<0.11",
        "flax>=0.11,<0.13",
        "optax>=0.2.5,<0.3",
        "chex>=0.1.90,<0.2",
        "orbax-checkpoint>=0.11,<0.13",
        "jumanji>=1.1,<1.2",
        "transformers>=4.56,<6",
        "tokenizers>=0.21,<0.24",
        "safetensors>=0.5,<0.9",
        "numpy>=2.0,<2.5",
        "scipy>=1.13,<2",  # the paired test of results.json (also a jax dependency)
        "absl-py>=2.1,<3",
        "ml_collections>=1.0,<1.2",
        "tensorboard>=2.18,<2.22",
        "pillow>=10,<14",
        "tqdm>=4.66,<5",
        "python-sat>=1.8.dev20,<1.10",  # only .dev releases are published
        "outlines-core>=0.2.10,<0.3",
    ],
    extras_require={
        "test": [
            "pytest>=8,<10",
            "hypothesis>=6.100,<7",
            "torch==2.13.0",
            "gymnasium>=1.0,<1.5",
            "jsonschema>=4.20,<5",
        ],
        "tpu": ["jax[tpu]>=0.7,<0.11"],
        "gpu": ["jax[cuda12]>=0.7,<0.11"],
    },
)
