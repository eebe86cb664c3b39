"""The pipeline as DVC stages: ``params.yaml`` (the resolved pipeline) and ``dvc.yaml`` (one stage per node).

Each DVC stage calls ``flowpost run-node NODE --pipeline params.yaml --workspace workspace --folders
fixed --force``: DVC decides what is stale, flowpost runs it in the node's fixed folder. Outs are
the durable results only; a training stage's checkpoints are ``persist: true, cache: false`` so a
killed ``dvc repro`` resumes (with ``evaluate.every`` the eval stages depend on them and each
``curve.json`` is a plot over ``step``). ``workspace/promoted.json`` is workspace state outside DVC: the
promotion gate and stages with ``init: previous`` read it, so their stages are ``always_changed``
(flowpost still reuses what did not change: a training stage resumes its finished checkpoints).

Each node's code fingerprint (the sources of the flowpost modules in its scope and the numeric
libraries' versions, as the runner hashes them: ``graph.code_fingerprint``) reaches DVC through the
``code`` stage: ``always_changed``, it writes ``workspace/code/<node>.json`` for every node, the first
dependency of that node's stage, so a new flowpost, installed editable or as a package, reruns the nodes
whose code changed, as ``flowpost plan`` does, and nothing in the two files depends on where flowpost is
installed. A stage, condition cache or latent cache whose ``model.pretrained`` is a local folder depends
on that folder and on its ``model.components`` folders, as its fingerprint does (a hub id is a param).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from flowpost.core.config.loading import pipeline_to_dict
from flowpost.core.config.schema.fingerprints import fingerprinted_keys
from flowpost.core.config.schema.pipeline import PipelineConfig
from flowpost.core.io import file_errors_reported, write_bytes_atomic
from flowpost.core.models.pretrained import is_hub_id
from flowpost.data.captioned import source_dependencies
from flowpost.errors import FlowpostError
from flowpost.tasks.base_model import base_params, base_stage
from flowpost.tasks.code_scope import installed_code
from flowpost.tasks.curve import CURVE_FILE
from flowpost.tasks.graph import (
    Node,
    NodeKind,
    build_nodes,
    code_fingerprint,
    code_scope,
    fixed_folder,
    reads_promoted,
)
from flowpost.tasks.runner import PRETRAINED_KINDS

PARAMS_FILE = "params.yaml"
DVC_FILE = "dvc.yaml"
WORKSPACE = "workspace"
CODE_STAGE = "code"
CODE_DIR = f"{WORKSPACE}/code"  # <node>.json: the node's code fingerprint, the first dependency of its stage
HEADER = "# Written by `flowpost dvc sync`; edit the pipeline file and sync again instead of editing this.\n"


def _params(node: Node, pipeline: PipelineConfig) -> list[str]:
    """The ``params.yaml`` keys a node's fingerprint reads (the same exclusions as the fingerprint)."""
    common = ["seed", "smoke"]
    if node.kind is NodeKind.ACQUIRE:
        return [*common, f"datasets.{node.key}"]
    if node.kind is NodeKind.CONDITIONS:
        return [f"conditions.{node.key}"]
    if node.kind is NodeKind.LATENTS:
        return [f"latents.{node.key}"]
    if node.kind is NodeKind.TRAIN:
        return [*common, *fingerprinted_keys(f"stages.{node.key}", pipeline.stages[node.key])]
    if node.kind is NodeKind.EVAL:
        base = []
        if pipeline.evaluate.compare_to_base:  # the model fields its base model is made from
            first = base_stage(pipeline, node.key)
            base = [f"stages.{first}.model.{key}" for key in base_params(pipeline, node.key)]
        return [*common, *fingerprinted_keys("evaluate", pipeline.evaluate), f"stages.{node.key}.rewards", *base]
    if node.kind is NodeKind.EXPORT and pipeline.export is not None:
        return [*common, *fingerprinted_keys("export", pipeline.export), "evaluate.weights"]
    if node.kind is NodeKind.PROMOTE:
        return [*common, "export.promote"]
    return ["name", "evaluate.after"]


def _outs(node: Node, folder: str) -> dict[str, list[Any]]:
    if node.kind is NodeKind.TRAIN:
        return {
            "outs": [f"{folder}/final", {f"{folder}/checkpoints": {"persist": True, "cache": False}}],
        }
    if node.kind is NodeKind.REPORT:
        return {"outs": [f"{WORKSPACE}/report.md"], "metrics": [{f"{WORKSPACE}/metrics.json": {"cache": False}}]}
    return {"outs": [folder]}


def code_file(node_id: str) -> str:
    """The ``code`` stage's out holding ``node_id``'s code fingerprint."""
    return f"{CODE_DIR}/{node_id}.json"


