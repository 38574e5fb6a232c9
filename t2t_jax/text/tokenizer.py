"""Tokenizers: a Hugging Face tokenizer from a local checkpoint, or the small embedded one.

Both load through `transformers.AutoTokenizer` (never remote code) and must carry a chat
template in Qwen3's `<|im_start|>` format. Special ids are explicit: `pad` (Qwen3's
`<|endoftext|>`) is never the chat end-of-turn `<|im_end|>`, so padding can never mask an EOS out
of a loss; generation stops at any of `stop_ids`.

The embedded tokenizer is byte-level BPE (every string encodes, nothing is unknown) trained with
the `tokenizers` library on generated prompts, plans and environment-config JSON;
`python -m t2t_jax.text.tokenizer` rebuilds it into t2t_jax/text/embedded/.
"""

from __future__ import annotations

import json
import os
import random

from transformers import AutoTokenizer

EMBEDDED_DIR = os.path.join(os.path.dirname(__file__), "embedded")
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"
SPECIAL = (PAD, IM_START, IM_END, THINK, END_THINK)
VOCAB_SIZE = 1024

# Qwen3's template, reduced to what this project sends (system/user/assistant turns and the
# enable_thinking switch, which pre-fills an empty think block when off).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def load_tokenizer(path: str | None = None):
    """A tokenizer from a local checkpoint directory, or the embedded one when path is None."""
    path = path or EMBEDDED_DIR
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    if not tok.chat_template:
        raise ValueError(f"tokenizer at {path!r} has no chat template")
    if tok.pad_token is None:
        if PAD not in tok.get_vocab():
            raise ValueError(f"tokenizer at {path!r} has no pad token and no {PAD!r}")
        tok.pad_token = PAD
    if tok.pad_token == IM_END:
        raise ValueError("the pad token must not be <|im_end|>: padding would mask the EOS")
    return tok


def stop_ids(tok) -> list[int]:
    """Token ids that end a completion: <|im_end|> and <|endoftext|> where present."""
    vocab = tok.get_vocab()
    ids = [vocab[t] for t in (IM_END, PAD) if t in vocab]
    if tok.eos_token_id is not None and tok.eos_token_id not in ids:
        ids.append(tok.eos_token_id)
    return ids


def training_corpus(num_boards: int, seed: int = 0):
    """Texts like those the tokenizer will see: chat prompts, plans, config JSON."""
    from t2t_jax.env import io, reference
    from t2t_jax.env.types import ACTION_NAMES
    from t2t_jax.text.prompts import chat_messages

    rng = random.Random(seed)
    for _ in range(num_boards):
        n = rng.randint(3, 10)
        k = rng.randint(1, min(6, n))
        board = reference.generate(rng, n, k, rng.uniform(0, 0.5), min_distance=0)
        for m in chat_messages(board):
            yield f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n"
        plan = [[rng.choice(ACTION_NAMES) for _ in range(rng.randint(0, 12))] for _ in range(k)]
        yield f"{IM_START}assistant\n{THINK}\n\n{END_THINK}\n\n{io.plan_to_text(plan)}{IM_END}\n"
        bucket = {
            "size": [n, rng.randint(n, 10)],
            "agents": [1, k],
            "hole_density": [0.0, round(rng.uniform(0, 0.5), 2)],
            "min_distance": rng.randint(0, 3),
            "weight": round(rng.uniform(0.1, 3), 2),
        }
        yield json.dumps({"buckets": [bucket], "reward_weights": {"valid": 1.0, "optimal": 0.5}})


def build_embedded(out_dir: str = EMBEDDED_DIR, num_boards: int = 3000) -> None:
    """Train the embedded byte-level BPE tokenizer and save it for AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(num_boards), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=IM_END, additional_special_tokens=[IM_START, THINK, END_THINK]
    )
    fast.chat_template = CHAT_TEMPLATE
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)


if __name__ == "__main__":
    build_embedded()
    print(f"wrote {EMBEDDED_DIR}")
