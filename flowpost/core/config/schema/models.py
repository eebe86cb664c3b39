"""The models of a pipeline: a stage's model (LoRA, compile, attention), and the families that fill the
condition and latent caches."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from flowpost.core.config.base import FiniteOptions, OmittingModel, StrictModel
from flowpost.core.models.attention import DEFAULT_ATTENTION, diffusers_backend
from flowpost.core.models.quantize import Quantize

PRETRAINED_OPTIONS = ("revision", "variant", "torch_dtype", "components")


class PretrainedOptions(OmittingModel):
    """The ``from_pretrained`` options of a diffusers pipeline (they apply only with ``pretrained``); left unset,
    they are left out of the params, so configs without them keep their params and fingerprints."""

    OMITTED_AT_DEFAULT = PRETRAINED_OPTIONS

    revision: str | None = Field(None, description="with pretrained: the hub revision")
    variant: str | None = Field(None, description="with pretrained: the weights variant, e.g. 'fp16'")
    torch_dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="with pretrained: the dtype the weights load in"
    )
    components: dict[str, str] | None = Field(
        None,
        description="with pretrained: folders replacing the pipeline's components one by one, e.g. {transformer: PATH}",
    )

    def _check_pretrained_for(self, pretrained: str | None, options: dict[str, Any]) -> None:
        """The pretrained options and the family's ``options`` are set only together with ``pretrained``."""
        unused = [name for name in PRETRAINED_OPTIONS if getattr(self, name) is not None]
        if pretrained is None and (unused or options):
            names = [*unused, *(["options"] if options else [])]
            raise ValueError(f"{', '.join(names)} apply only with pretrained; set pretrained or remove them")


class EncoderModelConfig(PretrainedOptions):
    """A model family whose own text encoders fill a condition cache, from its diffusers pipeline."""

    family: str
    pretrained: str = Field(description="a diffusers pipeline folder or hub id")


class ConditionsConfig(OmittingModel):
    """Which encoder caches the prompts of which datasets: a registered ``encoder`` (the tiny family's
    ``minilm``, of the digits extra) or ``model`` (a real family's own text encoders); ``max_length`` is the (T5)
    token length. Its params hold one of the two, so encoder caches keep their params."""

    OMITTED_AT_DEFAULT = ("model",)

    encoder: str = Field("minilm", description="a registered text encoder (entry point group flowpost.encoders)")
    model: EncoderModelConfig | None = None
    datasets: list[str] = Field(min_length=1)
    max_length: int = Field(16, ge=4, le=512)

    @model_validator(mode="after")
    def _one_encoder(self) -> ConditionsConfig:
        if self.model is not None and "encoder" in self.model_fields_set:
            raise ValueError("encoder and model are alternatives; remove one")
        return self

    def inapplicable(self) -> tuple[str, ...]:
        """``encoder`` when a family's ``model`` encodes the prompts."""
        return ("encoder",) if self.model is not None else ()


class CodecModelConfig(PretrainedOptions):
    """The model family whose output codec (VAE, or identity in pixel space) fills a latent cache."""

    OMITTED_AT_DEFAULT = ("pretrained", "options", *PRETRAINED_OPTIONS)

    family: str = "tiny-sd3"
    pretrained: str | None = Field(None, description="a diffusers pipeline folder or hub id (real families)")
    options: FiniteOptions = Field(
        default_factory=dict, description="with pretrained: the family's options, as the stage's model.options"
    )

    @model_validator(mode="after")
    def _options_need_pretrained(self) -> CodecModelConfig:
        self._check_pretrained_for(self.pretrained, self.options)
        return self


class LatentsConfig(StrictModel):
    """A dataset's media encoded once by a family's output codec (its VAE's posterior mean), so that SFT and
    offline DPO stages read latents instead of encoding every step (``data.latents``)."""

    dataset: str = Field(
        description="a dataset of demonstrations or preference pairs, with deterministic preprocessing"
    )
    model: CodecModelConfig = Field(default_factory=CodecModelConfig)
    batch_size: int = Field(32, ge=1, description="items per codec forward pass (does not change the latents)")


