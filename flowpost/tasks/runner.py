"""Run one node into its folder, or reuse a completed one.

With ``content`` folders (the Prefect runner's) ``WORKSPACE/<node-id>/<fingerprint[:12]>/`` holds
a node's outputs; with ``fixed`` folders (DVC's, whose cache does the addressing) the folder is
fixed per node (``data/<dataset>``, ``stages/<stage>``, ...). ``_complete.json``, written last,
records the fingerprint and the sha256 of every file the node hands on, and marks the outputs
usable; they are checked before each use (a damaged node reruns when it is asked for again, and a node
that needs it refuses to start). Without it the folder is an interrupted
attempt (``_attempt.json`` names its fingerprint): a training node of the same fingerprint resumes
from its checkpoints there; anything else starts the folder over.

``WORKSPACE/promoted.json`` (either way) records the export the promotion gate promoted; a run
reads it once, and the gate and the stages with ``init: previous`` fingerprint what it named.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from safetensors import SafetensorError

from flowpost.core.config.loading import pipeline_to_dict
from flowpost.core.config.schema.captioned import CaptionedDataset
from flowpost.core.config.schema.datasets import PromptFilesDataset, SampledPairsDataset, TrajectoriesDataset
from flowpost.core.config.schema.evaluation import EvaluateConfig
from flowpost.core.config.schema.models import ModelConfig
from flowpost.core.config.schema.pipeline import PipelineConfig
from flowpost.core.evaluation.registry import metric_direction
from flowpost.core.evaluation.samples import Better
from flowpost.core.io import (
    file_errors_reported,
    read_json,
    read_json_object,
    sha256_json,
    unwritable,
    write_bytes_atomic,
    write_json_atomic,
)
from flowpost.core.logging import get_logger
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.prompt_files import prompt_files_fingerprint
from flowpost.data.sources.registry import source_for
from flowpost.errors import FlowpostError
from flowpost.tasks.acquire import acquire_dataset
from flowpost.tasks.base_model import load_base_model
from flowpost.tasks.conditions import cache_conditions, encoder_fingerprint
from flowpost.tasks.cost import read_cost
from flowpost.tasks.curve import budget_counter
from flowpost.tasks.evaluate import evaluate_stage
from flowpost.tasks.export import export_stage
from flowpost.tasks.graph import (
    PROMOTED,
    Node,
    NodeKind,
    build_nodes,
    fingerprint_inputs,
    fixed_folder,
    reads_promoted,
)
from flowpost.tasks.guard_record import describe_guard, guard_outcome, read_guard_record
from flowpost.tasks.integrity import ATTEMPT, COMPLETE, completed_damage, output_hashes
from flowpost.tasks.latents import cache_latents
from flowpost.tasks.promote import (
    judged_against,
    promote_export,
    promoted_fingerprint,
    promoted_weights,
    read_promoted,
)
from flowpost.tasks.report import write_report
from flowpost.tasks.sample_pairs import sample_pairs
from flowpost.tasks.train import EventHandler, run_training, stage_spec
from flowpost.tasks.trajectories import acquire_trajectories
from flowpost.tasks.weights import stage_weights
from flowpost.tasks.workspace import checked_workspace

log = get_logger(__name__)
PROMPT_FILES = "prompt files"  # a source: the contents of a prompt-files dataset's path
SOURCE_FILES = "source files"  # a source: the media, captions, tables or shards a captioned dataset reads
PRETRAINED = "pretrained weights"  # a source: the files of a stage's or a cache's model.pretrained folder
PRETRAINED_KINDS = (NodeKind.TRAIN, NodeKind.CONDITIONS, NodeKind.LATENTS)  # nodes that may load model.pretrained
PROMOTED_COPIES = "promoted"  # fixed folders: copies of promoted exports, whose folders the next export reuses
Folders = Literal["content", "fixed"]  # how node folders are named: by fingerprint, or fixed for DVC
FOLDERS: tuple[Folders, ...] = ("content", "fixed")


@dataclass(frozen=True)
class NodeResult:
    node: str
    status: str  # "ran" | "cached"
    path: Path
    fingerprint: str
    seconds: float
    outputs: dict[str, Any]


class PipelineRun:
    """A pipeline bound to a workspace: node graph, fingerprints, folders, and the promoted export as found."""

    def __init__(self, pipeline: PipelineConfig, workspace: str | Path, *, folders: Folders = "content") -> None:
        self.pipeline = pipeline
        self.workspace = checked_workspace(workspace)
        self.folders = folders
        self.promoted = read_promoted(self.workspace)
        self.nodes = {node.id: node for node in build_nodes(pipeline)}
        self.inputs = fingerprint_inputs(list(self.nodes.values()), sources=self._sources)
        self.fingerprints = {node: sha256_json(inputs) for node, inputs in self.inputs.items()}

    def _sources(self, node: Node, deps: dict[str, str]) -> dict[str, str]:
        """State outside the config a node's result depends on: the files a dataset reads, the
        versions its remote reward servers report, the pretrained weights of a stage or of the text
        encoders a condition cache runs, and the promoted
        export (the one the gate compares with, or the one an ``init: previous`` stage starts from)."""
        found = served_reward_versions(self.pipeline, node.key) if node.kind is NodeKind.TRAIN else {}
        model = (node.config.get("model") or {}) if node.kind in PRETRAINED_KINDS else {}
        if model.get("pretrained") is not None:
            source = PretrainedSource(
                model["pretrained"], revision=model.get("revision"), components=model.get("components") or {}
            )
            found[PRETRAINED] = source.fingerprint()
        dataset = self.pipeline.datasets.get(node.key) if node.kind is NodeKind.ACQUIRE else None
        if isinstance(dataset, PromptFilesDataset):
            found[PROMPT_FILES] = prompt_files_fingerprint(dataset.path, where=f"datasets.{node.key}.path")
        elif isinstance(dataset, CaptionedDataset):
            found[SOURCE_FILES] = source_for(dataset).fingerprint(where=f"datasets.{node.key}")
        if node.kind is NodeKind.PROMOTE:
            found[PROMOTED] = judged_against(self.promoted, deps["export"])
        elif reads_promoted(node):
            found[PROMOTED] = promoted_fingerprint(self.promoted)
        return found

    def node(self, node_id: str) -> Node:
        if node_id not in self.nodes:
            raise FlowpostError(f"unknown node {node_id!r}; nodes: {', '.join(self.nodes)}", where="NODE")
        return self.nodes[node_id]

    def path(self, node_id: str) -> Path:
        if self.folders == "fixed":
            return self.workspace / fixed_folder(self.node(node_id), self.pipeline)
        return self.workspace / node_id / self.fingerprints[node_id][:12]

    def is_complete(self, node_id: str) -> bool:
        return _recorded_fingerprint(self.path(node_id) / COMPLETE) == self.fingerprints[node_id]

    def damage(self, node_id: str) -> str | None:
        """Why the completed ``node_id``'s outputs cannot be used (a file changed or missing), or None."""
        return completed_damage(self.path(node_id))

    def rebuild_command(self, node_id: str) -> str:
        """The command that rebuilds ``node_id`` in this workspace's folders (same pipeline and ``--set``)."""
        if self.folders == "fixed":
            return (
                f"`dvc repro --force --single-item {node_id}` "
                f"(or `flowpost run-node {node_id} --folders fixed --force`)"
            )
        return f"`flowpost run` (it reruns damaged nodes) or `flowpost run-node {node_id}`"

    def execute(
        self,
        node_id: str,
        *,
        refresh: bool = False,
        resume: bool = True,
        force: bool = False,
        on_event: EventHandler | None = None,
    ) -> NodeResult:
        """Run ``node_id`` unless a completed result with its fingerprint exists.

        ``refresh`` starts the node over; ``force`` runs it even when complete but, unlike
        ``refresh``, lets a training node resume its checkpoints (what DVC's reruns need).
        """
        node = self.node(node_id)
        out = self.path(node_id)
        fingerprint = self.fingerprints[node_id]
        if self.is_complete(node_id) and not (refresh or force):
            problem = self.damage(node_id)
            if problem is None:
                done = read_json_object(out / COMPLETE, what="completion manifest")
                return NodeResult(node_id, "cached", out, fingerprint, 0.0, done["outputs"])
            log.warning("%s is damaged (%s since it completed); running it again", out, problem)
        self.check_inputs(node_id)
        try:
            with file_errors_reported("writing or reading it", where=out):
                seconds, outputs = self._run_into(node, out, refresh=refresh, resume=resume, on_event=on_event)
        except FlowpostError as exc:
            why = None if isinstance(exc.__cause__, (OSError, SafetensorError)) else unwritable(out)
            if why is None:  # a failure of its own, or a write that already names its file
                raise
            raise FlowpostError(
                f"node {node_id} failed: its folder cannot be written ({why}); make the workspace {self.workspace} "
                "writable or free space on its disk, then run again (a training node resumes from its last checkpoint)",
                where=str(out),
            ) from exc
        return NodeResult(node_id, "ran", out, fingerprint, seconds, outputs)

    def _run_into(
        self, node: Node, out: Path, *, refresh: bool, resume: bool, on_event: EventHandler | None
    ) -> tuple[float, dict[str, Any]]:
        """Run ``node`` into ``out`` (resuming a training node's attempt there) and complete it; its
        seconds and outputs."""
        fingerprint = self.fingerprints[node.id]
        same_attempt = _recorded_fingerprint(out / ATTEMPT) == fingerprint
        if out.exists() and (node.kind is not NodeKind.TRAIN or refresh or not resume or not same_attempt):
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / COMPLETE).unlink(missing_ok=True)
        write_json_atomic(out / ATTEMPT, {"node": node.id, "fingerprint": fingerprint})
        started = time.monotonic()
        outputs = HANDLERS[node.kind](NodeCall(self, node, out, resume, on_event))
        files = output_hashes(out, node.kind)
        seconds = time.monotonic() - started
        write_json_atomic(
            out / COMPLETE,
            {
                "node": node.id,
                "fingerprint": fingerprint,
                "inputs": self.inputs[node.id],
                "outputs": outputs,
                "files": files,
                "seconds": seconds,
                "finished": time.time(),
            },
        )
        return seconds, outputs

    def check_inputs(self, node_id: str) -> None:
        """Refuse to run ``node_id`` while one of its inputs has not completed or is damaged (reads only)."""
        for dep in self.node(node_id).deps:
            self._check_input(node_id, dep)

    def _check_input(self, node_id: str, dep: str) -> None:
        """Refuse to run ``node_id`` while its input ``dep`` has not completed or is damaged."""
        complete = self.is_complete(dep)
        if not (self.path(dep).is_dir() if self.folders == "fixed" else complete):  # DVC restores outs bare
            raise FlowpostError(
                f"node {node_id} needs {dep}, which has not completed; run it first", where=str(self.path(dep))
            )
        problem = self.damage(dep) if complete else None
        if problem is not None:
            raise FlowpostError(
                f"node {node_id} needs {dep}, which is damaged: {problem} since it completed; rebuild it with "
                f"{self.rebuild_command(dep)}",
                where=str(self.path(dep)),
            )

    def publish_report(self) -> Path | None:
        """Copy the report node's ``metrics.json`` and ``report.md`` to the workspace root."""
        if not self.is_complete("report"):
            return None
        with file_errors_reported("publishing the report", where=self.workspace):
            for name in ("metrics.json", "report.md"):
                write_bytes_atomic(self.workspace / name, (self.path("report") / name).read_bytes())
        return self.workspace / "metrics.json"

    def train_spec(self, stage_name: str, out: Path, *, resume: bool = True) -> StageSpec:
        """The spec of stage ``stage_name`` writing to ``out``, its inputs taken from this workspace."""
        stage = self.pipeline.stages[stage_name]
        data, conds = (stage.data.dataset, stage.data.conditions) if stage.data else (None, None)
        prompts = stage.data.prompts if stage.data else None
        latents = stage.data.latents if stage.data else None
        cond_dir = self.path(f"conditions.{conds}") if conds else None
        return stage_spec(
            self.pipeline,
            stage_name,
            out,
            dataset_dir=self.path(f"acquire.{data}") if data else None,
            prompts_dir=self.path(f"acquire.{prompts}") if prompts else None,
            latents_dir=self.path(f"latents.{latents}") if latents else None,
            conditions_dir=cond_dir,
            encoder_fingerprint=encoder_fingerprint(cond_dir) if cond_dir else None,
            init_from=self._init_weights(stage.model),
            resume=resume,
        )

    def _init_weights(self, model: ModelConfig) -> Path | None:
        """Where a stage starts: the promoted export (``init: previous``, once one is promoted), an
        earlier stage's weights, or nothing (scratch)."""
        if model.init == "previous" and self.promoted is not None:
            return promoted_weights(self.promoted, self.workspace)
        start = model.fallback if model.init == "previous" else model.init
        return None if start == "scratch" else stage_weights(self.path(f"train.{start}"), model.init_weights)[0]


