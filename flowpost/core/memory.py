"""A stage's peak memory per GPU, estimated from its model's footprint, its layout and its batch.

Weights, gradients and AdamW's two moments take each parameter's own dtype (with ``adamw8bit``, the moments
take one byte per value plus an fp32 scale per block: ``eight_bit.STATE_BYTES_PER_VALUE``; torchao keeps the
moments of tensors under 4096 values in fp32, which this leaves out); snapshots (reference, EMA,
old policy, anchor, teacher) are fp32 copies of the trainable parameters (with LoRA: the adapters only).
FSDP2 shards all of them over the ranks; DeepSpeed ZeRO-2 shards gradients and optimizer state; DDP
replicates everything. Activations are rough: ``ACTIVATION_BYTES`` per token, hidden unit and block in
16-bit (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", without
the attention-score term fused attention kernels do not store), twice that in fp32; with gradient
checkpointing of the first N blocks (``gradient_checkpointing: N``; ``true``: all), those blocks' inputs plus the
other blocks' activations whole (at least one block's: backward has freed the others' when it recomputes the
first blocks). LoRA adds each adapted layer's rank-wide
intermediate per token (what its up-projection keeps for backward), so it grows with the rank: the ranks
summed over the layers, taken as ``trainable / (2 * hidden)`` (each layer about ``hidden`` wide on both
sides), over every token (a layer of one stream of a dual-stream block sees fewer: an upper bound).
Backward holds, on top of the kept activations, the gradient at the output of a block's widest projection
(``backward_transient``): a fused projection (FLUX.2's single-stream blocks project to q, k, v and both halves of
the gated MLP in one layer, nine times the width) is split after it, and autograd materialises each split's
gradient at the full width before summing them: ``SPLIT_GRADIENT_BUFFERS`` buffers of the widest output per
token at once (two split gradients and their sum; an upper bound for a projection that is not split, whose
gradient takes one or two). At one block of each kind it is as large as the kept activations; at a published
depth it is one block's share.
The VAE (``codec``) is held whole, in fp32, by every process that encodes or decodes; a stage that encodes its
media each step also needs the encoder's activations (``codec_activations``: the most bytes its encode of one
micro-batch holds at once, traced on the meta device), which come and go before the transformer's forward, so the
peak takes the larger of the two activation parts. Workspace, fragmentation, the CUDA context, the decoder's
activations and the reward model come on top.

Offloaded snapshots and an offloaded VAE (``stages.NAME.offload``) leave the device's total and count as ``host``
memory, per process: a snapshot lives in host memory and is copied into the weights when swapped in; the VAE
is on the device only in the phases that decode (rewards, evaluation), which hold no gradients or activations.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowpost.core.models.footprint import ModelFootprint
from flowpost.core.trainers.eight_bit import STATE_BYTES_PER_VALUE

ADAM_MOMENTS = 2  # AdamW's exp_avg and exp_avg_sq, in the parameter's dtype
SNAPSHOT_ITEMSIZE = 4  # roles.Snapshots holds fp32 copies
ACTIVATION_BYTES = 34  # per token, hidden unit and transformer block in 16-bit
SPLIT_GRADIENT_BUFFERS = 3  # the widest projection's output gradients backward holds at once
GIB = 1024**3


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU of each part of a training stage's peak."""

    weights: float
    gradients: float
    optimizer: float
    snapshots: float
    activations: float
    codec: float = 0.0
    host: float = 0.0  # offloaded snapshots and VAE, in this process's host memory: not in ``total``
    codec_activations: float = 0.0  # the VAE encode's, freed before the transformer's forward
    backward_transient: float = 0.0  # the widest projection's output gradients, on top of the kept activations

    @property
    def total(self) -> float:
        """Bytes on the device."""
        held = self.weights + self.gradients + self.optimizer + self.snapshots + self.codec
        return held + max(self.activations + self.backward_transient, self.codec_activations)


def estimate_memory(
    footprint: ModelFootprint,
    *,
    world_size: int,
    backend: str,
    roles: int = 1,
    snapshots: int = 0,
    micro_batch: int,
    text_tokens: int,
    activation_itemsize: int,
    lora: bool = False,
    eight_bit_roles: int = 0,
    codec_bytes: float = 0.0,
    hosted_snapshots: int = 0,
    hosted_codec: bool = False,
    codec_activation_bytes: float = 0.0,
) -> MemoryEstimate:
    """Per-GPU bytes for ``roles`` trainable copies (LoRA: adapters on one shared base) and ``snapshots``,
    training ``micro_batch`` samples per GPU of ``image_tokens + text_tokens`` tokens; ``lora``: the trainable
    parameters are adapters, whose intermediates grow with their rank; ``eight_bit_roles`` of the roles step
    ``adamw8bit``; ``codec_bytes``: the VAE the stage holds (not sharded); ``codec_activation_bytes``: its encode
    of one micro-batch; ``hosted_snapshots`` more snapshots and, with ``hosted_codec``, the VAE are offloaded to the
    host."""
    frozen = footprint.weight_bytes - footprint.trainable_bytes
    trainable = roles * footprint.trainable_bytes
    weight_share = 1 / world_size if backend == "fsdp2" else 1.0
    state_share = 1 / world_size if backend in ("fsdp2", "deepspeed-zero2") else 1.0
    per_sample = activation_bytes(
        footprint, text_tokens=text_tokens, activation_itemsize=activation_itemsize, lora=lora
    )
    return MemoryEstimate(
        weights=(frozen + trainable) * weight_share,
        gradients=trainable * state_share,
        optimizer=(
            ADAM_MOMENTS * (roles - eight_bit_roles) * footprint.trainable_bytes
            + STATE_BYTES_PER_VALUE * eight_bit_roles * footprint.trainable
        )
        * state_share,
        snapshots=snapshots * footprint.trainable * SNAPSHOT_ITEMSIZE * weight_share,
        activations=micro_batch * per_sample,
        codec=0.0 if hosted_codec else codec_bytes,
        host=hosted_snapshots * footprint.trainable * SNAPSHOT_ITEMSIZE + (codec_bytes if hosted_codec else 0.0),
        codec_activations=codec_activation_bytes,
        backward_transient=micro_batch * backward_transient_bytes(footprint, text_tokens, activation_itemsize),
    )


def backward_transient_bytes(footprint: ModelFootprint, text_tokens: int, activation_itemsize: int) -> float:
    """Bytes of one sample's gradients at the widest projection's output that backward holds at once."""
    tokens = footprint.image_tokens + text_tokens
    return SPLIT_GRADIENT_BUFFERS * tokens * footprint.widest_projection * activation_itemsize


def activation_bytes(footprint: ModelFootprint, *, text_tokens: int, activation_itemsize: int, lora: bool) -> float:
    """Bytes one sample's forward keeps for backward (``image_tokens + text_tokens`` tokens)."""
    tokens = footprint.image_tokens + text_tokens
    per_block = tokens * footprint.hidden * ACTIVATION_BYTES * activation_itemsize / 2
    # backward frees the kept blocks' activations before it recomputes the first blocks, one at a time
    kept = max(footprint.blocks - footprint.checkpointed, 1 if footprint.checkpointed else 0)
    per_sample = footprint.checkpointed * tokens * footprint.hidden * activation_itemsize + kept * per_block
    if lora:
        adapter_units = footprint.trainable / (2 * footprint.hidden)  # the ranks of every adapted layer, summed
        share = kept / footprint.blocks if footprint.blocks else 1.0
        per_sample += tokens * adapter_units * share * activation_itemsize
    return per_sample
