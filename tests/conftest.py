"""Shared fixtures: quiet analytics, a tiny pipeline, a Prefect test server for the session."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="flowpost-prefect-"))
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["DVC_NO_ANALYTICS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_TRANSFORMER = {
    "num_layers": 1,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "caption_projection_dim": 16,
}


def tiny_pipeline_dict(**train: Any) -> dict[str, Any]:
    """A small pipeline: digits, MiniLM cache, a tiny SFT stage, a short eval, export, report."""
    return {
        "name": "tiny",
        "seed": 0,
        "smoke": True,
        "datasets": {"digits": {"source": "builtin-digits"}},
        "conditions": {"minilm": {"encoder": "minilm", "datasets": ["digits"]}},
        "stages": {
            "sft": {
                "trainer": "sft",
                "model": {"family": "tiny-sd3", "transformer": dict(TINY_TRANSFORMER)},
                "data": {"dataset": "digits", "conditions": "minilm"},
                "train": {
                    "lr": 1e-3,
                    "batch_size": 8,
                    "max_steps": 3,
                    "checkpoint_every": 2,
                    **train,
                },
                "callbacks": {"ema": {"decay": 0.9}, "grad_clip": {"max_norm": 1.0}},
            }
        },
        "evaluate": {"after": ["sft"], "samples": 20, "steps": 2, "batch_size": 10},
        "export": {"from": "sft"},
    }


@pytest.fixture(scope="session")
def tiny_pipeline():  # noqa: ANN201
    """Factory of tiny pipeline mappings; keyword arguments override ``stages.sft.train``."""
    return tiny_pipeline_dict


@pytest.fixture(scope="session")
def long_pipeline() -> dict[str, Any]:
    """The tiny pipeline with an SFT stage that trains far longer than any test waits, checkpointing every
    5 steps, not in smoke mode (for tests that stop a run while it trains)."""
    return {**tiny_pipeline_dict(max_steps=100_000, checkpoint_every=5), "smoke": False}


@pytest.fixture(scope="session")
def sd3_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random SD3 diffusers pipeline folder (``tests/tiny_sd3_pipeline.py``)."""
    from tiny_sd3_pipeline import build_tiny_sd3_pipeline

    return build_tiny_sd3_pipeline(tmp_path_factory.mktemp("sd3") / "pipeline")


@pytest.fixture(scope="session")
def flux1_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random FLUX.1-dev diffusers pipeline folder (``tests/tiny_flux1_pipeline.py``)."""
    from tiny_flux1_pipeline import build_tiny_flux1_pipeline

    return build_tiny_flux1_pipeline(tmp_path_factory.mktemp("flux1") / "pipeline")


@pytest.fixture(scope="session")
def flux1_kontext_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random FLUX.1-Kontext-dev diffusers pipeline folder (``tests/tiny_flux1_kontext_pipeline.py``)."""
    from tiny_flux1_kontext_pipeline import build_tiny_flux1_kontext_pipeline

    return build_tiny_flux1_kontext_pipeline(tmp_path_factory.mktemp("flux1-kontext") / "pipeline")


@pytest.fixture(scope="session")
def wan2_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Wan2.1-shaped T2V diffusers pipeline folder (``tests/tiny_wan2_pipeline.py``)."""
    from tiny_wan2_pipeline import build_tiny_wan2_pipeline

    return build_tiny_wan2_pipeline(tmp_path_factory.mktemp("wan2") / "pipeline")


@pytest.fixture(scope="session")
def wan22_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random two-expert Wan2.2-A14B-shaped T2V pipeline folder (``tests/tiny_wan2_pipeline.py``)."""
    from tiny_wan2_pipeline import build_tiny_wan22_pipeline

    return build_tiny_wan22_pipeline(tmp_path_factory.mktemp("wan22") / "pipeline")


@pytest.fixture(scope="session")
def qwen_image_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen-Image diffusers pipeline folder (``tests/tiny_qwen_image_pipeline.py``)."""
    from tiny_qwen_image_pipeline import build_tiny_qwen_image_pipeline

    return build_tiny_qwen_image_pipeline(tmp_path_factory.mktemp("qwen-image") / "pipeline")


@pytest.fixture(scope="session")
def qwen_image_edit_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen-Image-Edit diffusers pipeline folder (``tests/tiny_qwen_image_edit_pipeline.py``)."""
    from tiny_qwen_image_edit_pipeline import build_tiny_qwen_image_edit_pipeline

    return build_tiny_qwen_image_edit_pipeline(tmp_path_factory.mktemp("qwen-image-edit") / "pipeline")


@pytest.fixture(scope="session")
def qwen_image_edit_plus_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen-Image-Edit-Plus diffusers pipeline folder (``tests/tiny_qwen_image_edit_pipeline.py``)."""
    from tiny_qwen_image_edit_pipeline import build_tiny_qwen_image_edit_pipeline

    folder = tmp_path_factory.mktemp("qwen-image-edit-plus") / "pipeline"
    return build_tiny_qwen_image_edit_pipeline(folder, pipeline_class="QwenImageEditPlusPipeline")


@pytest.fixture(scope="session")
def z_image_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Z-Image diffusers pipeline folder (``tests/tiny_z_image_pipeline.py``)."""
    from tiny_z_image_pipeline import build_tiny_z_image_pipeline

    return build_tiny_z_image_pipeline(tmp_path_factory.mktemp("z-image") / "pipeline")


@pytest.fixture(scope="session")
def flux2_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random FLUX.2-dev diffusers pipeline folder (``tests/tiny_flux2_pipeline.py``)."""
    from tiny_flux2_pipeline import build_tiny_flux2_pipeline

    return build_tiny_flux2_pipeline(tmp_path_factory.mktemp("flux2") / "pipeline")


@pytest.fixture(scope="session")
def flux2_klein_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random FLUX.2-klein (base) diffusers pipeline folder (``tests/tiny_flux2_pipeline.py``)."""
    from tiny_flux2_pipeline import build_tiny_flux2_pipeline

    return build_tiny_flux2_pipeline(tmp_path_factory.mktemp("flux2-klein") / "pipeline", variant="klein")


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def json_server():  # noqa: ANN201
    """``with json_server(answer) as url:`` serves POSTs on localhost; ``answer(request) -> (status, body)``
    maps each JSON request to an HTTP status and a JSON body."""
    import json
    import threading
    from contextlib import contextmanager
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    @contextmanager
    def serve(answer):  # noqa: ANN001, ANN202
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                status, body = answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/score"
        finally:
            server.shutdown()
            server.server_close()

    return serve
