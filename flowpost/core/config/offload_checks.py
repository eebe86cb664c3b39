"""Where a stage's ``offload`` names nothing it holds or cannot work: a snapshot its trainer does not capture under
its arguments (nor the EMA callback), a VAE a pixel-space model lacks or one the stage encodes every batch with,
rewards it does not have, and snapshots sharded by FSDP2 (DTensors, not host copies)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowpost.core.contracts import Acquisition
from flowpost.core.snapshots import Snapshot

if TYPE_CHECKING:
    from flowpost.core.config.schema.models import ModelConfig
    from flowpost.core.config.schema.stages import StageConfig
    from flowpost.core.trainers.arguments import TrainerArguments


def held_snapshots(stage: StageConfig, arguments: TrainerArguments) -> frozenset[Snapshot]:
    """The snapshots the stage holds: those its trainer captures under ``arguments``, and the EMA callback's."""
    from flowpost.core.trainers.registry import trainer_class

    held = trainer_class(stage.trainer).snapshots_held(arguments)
    return held | {Snapshot.EMA} if stage.callbacks.ema is not None else held


def offload_problems(
    name: str, stage: StageConfig, arguments: TrainerArguments, network: ModelConfig | None
) -> list[str]:
    """Why stage ``name`` cannot offload what its ``offload`` lists (``network``: the model block defining its
    network, following ``model.init``; None from the promoted export)."""
    where = f"stages.{name}.offload"
    problems = []
    held = {str(snapshot) for snapshot in held_snapshots(stage, arguments)}
    for snapshot in [entry for entry in stage.offload if entry in set(Snapshot)]:
        if snapshot not in held:
            holds = ", ".join(sorted(held)) or "none"
            problems.append(
                f"{where}: {snapshot}: trainer {stage.trainer!r} holds no {snapshot!r} snapshot with these settings "
                f"(it holds: {holds}); remove it"
            )
        elif stage.launch.backend == "fsdp2":
            problems.append(
                f"{where}: {snapshot}: FSDP2 shards snapshots over the ranks already, as DTensors that have no host "
                "copy here; remove it or use launch.backend ddp"
            )
    if "vae" in stage.offload:
        problems += _vae_problems(where, stage, arguments, network)
    if "rewards" in stage.offload and not stage.rewards:
        problems.append(f"{where}: rewards: the stage scores no rewards; remove it")
    return problems


def _vae_problems(
    where: str, stage: StageConfig, arguments: TrainerArguments, network: ModelConfig | None
) -> list[str]:
    from flowpost.core.models.registry import FAMILY_REGISTRY, adapter_class

    if network is not None and network.pretrained is None and not FAMILY_REGISTRY.problem(network.family, where=where):
        if adapter_class(network.family, where=where).scratch_channels(network.transformer) is not None:
            return [f"{where}: vae: family {network.family!r} samples in pixel space and has no VAE; remove it"]
    reads_latents = stage.data is not None and stage.data.latents is not None
    if arguments.execution_contract.acquisition is Acquisition.DATASET and not reads_latents:
        return [
            f"{where}: vae: the stage encodes every batch of its dataset with the VAE, which would move it twice per "
            "step; read a latent cache (data.latents) or remove it"
        ]
    return []
