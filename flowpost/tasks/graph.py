"""Expand a pipeline into nodes with stable ids, dependencies and fingerprints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from flowpost.core.config.schema.datasets import DatasetConfig, SampledPairsDataset, TrajectoriesDataset
from flowpost.core.config.schema.fingerprints import fingerprinted
from flowpost.core.config.schema.pipeline import PipelineConfig
from flowpost.core.io import sha256_json
from flowpost.tasks.base_model import base_params
from flowpost.tasks.code_scope import PackageCode, installed_code


class NodeKind(StrEnum):
    """What a node does; its value is the id prefix and what fingerprints and tags record."""

    ACQUIRE = "acquire"
    CONDITIONS = "conditions"
    LATENTS = "latents"
    TRAIN = "train"
    EVAL = "eval"
    EXPORT = "export"
    PROMOTE = "promote"
    REPORT = "report"


@dataclass(frozen=True)
class Node:
    """One unit of work: ``kind`` is its function, ``key`` the config entry it runs."""

    id: str
    kind: NodeKind
    key: str
    deps: tuple[str, ...]
    config: dict[str, Any]


PROMOTED = "promoted export"  # a source: the export WORKSPACE/promoted.json names
Sources = Callable[[Node, dict[str, str]], dict[str, str]]  # (node, upstream fingerprints) -> {source: value}


def build_nodes(pipeline: PipelineConfig) -> list[Node]:
    """All nodes of ``pipeline`` in a valid execution order."""
    p = pipeline
    nodes: list[Node] = []
    common = {"seed": p.seed, "smoke": p.smoke}
    for name, dataset in p.datasets.items():
        nodes.append(
            Node(
                f"acquire.{name}",
                NodeKind.ACQUIRE,
                name,
                _sampling_deps(dataset),
                {**common, **dataset.model_dump(mode="json")},
            )
        )
    for name, cond in p.conditions.items():
        extra = sorted(
            {
                prompt
                for stage in p.stages.values()
                if stage.data is not None and stage.data.conditions == name and stage.callbacks.validation is not None
                for prompt in stage.callbacks.validation.prompts
            }
        )
        nodes.append(
            Node(
                f"conditions.{name}",
                NodeKind.CONDITIONS,
                name,
                tuple(f"acquire.{ds}" for ds in cond.datasets),
                {**cond.model_dump(mode="json"), "extra_prompts": extra},
            )
        )
    for name, latents in p.latents.items():
        nodes.append(
            Node(
                f"latents.{name}",
                NodeKind.LATENTS,
                name,
                (f"acquire.{latents.dataset}",),
                latents.model_dump(mode="json"),
            )
        )
    for name, stage in p.stages.items():
        deps = []
        if stage.data is not None:
            deps += [f"acquire.{stage.data.dataset}", f"conditions.{stage.data.conditions}"]
            deps += [f"acquire.{stage.data.prompts}"] if stage.data.prompts else []
            deps += [f"latents.{stage.data.latents}"] if stage.data.latents else []
        start = stage.model.fallback if stage.model.init == "previous" else stage.model.init
        if start != "scratch":
            deps.append(f"train.{start}")
        nodes.append(
            Node(
                f"train.{name}",
                NodeKind.TRAIN,
                name,
                tuple(deps),
                {**common, **fingerprinted(stage)},
            )
        )
    evaluate = fingerprinted(p.evaluate)
    for name in p.evaluate.after:
        rewards = [reward.model_dump(mode="json") for reward in p.stages[name].rewards]  # the reward-judge gap
        deps = [
            f"train.{name}",
            f"acquire.{p.evaluate.dataset}",
            f"conditions.{p.evaluate.conditions}",
        ]
        base = {"base": base_params(p, name)} if p.evaluate.compare_to_base else {}
        nodes.append(
            Node(
                f"eval.{name}",
                NodeKind.EVAL,
                name,
                tuple(deps),
                {**common, **evaluate, "rewards": rewards, **base},
            )
        )
    if p.export is not None:
        source = p.export.from_stage
        deps = [f"train.{source}"] + ([f"eval.{source}"] if source in p.evaluate.after else [])
        nodes.append(
            Node(
                "export",
                NodeKind.EXPORT,
                source,
                tuple(deps),
                {
                    **common,
                    **fingerprinted(p.export),
                    "weights": p.evaluate.weights,
                },
            )
        )
    if p.export is not None and p.export.promote is not None:
        gate = p.export.promote.model_dump(mode="json")
        nodes.append(Node("promote", NodeKind.PROMOTE, p.export.from_stage, ("export",), {**common, **gate}))
    reported = (NodeKind.EVAL, NodeKind.EXPORT, NodeKind.PROMOTE)
    read = [  # their guard records and cost ledgers
        f"train.{name}" for name, stage in p.stages.items() if stage.guard is not None or name in p.evaluate.after
    ]
    report_deps = (*(node.id for node in nodes if node.kind in reported), *read)
    nodes.append(Node("report", NodeKind.REPORT, "report", report_deps, {**common, "name": p.name}))
    return _dependencies_first(nodes)


def _sampling_deps(dataset: DatasetConfig) -> tuple[str, ...]:
    """What a dataset sampled from a finished stage (teacher trajectories, preference pairs) reads."""
    if isinstance(dataset, TrajectoriesDataset):
        return (f"train.{dataset.trajectories.stage}", f"conditions.{dataset.trajectories.conditions}")
    if isinstance(dataset, SampledPairsDataset):
        sample = dataset.sample
        return (f"train.{sample.stage}", f"acquire.{sample.prompts}", f"conditions.{sample.conditions}")
    return ()


def _dependencies_first(nodes: list[Node]) -> list[Node]:
    """``nodes`` reordered so that each follows its dependencies, otherwise in their given order (an
    acquisition sampled from a stage comes after that stage)."""
    ordered: list[Node] = []
    placed: set[str] = set()
    pending = list(nodes)
    while pending:
        ready = next(node for node in pending if placed.issuperset(node.deps))
        pending.remove(ready)
        ordered.append(ready)
        placed.add(ready.id)
    return ordered


def fixed_folder(node: Node, pipeline: PipelineConfig) -> str:
    """The node's folder among the fixed folders DVC uses (``data/``, ``conditions/``, ``latents/``, ``stages/``,
    ``eval/``)."""
    key = node.key
    return {
        NodeKind.ACQUIRE: f"data/{key}",
        NodeKind.CONDITIONS: f"conditions/{key}",
        NodeKind.LATENTS: f"latents/{key}",
        NodeKind.TRAIN: f"stages/{key}",
        NodeKind.EVAL: f"eval/{key}",
        NodeKind.EXPORT: f"stages/{key}/export",
        NodeKind.PROMOTE: f"stages/{key}/promotion",
        NodeKind.REPORT: "report",
    }[node.kind]


# The modules each node kind runs: its task function's file (a training node's also the stage process it
# starts). What the runner, the graph, the flows, DVC and the CLI add decides which nodes run, not what a
# node computes, so it is in no scope; the registered trainer, family, rewards and metrics a node's config
# names are added to its scope (``PackageCode.registered``), and so are its plugins' (``PackageCode.plugins``).
CODE_ENTRIES: dict[NodeKind, tuple[str, ...]] = {
    NodeKind.ACQUIRE: ("flowpost.tasks.acquire",),
    NodeKind.CONDITIONS: ("flowpost.tasks.conditions",),
    NodeKind.LATENTS: ("flowpost.tasks.latents",),
    NodeKind.TRAIN: ("flowpost.tasks.train", "flowpost.stage"),
    NodeKind.EVAL: ("flowpost.tasks.evaluate",),
    NodeKind.EXPORT: ("flowpost.tasks.export",),
    NodeKind.PROMOTE: ("flowpost.tasks.promote",),
    NodeKind.REPORT: ("flowpost.tasks.report",),
}
SAMPLED_ENTRIES = {"trajectories": "flowpost.tasks.trajectories", "sample": "flowpost.tasks.sample_pairs"}


def code_scope(node: Node, package: PackageCode | None = None) -> list[str]:
    """The flowpost modules ``node``'s result depends on: its kind's entry modules (and a sampled dataset's
    sampler), the registered modules its config names, their imports transitively (``tasks/code_scope.py``).

    The model a sampled dataset, an evaluation or an export loads is the stage's, whose family is in the
    training node's scope: a change there reaches them through its fingerprint."""
    package = package or installed_code()
    acquire = node.kind is NodeKind.ACQUIRE
    sampled = [module for key, module in SAMPLED_ENTRIES.items() if acquire and node.config.get(key)]
    return package.scope([*CODE_ENTRIES[node.kind], *sampled], node.config)