@dataclass(frozen=True)
class NodeCall:
    """What a node handler gets: the run, the node, its output folder, and how to run a training node."""

    run: PipelineRun
    node: Node
    out: Path
    resume: bool
    on_event: EventHandler | None


def _acquire(call: NodeCall) -> dict[str, Any]:
    run, key = call.run, call.node.key
    p, dataset = run.pipeline, run.pipeline.datasets[key]
    if isinstance(dataset, SampledPairsDataset):
        sample = dataset.sample
        cond_dir = run.path(f"conditions.{sample.conditions}")
        manifest = sample_pairs(
            sample,
            dataset=key,
            stage_dir=run.path(f"train.{sample.stage}"),
            prompts_dir=run.path(f"acquire.{sample.prompts}"),
            conditions_dir=cond_dir,
            encoder_fingerprint=encoder_fingerprint(cond_dir),
            out_dir=call.out,
            seed=p.seed,
            smoke=p.smoke,
        )
    elif isinstance(dataset, TrajectoriesDataset):
        sampled = dataset.trajectories
        cond_dir = run.path(f"conditions.{sampled.conditions}")
        manifest = acquire_trajectories(
            sampled,
            call.out,
            dataset=key,
            weights_dir=stage_weights(run.path(f"train.{sampled.stage}"), sampled.weights)[0],
            prompts_dir=run.path(f"acquire.{sampled.prompts}"),
            conditions_dir=cond_dir,
            encoder_fingerprint=encoder_fingerprint(cond_dir),
            seed=p.seed,
            smoke=p.smoke,
        )
    else:
        manifest = acquire_dataset(dataset, call.out, smoke=p.smoke, where=f"datasets.{key}")
    return {key: manifest[key] for key in ("counts", "assets") if key in manifest}


