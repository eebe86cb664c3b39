"""``vlm_judge`` and ``vlm_pairwise_judge``: a vision-language model asked a templated question about each image
(UnifiedReward's pointwise judging), or about two images of a rollout group at once, each sample scoring its win
rate against the rest of its group (Pref-GRPO's pairwise preference reward)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import Tensor

from flowpost.core.rewards.remote import encode_images
from flowpost.core.rewards.vlm_backends import ChatEndpoint, LocalVlm, Request
from flowpost.core.rewards.vlm_questions import NUMBER, Question, build_question
from flowpost.errors import FlowpostError


class _Judge:
    """The options both judges share: with ``url``, the OpenAI-compatible server there (``model`` is the name
    it serves); without, ``model`` (a local folder or hub id) runs in this process through transformers."""

    name: str
    pairwise = False

    def __init__(
        self,
        model: str,
        *,
        name: str | None = None,
        url: str | None = None,
        question: str | None = None,
        mode: str = "yes_prob",
        low: float = 0,
        high: float = 10,
        pattern: str = NUMBER,
        max_tokens: int | None = None,
        top_logprobs: int = 20,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        concurrency: int = 8,
        token_env: str | None = None,
        processor: str | None = None,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 8,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise FlowpostError(f"model must be a served model name or a folder, got {model!r}", where="options.model")
        if name is not None:
            if not isinstance(name, str) or not name.isidentifier():
                raise FlowpostError(f"name must be a word such as judge_style, got {name!r}", where="options.name")
            self.name = name  # two judges in one stage, each logged under its own name
        self.question: Question = build_question(
            question=question,
            mode=mode,
            low=low,
            high=high,
            pattern=pattern,
            max_tokens=max_tokens,
            top_logprobs=top_logprobs,
            pairwise=self.pairwise,
        )
        server = {"timeout": timeout != 60.0, "retries": retries != 3, "backoff": backoff != 0.5}
        server |= {"concurrency": concurrency != 8, "token_env": token_env is not None}
        local = {"processor": processor is not None, "device": device is not None, "dtype": dtype != "float32"}
        local |= {"batch_size": batch_size != 8}
        if unused := [option for option, given in (local if url is not None else server).items() if given]:
            where = "a server's judge" if url is not None else "a judge in this process (no url)"
            raise FlowpostError(f"{unused[0]} does not apply to {where}", where=f"options.{unused[0]}")
        self.backend: ChatEndpoint | LocalVlm
        if url is not None:
            self.backend = ChatEndpoint(
                url,
                model,
                timeout=timeout,
                retries=retries,
                backoff=backoff,
                concurrency=concurrency,
                token_env=token_env,
            )
        else:
            self.backend = LocalVlm(model, processor=processor, device=device, dtype=dtype, batch_size=batch_size)

    def values(self, requests: list[Request], device: torch.device) -> list[float]:
        """Each request's answer as a value in [0, 1]."""
        if isinstance(self.backend, ChatEndpoint):
            answers = self.backend.answers(requests, self.question)
        else:
            answers = self.backend.answers(requests, self.question, device)
        return [self.question.value(answer, where=self.backend.where) for answer in answers]


class VlmJudge(_Judge):
    """Each image's answer to ``question`` about its prompt: P(yes) normalised over yes and no (``yes_prob``),
    or the number in its text scaled from [``low``, ``high``] to [0, 1] (``score``)."""

    name = "vlm_judge"

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        images = encode_images(media)
        requests = [([image], self.question.text(prompt)) for image, prompt in zip(images, prompts, strict=True)]
        return torch.tensor(self.values(requests, media.device), dtype=torch.float32, device=media.device)


class VlmPairwiseJudge(_Judge):
    """Each sample's win rate against the other samples of its rollout group (``metadata["group_id"]``): the
    mean over them of P(it is the better one), asked in both orders (P = (p(a, b) + 1 - p(b, a)) / 2, so each
    pair's two probabilities sum to 1 and a group of K sums to K / 2). ``wins: count`` counts a comparison as
    1, 1/2 or 0 (Pref-GRPO's win rate) instead of its probability. A group of one scores 1/2.

    It compares whole groups, so it scores online RL rollouts only (``compares = "group"``); evaluation
    metrics and sampled pair datasets, which have no groups, refuse it.
    """

    name = "vlm_pairwise_judge"
    compares = "group"
    pairwise = True

    def __init__(
        self,
        model: str,
        *,
        wins: str = "probability",
        name: str | None = None,
        url: str | None = None,
        question: str | None = None,
        mode: str = "yes_prob",
        low: float = 0,
        high: float = 10,
        pattern: str = NUMBER,
        max_tokens: int | None = None,
        top_logprobs: int = 20,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        concurrency: int = 8,
        token_env: str | None = None,
        processor: str | None = None,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 8,
    ) -> None:
        if wins not in ("probability", "count"):
            raise FlowpostError(f"wins must be probability or count, got {wins!r}", where="options.wins")
        self.wins = wins
        options = {key: value for key, value in locals().items() if key not in ("self", "model", "wins", "__class__")}
        super().__init__(model, **options)

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        groups: dict[Any, list[int]] = defaultdict(list)
        for index, meta in enumerate(metadata):
            if not isinstance(meta, dict) or "group_id" not in meta:
                raise FlowpostError(
                    f"{self.name} compares the samples of a rollout group, and sample {index} has no group_id; it "
                    "scores online RL stages only",
                    where="rewards",
                )
            groups[meta["group_id"]].append(index)
        images = encode_images(media)
        pairs = [(a, b) for members in groups.values() for a in members for b in members if a != b]
        requests = [([images[a], images[b]], self.question.text(prompts[a])) for a, b in pairs]
        first_wins = dict(zip(pairs, self.values(requests, media.device), strict=True))
        rates = [0.5] * len(metadata)
        for members in groups.values():
            for a in members:
                others = [b for b in members if b != a]
                if others:
                    rates[a] = sum(self._win(first_wins[a, b], first_wins[b, a]) for b in others) / len(others)
        return torch.tensor(rates, dtype=torch.float32, device=media.device)

    def _win(self, ahead: float, behind: float) -> float:
        """How much the first sample wins: P(first better) from both orders, or 1, 1/2 or 0 by counting."""
        probability = (ahead + 1 - behind) / 2
        if self.wins == "probability":
            return probability
        return 1.0 if probability > 0.5 else 0.5 if probability == 0.5 else 0.0