def code_fingerprint(node: Node, package: PackageCode | None = None) -> str:
    """Hash of the sources of ``node``'s code scope, the classes its plugin names resolve to, and the versions of
    the numeric libraries they run on."""
    package = package or installed_code()
    return package.fingerprint(
        code_scope(node, package),
        plugins=package.plugins(node.config),
        libraries=package.plugin_libraries(node.config),
    )


def reads_promoted(node: Node) -> bool:
    """Whether the node's result depends on the promoted export: the gate, and stages with ``init: previous``."""
    return node.kind is NodeKind.PROMOTE or (node.kind is NodeKind.TRAIN and node.config["model"]["init"] == "previous")


def fingerprint_inputs(
    nodes: list[Node], *, code: str | PackageCode | None = None, sources: Sources | None = None
) -> dict[str, dict[str, Any]]:
    """Node id -> what its fingerprint hashes: kind, config, upstream fingerprints, the code fingerprint of
    its scope (in ``code``'s sources, by default the running flowpost's; a string: that, for every node),
    and the node's ``sources`` (state outside the config its result depends on) when it has any."""
    package = code if isinstance(code, PackageCode) else None
    inputs: dict[str, dict[str, Any]] = {}
    prints: dict[str, str] = {}
    for node in nodes:
        deps = {d: prints[d] for d in node.deps}
        node_code = code if isinstance(code, str) else code_fingerprint(node, package)
        inputs[node.id] = {"kind": node.kind.value, "config": node.config, "deps": deps, "code": node_code}
        found = sources(node, deps) if sources is not None else {}
        if found:
            inputs[node.id]["sources"] = found
        prints[node.id] = sha256_json(inputs[node.id])
    return inputs


def fingerprints(
    nodes: list[Node], *, code: str | PackageCode | None = None, sources: Sources | None = None
) -> dict[str, str]:
    """Node id -> hash(kind, config, upstream fingerprints, code fingerprint of its scope, sources)."""
    inputs = fingerprint_inputs(nodes, code=code, sources=sources)
    return {node: sha256_json(value) for node, value in inputs.items()}