def _conditions(call: NodeCall) -> dict[str, Any]:
    config = call.run.pipeline.conditions[call.node.key]
    datasets = [call.run.path(f"acquire.{ds}") for ds in config.datasets]
    return cache_conditions(config, datasets, call.out, extra_prompts=call.node.config["extra_prompts"])


def _latents(call: NodeCall) -> dict[str, Any]:
    p, key = call.run.pipeline, call.node.key
    config = p.latents[key]
    dataset_dir = call.run.path(f"acquire.{config.dataset}")
    return cache_latents(config, p.datasets[config.dataset], dataset_dir, call.out, where=f"latents.{key}")


def _train(call: NodeCall) -> dict[str, Any]:
    spec = call.run.train_spec(call.node.key, call.out, resume=call.resume)
    done = run_training(spec, on_event=call.on_event)
    outputs: dict[str, Any] = {"step": done.step}
    if done.iteration is not None:  # an online trainer's budget: its rollout iterations
        outputs["iteration"] = done.iteration
    if (cost := read_cost(call.out)) is not None:
        outputs["cost"] = cost
    record = read_guard_record(call.out)
    if record is not None:
        outputs["guard"] = guard_outcome(record)
        if outputs["guard"]["fired"]:
            log.warning("%s", describe_guard(call.node.key, outputs["guard"]))
    return outputs


