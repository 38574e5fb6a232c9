"""`ApiPolicy`: a policy behind an OpenAI-compatible endpoint, scored like an in-process one.

    client = ChatClient(api_base, model, cache_dir=...)
    policy = ApiPolicy(client, style="full", enable_thinking=False)
    rollouts = benchmark.evaluate(policy, None, boards, max_new_tokens=4096, batch_size=64, ...)

The same chat messages (text.prompts.chat_messages), parser, validator and reward terms as
`rollout.Policy`; the server applies its own chat template and tokenizer. Completion lengths
are the server's `usage.completion_tokens` (one request per sample, so they are exact); the
token-id fields of the Rollouts are empty ([rows, 0]: nothing to train on). A request that
failed after its retries (or whose reply could not be used) scores as an empty answer (a parse
failure) and is counted in `usage["errors"]`; usage counts distinct requests (a batch padded by
repeating a board sends it once) and names the endpoint and model it came from
(`usage["endpoint"]`, `usage["model"]`: launch.eval writes usage into results_table.json).
Thinking mode goes as `chat_template_kwargs` (vLLM's, SGLang's and `launch.serve`'s switch for
Qwen3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from t2t_jax.rollout import Policy, Rollouts
from t2t_jax.serving.client import ChatClient, Request
from t2t_jax.text.prompts import chat_messages


class ApiPolicy(Policy):
    """Args: client (a ChatClient); the rest as `rollout.Policy` (no sampler, no tokenizer)."""

    def __init__(
        self,
        client: ChatClient,
        max_size: int = 10,
        max_agents: int = 5,
        horizon: int = 64,
        enable_thinking: bool = False,
        style: str = "full",
        progress: bool = False,
    ):
        super().__init__(None, None, max_size, max_agents, horizon, enable_thinking, style)
        self.client, self.progress = client, progress
        self.usage = {
            "requests": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "errors": 0,
            "cached": 0,
            "endpoint": client.api_base,
            "model": client.model,
        }

    def requests(
        self, boards: Sequence[dict], n: int, max_new_tokens: int, temperature, top_p, seed, top_k: int = 0
    ) -> list[Request]:
        """Row i * n + j: sample j of board i (seeded per sample when sampling). top_k > 0 goes in
        the body as `top_k`, the extension vLLM, SGLang and launch.serve read (OpenAI's API has none)."""
        extra = {"chat_template_kwargs": {"enable_thinking": self.enable_thinking}}
        if temperature and top_k:
            extra["top_k"] = int(top_k)
        return [
            Request(
                messages=tuple(chat_messages(b, self.style)),
                max_tokens=max_new_tokens,
                temperature=float(temperature),
                top_p=float(top_p) if temperature else 1.0,
                seed=(seed * 1009 + j) % 2**31 if temperature else None,
                extra_body=extra,
            )
            for b in boards
            for j in range(n)
        ]

    def rollout(
        self,
        params,
        boards: Sequence[dict],
        *,
        n: int,
        max_new_tokens: int,
        reward_weights: Mapping[str, float],
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> Rollouts:
        del params
        requests = self.requests(boards, n, max_new_tokens, temperature, top_p, seed, top_k)
        replies = self.client.complete_many(requests, progress=self.progress)
        unique = {self.client.key(r): reply for r, reply in zip(requests, replies)}
        for r in unique.values():  # (a batch padded by repeating a board sends it once)
            self.usage["requests"] += 1
            self.usage["prompt_tokens"] += r.prompt_tokens
            self.usage["completion_tokens"] += r.completion_tokens
            self.usage["errors"] += r.finish_reason == "error"
            self.usage["cached"] += r.cached
        rows = len(replies)
        empty = np.zeros((rows, 0), np.int32)
        return self.score(
            [b for b in boards for _ in range(n)],
            [r.text for r in replies],
            np.array([r.finish_reason == "length" for r in replies]),
            np.array([min(max(int(r.completion_tokens), 0), max_new_tokens) for r in replies], np.int32),
            max_new_tokens,
            reward_weights,
            prompt=(empty, empty.astype(bool)),
            tokens=empty,
            logprobs=np.zeros((rows, 0), np.float32),
        )