def dvc_stages(pipeline: PipelineConfig) -> dict[str, Any]:
    """The ``dvc.yaml`` mapping: the ``code`` stage, then one stage per node."""
    nodes = build_nodes(pipeline)
    folders = {node.id: f"{WORKSPACE}/{fixed_folder(node, pipeline)}" for node in nodes}
    stages: dict[str, Any] = {
        CODE_STAGE: {
            "cmd": f"flowpost dvc code {CODE_DIR} --pipeline {PARAMS_FILE}",
            "always_changed": True,
            "outs": [code_file(node.id) for node in nodes],
        }
    }
    for node in nodes:
        deps = [code_file(node.id), *(_dep_path(folders[dep], dep) for dep in node.deps)]
        if node.kind is NodeKind.EVAL and pipeline.evaluate.every is not None:
            deps.append(f"{folders[f'train.{node.key}']}/checkpoints")  # the curve scores them
        dataset = pipeline.datasets.get(node.key) if node.kind is NodeKind.ACQUIRE else None
        deps += source_dependencies(dataset, where=f"datasets.{node.key}") if dataset is not None else []
        deps += pretrained_dependencies(node)
        stage: dict[str, Any] = {
            "cmd": f"flowpost run-node {node.id} --pipeline {PARAMS_FILE} --workspace {WORKSPACE} "
            "--folders fixed --force",
            # DVC hashes what the node reads outside the workspace (prompts, media, shards, local pretrained weights)
            "deps": deps,
            "params": _params(node, pipeline),
        }
        stage |= _outs(node, folders[node.id])
        if reads_promoted(node):
            stage["always_changed"] = True
        stages[node.id] = stage
    return {"stages": stages, **_curve_plots(pipeline, folders)}


def pretrained_dependencies(node: Node) -> list[str]:
    """The local folders a node's ``model.pretrained`` (unless a hub id, which its params pin) and
    ``model.components`` name: the files its fingerprint hashes (``PRETRAINED_KINDS`` of the runner)."""
    model = (node.config.get("model") or {}) if node.kind in PRETRAINED_KINDS else {}
    if model.get("pretrained") is None:
        return []
    folders = [] if is_hub_id(model["pretrained"]) else [model["pretrained"]]
    return [*folders, *(folder for _, folder in sorted((model.get("components") or {}).items()))]


def _curve_plots(pipeline: PipelineConfig, folders: dict[str, str]) -> dict[str, Any]:
    """With ``evaluate.every``: a top-level plot ``<stage>-<metric>`` of each metric of each evaluated
    stage's ``curve.json`` over ``step`` (one per metric: their scales differ); the file lies inside its
    eval stage's out, so it is a plot definition rather than an out of its own."""
    evaluate = pipeline.evaluate
    if evaluate.every is None:
        return {}
    metrics = [metric.result_key for metric in evaluate.metrics or []]
    return {
        "plots": [
            {
                f"{name}-{metric}": {
                    "x": "step",
                    "y": {f"{folders[f'eval.{name}']}/{CURVE_FILE}": metric},
                    "title": f"{name}: {metric} over checkpoints",
                }
            }
            for name in evaluate.after
            for metric in metrics
        ]
    }


def _dep_path(folder: str, node_id: str) -> str:
    """What downstream stages depend on: a training stage's final weights, else the whole folder."""
    return f"{folder}/final" if node_id.startswith("train.") else folder


def render(pipeline: PipelineConfig) -> dict[str, str]:
    """File name -> text of ``params.yaml`` and ``dvc.yaml``."""
    dump = {"sort_keys": False, "default_flow_style": False, "allow_unicode": True, "width": 1000}
    return {
        PARAMS_FILE: HEADER + yaml.safe_dump(pipeline_to_dict(pipeline), **dump),
        DVC_FILE: HEADER + yaml.safe_dump(dvc_stages(pipeline), **dump),
    }


def code_files(pipeline: PipelineConfig) -> dict[str, dict[str, Any]]:
    """Node id -> what its ``code/<node>.json`` holds: its code fingerprint and the modules of its scope."""
    package = installed_code()
    files = {}
    for node in build_nodes(pipeline):
        files[node.id] = {"code": code_fingerprint(node, package), "modules": code_scope(node, package)}
    return files


def write_code_files(pipeline: PipelineConfig, folder: Path) -> dict[str, str]:
    """Write ``folder/<node>.json`` for every node (the ``code`` stage's outs); node id -> code fingerprint."""
    files = code_files(pipeline)
    for node_id, content in files.items():
        path = folder / f"{node_id}.json"
        with file_errors_reported("writing the code fingerprint", where=path):
            write_bytes_atomic(path, (json.dumps(content, indent=2) + "\n").encode())
    return {node_id: content["code"] for node_id, content in files.items()}


def sync(pipeline: PipelineConfig, root: Path, *, force: bool = False) -> list[Path]:
    """Write ``params.yaml`` and ``dvc.yaml`` into ``root`` (atomically); return the files changed.

    A file there without flowpost's ``HEADER`` was written by hand: it is kept, and nothing is
    written, unless ``force``.
    """
    rendered = {root / name: text for name, text in render(pipeline).items()}
    changed = [path for path, text in rendered.items() if not path.exists() or path.read_text() != text]
    hand_written = [path for path in changed if path.exists() and not path.read_text().startswith(HEADER)]
    if hand_written and not force:
        raise FlowpostError(
            f"{', '.join(str(path) for path in hand_written)} not written by `flowpost dvc sync` (no header "
            "line); move it aside, or pass --force to overwrite it",
            where=str(root),
        )
    with file_errors_reported("`flowpost dvc sync`", where=root):
        for path in changed:
            write_bytes_atomic(path, rendered[path].encode())
    return changed


def out_of_sync(pipeline: PipelineConfig, root: Path) -> list[str]:
    """The files under ``root`` that differ from what ``sync`` would write."""
    rendered = render(pipeline)
    return [name for name, text in rendered.items() if not (root / name).exists() or (root / name).read_text() != text]


def check_in_sync(pipeline: PipelineConfig, root: Path) -> None:
    """Raise naming the files under ``root`` that ``flowpost dvc sync`` would change."""
    stale = out_of_sync(pipeline, root)
    if stale:
        raise FlowpostError(
            f"{', '.join(stale)} out of sync with the pipeline; run `flowpost dvc sync`", where=str(root)
        )