def _eval(call: NodeCall) -> dict[str, Any]:
    run, p = call.run, call.run.pipeline
    cond_dir = run.path(f"conditions.{p.evaluate.conditions}")
    return evaluate_stage(
        p.evaluate,
        stage=call.node.key,
        rewards=p.stages[call.node.key].rewards,
        train_dir=run.path(f"train.{call.node.key}"),
        dataset_dir=run.path(f"acquire.{p.evaluate.dataset}"),
        conditions_dir=cond_dir,
        encoder_fingerprint=encoder_fingerprint(cond_dir),
        out_dir=call.out,
        seed=p.seed,
        smoke=p.smoke,
        counter=budget_counter(p.stages[call.node.key]),
        base=load_base_model(p, call.node.key) if p.evaluate.compare_to_base else None,
    )


def _export(call: NodeCall) -> dict[str, Any]:
    run, stage = call.run, call.node.key
    eval_id = f"eval.{stage}"
    metrics = read_json(run.path(eval_id) / "metrics.json") if eval_id in run.nodes else None
    manifest = export_stage(
        stage=stage,
        train_dir=run.path(f"train.{stage}"),
        out_dir=call.out,
        weights=call.node.config["weights"],
        resolved_config=pipeline_to_dict(run.pipeline),
        fingerprints=dict(run.fingerprints),
        metrics=metrics,
        formats=tuple(call.node.config["formats"]),
    )
    return {"path": str(call.out), "step": manifest["step"], "weights": manifest["weights"]}


