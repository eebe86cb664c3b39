"""A minimal OpenAI-compatible chat server for the tests: ``POST /v1/chat/completions`` answered by a transformers
vision-language model folder (greedy generation; with ``logprobs``, the first token's ``top_logprobs`` from its raw
logits, as vLLM reports them), images given as data URLs. ``transformers serve`` answers chat completions but
ignores ``logprobs``, so the yes-probability judge is tested against this server.

    python vlm_chat_server.py MODEL_FOLDER [--fail-first N]

It listens on a free loopback port, prints ``PORT <n>`` once ready, and answers the first N chat requests with
HTTP 503.
"""

from __future__ import annotations

import argparse
import base64
import io
import socket
import threading
import time
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor


def _image(url: str) -> Image.Image:
    header, _, data = url.partition(",")
    if not header.startswith("data:image/") or not header.endswith(";base64"):
        raise ValueError(f"only base64 image data URLs are served, got {header[:40]!r}")
    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


def build_app(folder: str, fail_first: int) -> FastAPI:
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    tokenizer = processor.tokenizer
    lock, seen = threading.Lock(), [0]
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    def chat(body: dict[str, Any]) -> Any:
        with lock:
            seen[0] += 1
            if seen[0] <= fail_first:
                return JSONResponse({"error": "warming up"}, status_code=503)
            content = body["messages"][-1]["content"]
            images = [_image(part["image_url"]["url"]) for part in content if part["type"] == "image_url"]
            parts = [{"type": "image"} if part["type"] == "image_url" else part for part in content]
            prompt = processor.apply_chat_template(
                [{"role": "user", "content": parts}], add_generation_prompt=True, tokenize=False
            )
            inputs = processor(text=[prompt], images=images or None, return_tensors="pt")
            with torch.no_grad():
                out = model.generate(
                    **inputs,
                    max_new_tokens=int(body.get("max_tokens", 16)),
                    do_sample=False,
                    output_logits=True,
                    return_dict_in_generate=True,
                )
        new = out.sequences[0, inputs["input_ids"].shape[1] :]
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": tokenizer.decode(new, skip_special_tokens=True)},
            "finish_reason": "length",
        }
        if body.get("logprobs"):
            top = torch.log_softmax(out.logits[0][0].float(), dim=-1).topk(int(body.get("top_logprobs", 0)) or 1)
            first = [{"token": tokenizer.decode([int(i)]), "logprob": float(v)} for v, i in zip(*top, strict=True)]
            choice["logprobs"] = {"content": [{"token": first[0]["token"], "top_logprobs": first}]}
        return {"id": "chat", "object": "chat.completion", "created": int(time.time()), "choices": [choice]}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--fail-first", type=int, default=0)
    args = parser.parse_args()
    app = build_app(args.model, args.fail_first)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