class LoraConfig(StrictModel):
    """Train low-rank adapters instead of every weight; exports merge them into the weights."""

    rank: int = Field(8, ge=1)
    alpha: float | None = Field(None, gt=0, description="scaling numerator; default: rank")
    targets: list[str] | None = Field(None, description="module names; default: the family's attention")


class CompileConfig(StrictModel):
    """``torch.compile`` of the transformer: each repeated block on its own (regional: one compilation serves
    every block of a class, so it compiles in a fraction of the whole model's time) or the whole network."""

    regional: bool = Field(True, description="compile each repeated transformer block; false: the whole network")
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = Field(
        "default", description="torch.compile's mode"
    )
    backend: str = Field("inductor", min_length=1, description="torch.compile's backend (inductor, aot_eager, eager)")
    fullgraph: bool = Field(False, description="fail on a graph break instead of running it eagerly")
    dynamic: bool | None = Field(None, description="torch.compile's dynamic shapes; null: its own detection")

    def options(self) -> dict[str, Any]:
        """The keyword arguments of ``torch.compile``."""
        return self.model_dump(exclude={"regional"})


class ModelConfig(PretrainedOptions):
    """The model a stage trains: a registered family, initialised from scratch, a stage or the promoted export.
    Its params leave out the pretrained options, the family's ``options``, ``attention``, ``compile`` and
    ``quantize`` at their defaults and ``fallback`` without ``init: previous``, so other stages keep their
    fingerprints."""

    OMITTED_AT_DEFAULT = ("pretrained", "options", "attention", "compile", "quantize", *PRETRAINED_OPTIONS)

    family: str = "tiny-sd3"
    init: str = Field(
        "scratch", description="'scratch', 'previous' (the workspace's promoted export) or an earlier stage"
    )
    fallback: str = Field(
        "scratch", description="with init: previous, what to start from while nothing is promoted: 'scratch' or a stage"
    )
    init_weights: Literal["ema", "live"] = Field(
        "ema", description="which weights of that stage; ema falls back to live"
    )
    shift: float = Field(1.0, gt=0, description="flow-matching sigma shift")
    transformer: FiniteOptions = Field(default_factory=dict, description="transformer config overrides")
    lora: LoraConfig | None = None
    quantize: Quantize = Field(
        "none",
        description="with lora: the frozen base's Linear weights in the repeated blocks stored in 8 bits (torchao "
        "weight-only, one fp32 scale per row), for every pass; the adapters stay fp32",
    )
    pretrained: str | None = Field(None, description="a diffusers pipeline folder or hub id (real families)")
    options: FiniteOptions = Field(
        default_factory=dict,
        description="with pretrained: the family's own options (every family: gradient_checkpointing, true or the "
        "number of blocks from the first; sd3: "
        "resolution; wan2: height, width, num_frames, fps, vae_tiling; flux1: resolution, distilled_guidance; "
        "qwen-image: resolution, cfg_norm; z-image: resolution, cfg_normalization)",
    )
    attention: str = Field(
        DEFAULT_ATTENTION,
        description="the transformer's attention backend through diffusers' dispatch: sdpa (torch), flash, sage, "
        "xformers, flex, ... (what the installed diffusers knows; its package must be installed)",
    )

    compile: CompileConfig | None = Field(
        None, description="torch.compile the transformer (regional per block by default); null: eager"
    )

    @field_validator("attention")
    @classmethod
    def _known_attention(cls, value: str) -> str:
        if value != DEFAULT_ATTENTION:
            diffusers_backend(value)
        return value

    @model_validator(mode="after")
    def _fallback_needs_previous(self) -> ModelConfig:
        if self.init != "previous" and self.fallback != "scratch":
            raise ValueError("fallback applies only to init: previous; remove it or set init: previous")
        return self

    @model_validator(mode="after")
    def _options_need_pretrained(self) -> ModelConfig:
        self._check_pretrained_for(self.pretrained, self.options)
        return self

    def inapplicable(self) -> tuple[str, ...]:
        """``fallback`` without ``init: previous``."""
        return ("fallback",) if self.init != "previous" else ()
