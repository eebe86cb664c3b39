"""Where a vision-language judge runs: an OpenAI-compatible chat endpoint (vLLM, SGLang, ``transformers serve``)
asked concurrently with retries, or a transformers model in this process. Both take requests as (base64 PNG
images, question) and give ``Answer``s."""

from __future__ import annotations

import base64
import io
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from PIL import Image

from flowpost.core.rewards.clip import load_pretrained
from flowpost.core.rewards.http_session import HttpSession
from flowpost.core.rewards.model_options import scoring_options
from flowpost.core.rewards.remote import checked_url, send_with_retries
from flowpost.core.rewards.vlm_questions import Answer, Question
from flowpost.errors import FlowpostError

Request = tuple[list[str], str]  # base64 PNG images, then the question


class ChatEndpoint:
    """``POST {url}/chat/completions`` of an OpenAI-compatible server, one request per question, at most
    ``concurrency`` at once; each retried as the ``remote`` reward retries (``send_with_retries``).

    Images go as PNG data URLs before the question; answers are greedy (temperature 0), with the first
    token's ``top_logprobs`` asked for in mode yes_prob. ``token_env`` names the environment variable
    holding a bearer token (vLLM's ``--api-key``).
    """

    def __init__(
        self,
        url: str,
        model: str,
        *,
        timeout: float,
        retries: int,
        backoff: float,
        concurrency: int,
        token_env: str | None,
    ) -> None:
        self.where = checked_url(url, where="options.url").rstrip("/") + "/chat/completions"
        self.url = url.rstrip("/") + "/chat/completions"
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise FlowpostError(f"timeout must be a positive number, got {timeout!r}", where="options.timeout")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise FlowpostError(f"retries must be an integer >= 0, got {retries!r}", where="options.retries")
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) or backoff < 0:
            raise FlowpostError(f"backoff must be a number >= 0, got {backoff!r}", where="options.backoff")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise FlowpostError(
                f"concurrency must be a positive integer, got {concurrency!r}", where="options.concurrency"
            )
        if token_env is not None and not os.environ.get(token_env):
            raise FlowpostError(f"environment variable {token_env} is not set", where="options.token_env")
        self.model, self.timeout, self.retries, self.backoff = model, float(timeout), retries, float(backoff)
        self.concurrency, self.token_env = concurrency, token_env
        self.http = HttpSession(timeout=self.timeout, token_env=token_env)

    def answers(self, requests: list[Request], question: Question) -> list[Answer]:
        """The server's answers to ``requests``, in order."""
        if not requests:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
            return list(pool.map(lambda request: self._answer(request, question), requests))

    def _answer(self, request: Request, question: Question) -> Answer:
        images, text = request
        content: list[dict[str, Any]] = [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}} for image in images
        ]
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": [*content, {"type": "text", "text": text}]}],
            "max_tokens": question.max_tokens,
            "temperature": 0,
        }
        if question.mode == "yes_prob":
            body |= {"logprobs": True, "top_logprobs": question.top_logprobs}
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token_env is not None:
            headers["Authorization"] = f"Bearer {os.environ.get(self.token_env, '')}"
        raw = send_with_retries(
            self.http.client(),
            self.url,
            json.dumps(body).encode(),
            headers=headers,
            retries=self.retries,
            backoff=self.backoff,
            where=self.where,
            redact=self.http.redact,
        )
        return self._parse(raw)

    def _parse(self, raw: bytes) -> Answer:
        """The first choice's text and first-token ``top_logprobs`` of a chat completion."""
        try:
            choice = json.loads(raw)["choices"][0]
            text = choice["message"]["content"] or ""
            logprobs = (choice.get("logprobs") or {}).get("content") or []
            first = [(str(t["token"]), float(t["logprob"])) for t in logprobs[0]["top_logprobs"]] if logprobs else None
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            excerpt = self.http.redact(raw[:200].decode("utf-8", "replace"))
            raise FlowpostError(
                f"the server's answer is not an OpenAI chat completion: {excerpt!r}", where=self.where
            ) from None
        return Answer(str(text), first)


class LocalVlm:
    """A transformers image-text-to-text model (``AutoModelForImageTextToText``) and its processor (chat
    template, tokenizer, image processor), asked ``batch_size`` requests per forward, left-padded (each row's
    positions count its own tokens only, so a padded row answers as it would alone): yes_prob from the last
    token's logits (log-softmax in float32, its ``top_logprobs`` most likely tokens), score from greedy
    generation."""

    def __init__(self, model: str, *, processor: str | None, device: str | None, dtype: str, batch_size: int) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.device, self.dtype, self.batch_size = scoring_options(device, dtype, batch_size)
        self.where = str(model)
        self.model = load_pretrained(AutoModelForImageTextToText, str(model), "model")
        self.model.to(dtype=self.dtype).eval().requires_grad_(False)
        option = "model" if processor is None else "processor"
        self.processor = load_pretrained(AutoProcessor, str(model if processor is None else processor), option)
        if getattr(self.processor, "chat_template", None) is None:
            raise FlowpostError(
                "the processor has no chat template; give a processor folder with chat_template.jinja",
                where=f"options.{option}",
            )
        tokenizer = self.processor.tokenizer
        if tokenizer.pad_token is None and self.batch_size > 1:
            raise FlowpostError(
                "the processor's tokenizer has no pad token, so requests cannot share a forward; set batch_size: 1",
                where="options.batch_size",
            )
        tokenizer.padding_side = "left"  # every row's last position is its own last token

    @torch.no_grad()
    def answers(self, requests: list[Request], question: Question, device: torch.device) -> list[Answer]:
        """The model's answers to ``requests``, in order, computed on ``device`` unless ``device`` was set."""
        device = self.device or device
        self.model.to(device)
        answers: list[Answer] = []
        for start in range(0, len(requests), self.batch_size):
            answers += self._answer_batch(requests[start : start + self.batch_size], question, device)
        return answers

    def _answer_batch(self, requests: list[Request], question: Question, device: torch.device) -> list[Answer]:
        texts, pictures = [], []
        for images, text in requests:
            decoded = [Image.open(io.BytesIO(base64.b64decode(image))).convert("RGB") for image in images]
            content = [{"type": "image"} for _ in decoded] + [{"type": "text", "text": text}]
            texts.append(
                self.processor.apply_chat_template(
                    [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
                )
            )
            pictures += decoded
        inputs = self.processor(text=texts, images=pictures, return_tensors="pt", padding=True)
        inputs = {
            key: value.to(device, self.dtype if value.is_floating_point() else value.dtype)
            for key, value in inputs.items()
        }
        tokenizer = self.processor.tokenizer
        if question.mode == "yes_prob":
            positions = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            logits = self.model(**inputs, position_ids=positions).logits[:, -1].float()
            top = torch.log_softmax(logits, dim=-1).topk(question.top_logprobs)
            answers = []
            for values, indices in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                first = [(tokenizer.decode([index]), value) for value, index in zip(values, indices, strict=True)]
                answers.append(Answer(tokenizer.decode([indices[0]]), first))
            return answers
        output = self.model.generate(**inputs, max_new_tokens=question.max_tokens, do_sample=False)
        prompt_width = inputs["input_ids"].shape[1]
        return [Answer(tokenizer.decode(row[prompt_width:], skip_special_tokens=True)) for row in output]