def _promote(call: NodeCall) -> dict[str, Any]:
    run, export = call.run, call.run.pipeline.export
    assert export is not None and export.promote is not None  # the node exists only then
    return promote_export(
        export.promote,
        stage=call.node.key,
        export_dir=run.path("export"),
        fingerprint=run.fingerprints["export"],
        incumbent=run.promoted,
        workspace=run.workspace,
        out_dir=call.out,
        keep_dir=run.workspace / PROMOTED_COPIES if run.folders == "fixed" else None,
    )


def _report(call: NodeCall) -> dict[str, Any]:
    run = call.run
    evals = {name: run.path(f"eval.{name}") for name in run.pipeline.evaluate.after}
    export = run.path("export") if "export" in run.nodes else None
    promotion = run.path("promote") if "promote" in run.nodes else None
    guarded = {name: run.path(f"train.{name}") for name, stage in run.pipeline.stages.items() if stage.guard}
    return write_report(
        name=run.pipeline.name,
        eval_dirs=evals,
        export_dir=export,
        promotion_dir=promotion,
        guard_dirs=guarded,
        train_dirs={name: run.path(f"train.{name}") for name in run.pipeline.evaluate.after},
        directions=_metric_directions(run.pipeline.evaluate),
        out_dirs=[call.out],
    )


def _metric_directions(evaluate: EvaluateConfig) -> dict[str, Better]:
    """Each evaluated metric's key -> which direction is better, for the metrics that declare one."""
    found = {
        metric.result_key: metric_direction(metric.name, where=f"evaluate.metrics.{i}")
        for i, metric in enumerate(evaluate.metrics or [])
    }
    return {key: better for key, better in found.items() if better is not None}


HANDLERS: dict[NodeKind, Callable[[NodeCall], dict[str, Any]]] = {
    NodeKind.ACQUIRE: _acquire,
    NodeKind.CONDITIONS: _conditions,
    NodeKind.LATENTS: _latents,
    NodeKind.TRAIN: _train,
    NodeKind.EVAL: _eval,
    NodeKind.EXPORT: _export,
    NodeKind.PROMOTE: _promote,
    NodeKind.REPORT: _report,
}  # a node's outputs, recorded in its completion manifest


def _recorded_fingerprint(manifest: Path) -> str | None:
    """The fingerprint a completion or attempt manifest records (None when absent or unreadable)."""
    try:
        return read_json_object(manifest, what="node manifest").get("fingerprint")
    except FlowpostError:
        return None


def served_reward_versions(pipeline: PipelineConfig, stage: str) -> dict[str, str]:
    """``rewards.N`` -> the model version each unpinned remote reward of ``stage`` serves (asked once)."""
    from flowpost.core.rewards.remote import RemoteReward

    versions = {}
    for index, reward in enumerate(pipeline.stages[stage].rewards):
        if reward.name != "remote":
            continue
        where = f"stages.{stage}.rewards.{index}"
        try:
            versions[f"rewards.{index}"] = RemoteReward(**reward.options).served_version()
        except FlowpostError as exc:
            raise FlowpostError(
                f"cannot read the reward server's model version ({exc}); start the server, or pin it "
                f"with {where}.options.version",
                where=where,
            ) from None
    return versions
