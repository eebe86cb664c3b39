"""What a vision-language judge is asked and how its answer becomes a number: the probability of "yes" among the
first token's most likely answers (``yes_prob``), or a number read from its text and scaled to [0, 1] (``score``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from flowpost.errors import FlowpostError

Mode = Literal["yes_prob", "score"]
MODES = ("yes_prob", "score")
YES, NO = "yes", "no"
NUMBER = r"-?\d+(?:\.\d+)?"

POINTWISE = {
    "yes_prob": 'Does this image match the description "{prompt}"? Answer yes or no.',
    "score": 'Rate from {low} to {high} how well this image matches the description "{prompt}". '
    "Answer with the number only.",
}
PAIRWISE = {
    "yes_prob": 'Both images were generated for the description "{prompt}". Does the first image match it better '
    "than the second? Answer yes or no.",
    "score": 'Both images were generated for the description "{prompt}". Rate from {low} to {high} which matches it '
    "better: {low} means the second image, {high} the first. Answer with the number only.",
}

EDIT = {
    "yes_prob": 'The second image is the first after the edit "{prompt}". Does it follow the instruction and keep '
    "the rest of the first image? Answer yes or no.",
    "score": 'The second image is the first after the edit "{prompt}". Rate from {low} to {high} how well it '
    "follows the instruction and keeps the rest of the first image. Answer with the number only.",
}


@dataclass(frozen=True)
class Answer:
    """The judge's reply: its ``text`` and, when asked for, the first token's most likely tokens with their
    log-probabilities (``first_tokens``; None when the server sent none)."""

    text: str
    first_tokens: list[tuple[str, float]] | None = None


@dataclass(frozen=True)
class Question:
    """A templated question and the reading of its answer as a value in [0, 1]."""

    template: str
    mode: Mode
    low: float
    high: float
    pattern: re.Pattern[str]
    max_tokens: int
    top_logprobs: int

    def text(self, prompt: str) -> str:
        """The question about ``prompt``."""
        return self.template.format(prompt=prompt, low=_plain(self.low), high=_plain(self.high))

    def value(self, answer: Answer, *, where: str) -> float:
        """The answer in [0, 1]: P(yes) over P(yes) + P(no), or the number read scaled from [low, high] (and
        clamped); an answer giving neither is an error naming ``where``."""
        if self.mode == "yes_prob":
            if answer.first_tokens is None:
                raise FlowpostError(
                    "the judge answered without logprobs; mode yes_prob needs a server that returns top_logprobs "
                    "(vLLM, SGLang), else use mode: score",
                    where=where,
                )
            probability = yes_probability(answer.first_tokens)
            if probability is None:
                seen = ", ".join(repr(token) for token, _ in answer.first_tokens[:8])
                raise FlowpostError(
                    f"none of the first token's {len(answer.first_tokens)} most likely answers ({seen}, ...) is yes "
                    "or no; ask a question the judge answers with yes or no, or raise top_logprobs",
                    where=where,
                )
            return probability
        match = self.pattern.search(answer.text)
        number = match and (match.group(1) if self.pattern.groups else match.group(0))
        try:
            score = float(number) if number else math.nan
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise FlowpostError(
                f"the judge answered {answer.text[:200]!r}, in which pattern {self.pattern.pattern!r} finds no number",
                where=where,
            )
        return min(max((score - self.low) / (self.high - self.low), 0.0), 1.0)


def yes_probability(first_tokens: list[tuple[str, float]]) -> float | None:
    """P(yes) / (P(yes) + P(no)) summed over the tokens reading yes or no (any case, spaces around), or None
    when none does."""
    yes = sum(math.exp(logprob) for token, logprob in first_tokens if token.strip().lower() == YES)
    no = sum(math.exp(logprob) for token, logprob in first_tokens if token.strip().lower() == NO)
    return yes / (yes + no) if yes + no > 0 else None


def build_question(
    *,
    question: str | None,
    mode: str,
    low: float,
    high: float,
    pattern: str,
    max_tokens: int | None,
    top_logprobs: int,
    pairwise: bool,
) -> Question:
    """The checked question options (errors name ``options.<option>``); ``question`` defaults to the mode's
    template, pointwise or pairwise; ``max_tokens`` to 1 for yes_prob and 16 for score."""
    if mode not in MODES:
        raise FlowpostError(f"mode must be one of {', '.join(MODES)}, got {mode!r}", where="options.mode")
    template = question if question is not None else (PAIRWISE if pairwise else POINTWISE)[mode]
    if not isinstance(template, str) or "{prompt}" not in template:
        raise FlowpostError("question must be a text holding {prompt}", where="options.question")
    try:
        template.format(prompt="", low=0, high=1)
    except (KeyError, IndexError, ValueError) as exc:
        raise FlowpostError(
            f"question may use {{prompt}}, {{low}} and {{high}} only (literal braces doubled), got {exc!r}",
            where="options.question",
        ) from None
    for option, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise FlowpostError(f"{option} must be a number, got {value!r}", where=f"options.{option}")
    if high <= low:
        raise FlowpostError(f"high must be above low, got low {low} and high {high}", where="options.high")
    try:
        compiled = re.compile(pattern)
    except (re.error, TypeError) as exc:
        raise FlowpostError(f"pattern is not a regular expression ({exc})", where="options.pattern") from None
    tokens = max_tokens if max_tokens is not None else (1 if mode == "yes_prob" else 16)
    for option, value, top in (("max_tokens", tokens, 4096), ("top_logprobs", top_logprobs, 20)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise FlowpostError(f"{option} must be an integer in [1, {top}], got {value!r}", where=f"options.{option}")
    return Question(template, mode, float(low), float(high), compiled, tokens, top_logprobs)  # type: ignore[arg-type]


def _plain(number: float) -> str:
    """``number`` as the question writes it: ``10``, not ``10.0``."""
    return str(int(number)) if float(number).is_integer() else str(number)
