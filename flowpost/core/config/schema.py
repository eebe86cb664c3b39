"""Typed schema of a pipeline file. Every section rejects unknown keys."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    field_validator,
    model_serializer,
    model_validator,
)

from flowpost.core.config.base import StrictModel, non_finite_keys
from flowpost.core.extras import DEEPSPEED_INSTALL, deepspeed_installed
from flowpost.core.models.attention import DEFAULT_ATTENTION, diffusers_backend
from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.trainers.arguments import TrainerArguments
from flowpost.core.trainers.optimizers import OptimizerConfig
from flowpost.core.trainers.registry import arguments_class
from flowpost.errors import FlowpostError

NAME_PATTERN = r"^[a-z][a-z0-9_-]*$"
Name = Field(pattern=NAME_PATTERN)
Key = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
INIT_KEYWORDS = ("scratch", "previous")  # model.init values that are not stage names
EVAL_METRICS = ("adherence", "reward_mean", "fd")  # what an evaluation's metrics.json can be compared on


IMAGE_SOURCES = (  # captioned media (or preference pairs) the user brings
    "image-folder",
    "table",
    "webdataset",
    "hf-dataset",
    "video-folder",
    "preference-pairs",
)
CAPTIONED = ("caption_column", "preprocess", "split", "max_caption_chars", "max_bad_fraction")
SOURCE_FIELDS: dict[str, tuple[str, ...]] = {  # the fields each source reads besides source, path and split_seed
    "builtin-digits": ("image_size", "test_fraction"),
    "prompt-files": (),
    "image-folder": (*CAPTIONED, "allow_outside"),
    "table": (*CAPTIONED, "image_column", "allow_outside"),
    "webdataset": (*CAPTIONED, "shards", "image_keys", "caption_keys"),
    "hf-dataset": (*CAPTIONED, "image_column", "hub"),
    "video-folder": (*CAPTIONED, "frames", "allow_outside"),
    "preference-pairs": (*CAPTIONED, "chosen_column", "rejected_column", "allow_outside"),
    "teacher-trajectories": ("trajectories",),
    "sampled-pairs": ("sample",),
}
ALWAYS = ("source", "path", "split_seed")
SAMPLED_SOURCES = ("teacher-trajectories", "sampled-pairs")  # read a finished stage: no path, no split
PATH_SOURCES = ("prompt-files", "image-folder", "table", "video-folder", "preference-pairs")  # those that need ``path``
IMAGE_MEMBERS = ("png", "jpg", "jpeg", "webp", "bmp", "gif", "tif", "tiff", "npy")  # webdataset image extensions
CAPTION_MEMBERS = ("txt", "json")  # webdataset caption extensions: plain text, or a JSON object's caption field
SAMPLED_PAIRS = "sampled-pairs"  # preference pairs an acquisition node samples from a trained stage


class PreprocessConfig(StrictModel):
    """How acquisition turns a source image (or each frame of a clip) into a training image (fingerprinted)."""

    resolution: int = Field(16, ge=8, le=4096, multiple_of=4, description="square side in pixels")
    crop: Literal["center", "random"] = Field(
        "center", description="after resizing the short side: random crops are addressed by seed and item"
    )
    mode: Literal["grayscale", "rgb"] = Field("rgb", description="the model's channels: 1 (grayscale) or 3 (rgb)")
    seed: int = Field(0, description="with crop: random, the seed the per-item crop offsets derive from")
    background: Literal["white", "black"] = Field(
        "white", description="the colour transparent pixels are composited on (their hidden colour never shows)"
    )
    max_megapixels: float = Field(
        100.0, gt=0, description="larger images are skipped as bad items (oversized_image) before they are decoded"
    )


class SplitConfig(StrictModel):
    """A held-out share of the items, chosen by the hash of each item's name."""

    eval: float = Field(0.0, ge=0, lt=1, description="fraction of the items held out for evaluation")


class FrameSampling(StrictModel):
    """Which frames of a clip video-folder keeps: ``count`` frames ``1 / fps`` seconds apart from its start."""

    count: int = Field(8, ge=1, le=1024, description="frames per clip; a shorter clip is a bad item")
    fps: float = Field(8.0, gt=0, le=240, description="the rate the frames are sampled at, whatever the clip's own")


class HubDataset(StrictModel):
    """A dataset on the Hugging Face hub, loaded by ``datasets.load_dataset`` (needs the network unless cached)."""

    id: str = Field(min_length=1, description="the hub id, e.g. 'user/pets'")
    name: str | None = Field(None, description="the dataset's configuration (subset)")
    split: str = Field("train", min_length=1, description="the hub split to read")
    revision: str | None = Field(None, description="a branch, tag or commit; a commit is needed with HF_HUB_OFFLINE")


TRAJECTORIES = "teacher-trajectories"  # sampled from a finished stage: no files, no digits options


class TrajectoriesConfig(StrictModel):
    """Teacher ODE trajectories sampled once from a finished stage, at a few-step student's sigmas."""

    stage: str = Field(description="the finished stage whose weights are the teacher")
    weights: Literal["ema", "live"] = Field("ema", description="which weights of that stage; ema falls back to live")
    prompts: str = Field(description="the dataset whose training prompts are rolled out")
    conditions: str = Field(description="the condition cache that encodes those prompts")
    samples: int = Field(2000, ge=1, description="trajectories; prompts are taken in turn")
    steps: int = Field(4, ge=1, description="the student's steps: states are stored at its sigmas")
    substeps: int = Field(5, ge=1, description="teacher Euler steps per student step (steps x substeps in all)")
    guidance: float = Field(1.0, ge=0, description="classifier-free guidance of the teacher")
    batch_size: int = Field(250, ge=1, description="trajectories per teacher forward pass")


class SampledPairsConfig(StrictModel):
    """How the ``acquire.<dataset>`` node of a ``sampled-pairs`` dataset builds preference pairs: it samples
    ``candidates`` images per prompt and round from a trained stage, scores them with ``rewards`` (never the
    evaluation judge) and pairs the best with the worst."""

    stage: str = Field(description="the trained stage whose weights are sampled; the node runs after it")
    prompts: str = Field(description="the dataset whose training prompts (and labels) are sampled")
    conditions: str = Field(description="the condition cache that encodes those prompts")
    rewards: list[RewardConfig] = Field(
        default_factory=lambda: [RewardConfig(name="digit_adherence")],
        min_length=1,
        description="the weighted reward that ranks the candidates",
    )
    weights: Literal["ema", "live"] = Field("ema", description="which weights of the stage; ema falls back to live")
    candidates: int = Field(8, ge=2, description="samples per prompt and round; the best and the worst form a pair")
    rounds: int = Field(1, ge=1, description="pairs per prompt (each round draws new candidates)")
    steps: int = Field(20, ge=1, description="ODE steps per sample")
    guidance: float = Field(1.0, ge=0)
    min_gap: float = Field(0.0, ge=0, description="a group whose best and worst reward differ by less gives no pair")
    batch_size: int = Field(256, ge=1, description="samples per generation and scoring batch")


class DatasetConfig(StrictModel):
    """How to acquire one dataset: the built-in digits, prompts from files, captioned images or clips,
    preference pairs (``path``), or what a finished stage samples: teacher trajectories (``trajectories``)
    or preference pairs (``sample``)."""

    source: Literal[
        "builtin-digits",
        "prompt-files",
        "image-folder",
        "table",
        "webdataset",
        "hf-dataset",
        "video-folder",
        "teacher-trajectories",
        "preference-pairs",
        "sampled-pairs",
    ]
    path: str | None = Field(
        None,
        description="prompt-files: a .txt/.jsonl/.csv/.parquet file or a folder of them; image-folder / "
        "video-folder: a folder of images / clips; table: a .parquet/.csv/.jsonl file; hf-dataset: a folder "
        "written by save_to_disk; preference-pairs: such a table, or a folder with chosen/ and rejected/. "
        "Relative to the working directory; its contents are a source fingerprint",
    )
    sample: SampledPairsConfig | None = Field(None, description="sampled-pairs: the stage, prompts and ranking")
    allow_outside: bool = Field(
        False,
        description="folders and tables: image paths may leave the dataset's folder (absolute, '..', a symlink out); "
        "off, such a path is an error",
    )
    chosen_column: str = Field("chosen", description="preference-pairs table: the preferred image's field")
    rejected_column: str = Field("rejected", description="preference-pairs table: the dispreferred image's field")
    image_size: int = Field(16, ge=8, le=64, multiple_of=4)
    test_fraction: float = Field(0.2, gt=0, lt=1)
    split_seed: int = 0
    caption_column: str | None = Field(
        None, description="captioned sources: the caption field (webdataset: of the JSON member); default text, caption"
    )
    image_column: str = Field(
        "image", description="table / hf-dataset: the field holding image bytes, a {bytes, path} struct or a path"
    )
    shards: str | list[str] | None = Field(
        None,
        description="webdataset: .tar shards, a brace pattern ('shards/train-{000000..000009}.tar') or a list; "
        "local paths or fsspec URLs",
    )
    image_keys: list[str] = Field(
        ["png", "jpg", "jpeg", "webp", "npy"], min_length=1, description="webdataset: image member extensions, in order"
    )
    caption_keys: list[str] = Field(["txt", "json"], min_length=1, description="webdataset: caption member extensions")
    hub: HubDataset | None = Field(None, description="hf-dataset: a hub dataset instead of a save_to_disk path")
    frames: FrameSampling = Field(default_factory=FrameSampling)
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    max_caption_chars: int | None = Field(None, ge=1, description="longer captions are bad items; default: no limit")
    max_bad_fraction: float = Field(0.05, ge=0, le=1, description="more bad items than this fails the node")
    trajectories: TrajectoriesConfig | None = Field(None, description="source teacher-trajectories: what to sample")

    @field_validator("image_keys", "caption_keys")
    @classmethod
    def _readable_members(cls, keys: list[str], info: Any) -> list[str]:
        allowed = IMAGE_MEMBERS if info.field_name == "image_keys" else CAPTION_MEMBERS
        foreign = [key for key in keys if key.rpartition(".")[2].lower() not in allowed]
        if foreign:
            raise ValueError(f"{', '.join(foreign)}: only members ending in {', '.join(allowed)} are read")
        return keys

    @model_validator(mode="after")
    def _fields_for_source(self) -> DatasetConfig:
        if (self.source in PATH_SOURCES) != (self.path is not None) and self.source != "hf-dataset":
            raise ValueError(
                f"'path' is required for sources {', '.join(PATH_SOURCES)} (hf-dataset: path or hub), and only for them"
            )
        if self.source == "webdataset" and not self.shards:
            raise ValueError("source 'webdataset' reads 'shards': a brace pattern, a URL or a list of them")
        if self.source == "hf-dataset" and (self.path is None) == (self.hub is None):
            raise ValueError("source 'hf-dataset' reads one of 'path' (a save_to_disk folder) and 'hub'")
        if (self.source == TRAJECTORIES) != (self.trajectories is not None):
            raise ValueError(f"'trajectories' is required for source {TRAJECTORIES!r}, and only for it")
        if (self.source == SAMPLED_PAIRS) != (self.sample is not None):
            raise ValueError(f"'sample' is required for source {SAMPLED_PAIRS!r}, and only for it")
        unused = [n for n in type(self).model_fields if n in self.model_fields_set and n not in self._read_fields()]
        if unused:
            users = sorted({s for n in unused for s, fields in SOURCE_FIELDS.items() if n in fields})
            raise ValueError(
                f"{', '.join(unused)} do not apply to source {self.source!r} (they apply to {', '.join(users)})"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Each source's own fields only, so the digits and prompt-files keep their params and fingerprints."""
        own = self._read_fields()
        return {name: value for name, value in handler(self).items() if name in own}

    def _read_fields(self) -> tuple[str, ...]:
        """The fields this dataset's source reads (a sampled dataset has no path and no split seed)."""
        return (*(("source",) if self.source in SAMPLED_SOURCES else ALWAYS), *SOURCE_FIELDS[self.source])


PRETRAINED_OPTIONS = ("revision", "variant", "torch_dtype", "components")


class PretrainedOptions(StrictModel):
    """The ``from_pretrained`` options of a diffusers pipeline (they apply only with ``pretrained``)."""

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

    def _without_unset(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` without the pretrained options left unset, so configs without them keep their params."""
        for name in ("pretrained", *PRETRAINED_OPTIONS):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class EncoderModelConfig(PretrainedOptions):
    """A model family whose own text encoders fill a condition cache, from its diffusers pipeline."""

    family: str
    pretrained: str = Field(description="a diffusers pipeline folder or hub id")

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return self._without_unset(handler(self))


class ConditionsConfig(StrictModel):
    """Which encoder caches the prompts of which datasets: ``encoder`` (MiniLM, the tiny family's) or
    ``model`` (a real family's own text encoders); ``max_length`` is the (T5) token length."""

    encoder: Literal["minilm"] = "minilm"
    model: EncoderModelConfig | None = None
    datasets: list[str] = Field(min_length=1)
    max_length: int = Field(16, ge=4, le=512)

    @model_validator(mode="after")
    def _one_encoder(self) -> ConditionsConfig:
        if self.model is not None and "encoder" in self.model_fields_set:
            raise ValueError("encoder and model are alternatives; remove one")
        return self

    @model_serializer(mode="wrap")
    def _one_encoder_key(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``encoder`` without ``model``, ``model`` without ``encoder``: MiniLM caches keep their params."""
        data = handler(self)
        data.pop("encoder" if self.model is not None else "model", None)
        return data


class CodecModelConfig(PretrainedOptions):
    """The model family whose output codec (VAE, or identity in pixel space) fills a latent cache."""

    family: str = "tiny-sd3"
    pretrained: str | None = Field(None, description="a diffusers pipeline folder or hub id (real families)")
    options: dict[str, Any] = Field(
        default_factory=dict, description="with pretrained: the family's options, as the stage's model.options"
    )

    @model_validator(mode="after")
    def _options_need_pretrained(self) -> CodecModelConfig:
        self._check_pretrained_for(self.pretrained, self.options)
        return self

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if not self.options:
            data.pop("options", None)
        return self._without_unset(data)


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
    """The model a stage trains: a registered family, initialised from scratch, a stage or the promoted export."""

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
    transformer: dict[str, Any] = Field(default_factory=dict, description="transformer config overrides")
    lora: LoraConfig | None = None
    pretrained: str | None = Field(None, description="a diffusers pipeline folder or hub id (real families)")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="with pretrained: the family's own options (every family: gradient_checkpointing; sd3: "
        "resolution; wan2: height, width, num_frames, fps, vae_tiling; flux1: resolution, distilled_guidance; "
        "qwen-image: resolution, cfg_norm)",
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

    @field_validator("transformer", "options")
    @classmethod
    def _finite(cls, value: dict[str, Any]) -> dict[str, Any]:
        if bad := non_finite_keys(value):
            raise ValueError(f"{', '.join(bad)} is not a finite number; give a finite value")
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

    @model_serializer(mode="wrap")
    def _omit_unused_fallback(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``fallback`` only with ``init: previous``, the pretrained options, the family's ``options``, a
        non-default ``attention`` and ``compile`` only when set, so other stages keep their params and fingerprints."""
        data = handler(self)
        if self.init != "previous":
            data.pop("fallback", None)
        if not self.options:
            data.pop("options", None)
        if self.attention == DEFAULT_ATTENTION:
            data.pop("attention", None)
        if self.compile is None:
            data.pop("compile", None)
        return self._without_unset(data)


class DataRef(StrictModel):
    """The dataset and condition cache a stage reads; ``prompts`` replaces the rollout prompt pool."""

    dataset: str
    conditions: str
    prompts: str | None = Field(None, description="a prompt-files dataset whose prompts generating trainers roll out")
    latents: str | None = Field(None, description="a latent cache (latents.<name>) of the dataset, read instead of it")

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``latents`` only when set, so stages without a latent cache keep their params."""
        data = handler(self)
        if self.latents is None:
            data.pop("latents", None)
        return data


class EMAConfig(StrictModel):
    decay: float = Field(0.999, gt=0, lt=1)
    schedule: Literal["warmup", "constant", "power", "linear"] = Field(
        "warmup",
        description="warmup: min(decay, (1+n)/(10+n)); constant; power: min(decay, 1-(1+n)^-power); "
        "linear: decay*min(1, n/warmup_steps)",
    )
    warmup_steps: int = Field(100, ge=1, description="optimizer steps of the linear schedule's ramp")
    power: float = Field(2 / 3, gt=0, description="exponent of the power schedule")


class GradClipConfig(StrictModel):
    max_norm: float = Field(1.0, gt=0)


class ValidationConfig(StrictModel):
    every: int = Field(ge=1, description="optimizer steps between validation grids")
    prompts: list[str] = Field(min_length=1)
    samples_per_prompt: int = Field(4, ge=1)
    steps: int = Field(20, ge=1)
    guidance: float = Field(1.0, ge=0)


class CallbacksConfig(StrictModel):
    ema: EMAConfig | None = None
    grad_clip: GradClipConfig | None = None
    validation: ValidationConfig | None = None
    trackers: list[Literal["tensorboard", "dvclive", "wandb"]] = Field(default_factory=list)


class LaunchConfig(StrictModel):
    """How many processes train a stage. Topology (nodes, addresses) comes from flags/env."""

    num_processes: int = Field(1, ge=1, description="processes over all machines; global batch sizes are split")
    backend: Literal["ddp", "fsdp2", "deepspeed-zero2"] = "ddp"
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no", description="bf16: the network computes under bfloat16 autocast; weights, gradients, optimizer in fp32"
    )
    hang_timeout: float | None = Field(
        1800.0, gt=0, description="seconds without an event from the stage before it is killed as hung; null: never"
    )

    @model_validator(mode="after")
    def _available(self) -> LaunchConfig:
        if self.backend == "deepspeed-zero2" and self.num_processes > 1 and not deepspeed_installed():
            raise ValueError(f"backend 'deepspeed-zero2' needs DeepSpeed: {DEEPSPEED_INSTALL}, or use ddp or fsdp2")
        if self.mixed_precision == "fp16":
            raise ValueError("fp16 needs loss scaling, which flowpost does not do; use mixed_precision: bf16")
        return self


class RewardConfig(StrictModel):
    """One reward of a weighted sum; ``options`` go to the scorer's constructor; on video, ``frames`` says
    what it scores."""

    name: str
    weight: float = 1.0
    options: dict[str, Any] = Field(default_factory=dict)
    frames: Literal["first", "sampled", "clip"] | None = Field(
        None, description="on video: the first frame, evenly sampled frames (their mean score) or the whole clip"
    )
    sampled_frames: int | None = Field(None, ge=1, description="with frames: sampled, how many frames (default 4)")

    @field_validator("options")
    @classmethod
    def _finite(cls, value: dict[str, Any]) -> dict[str, Any]:
        if bad := non_finite_keys(value):
            raise ValueError(f"{', '.join(bad)} is not a finite number; give a finite value")
        return value

    @model_validator(mode="after")
    def _count_needs_sampled(self) -> RewardConfig:
        if self.sampled_frames is not None and self.frames != "sampled":
            raise ValueError("sampled_frames applies only to frames: sampled; set it or remove sampled_frames")
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_frames(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The frame choice only when set, so image stages keep their params and fingerprints."""
        data = handler(self)
        for name in ("frames", "sampled_frames"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class StageConfig(StrictModel):
    """One training stage: a trainer, its model, data and arguments."""

    trainer: str
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataRef | None = None
    train: dict[str, Any] = Field(default_factory=dict)
    optimizers: dict[Key, OptimizerConfig] = Field(
        default_factory=dict, description="one optimizer per trainable role of a multi-role trainer (e.g. dmd2)"
    )
    sampling: SamplingConfig | None = None
    rewards: list[RewardConfig] = Field(default_factory=list)
    callbacks: CallbacksConfig = Field(default_factory=CallbacksConfig)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    guard: GuardConfig | None = Field(
        None, description="evaluate held-out samples during the stage; stop at the last good checkpoint on a violation"
    )

    @field_validator("trainer")
    @classmethod
    def _lowercase(cls, value: str) -> str:
        if value != value.lower():
            raise ValueError(f"trainer names are lowercase; use {value.lower()!r}")
        return value

    @model_serializer(mode="wrap")
    def _omit_no_optimizers(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``optimizers`` only for multi-role trainers and ``guard`` only when set, so other stages keep their
        params and fingerprints."""
        data = handler(self)
        if not self.optimizers:
            data.pop("optimizers", None)
        if self.guard is None:
            data.pop("guard", None)
        return data

    def arguments(self, *, smoke: bool = False, where: str = "trainer") -> TrainerArguments:
        """The validated ``train:`` section as the trainer's arguments class."""
        arguments = arguments_class(self.trainer, where=where)
        args = arguments.model_validate(arguments.for_family(self.train, self.model.family))
        return args.smoke() if smoke else args


class MetricConfig(StrictModel):
    """One evaluation metric: a registered metric or reward name, its options, its key in ``metrics.json``."""

    name: str
    key: Key | None = Field(None, description="its name in metrics.json and the report; default: name")
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("options")
    @classmethod
    def _finite(cls, value: dict[str, Any]) -> dict[str, Any]:
        if bad := non_finite_keys(value):
            raise ValueError(f"{', '.join(bad)} is not a finite number; give a finite value")
        return value

    @property
    def result_key(self) -> str:
        return self.key or self.name

    @model_serializer(mode="wrap")
    def _omit_unset_key(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if self.key is None:
            data.pop("key", None)
        return data


class StatisticBand(StrictModel):
    """The band a guarded statistic must stay in: absolute ``min`` / ``max``, and at most ``max_change`` away
    from its value at the stage start."""

    min: float | None = Field(None, description="the lowest allowed value")
    max: float | None = Field(None, description="the highest allowed value")
    max_change: float | None = Field(None, ge=0, description="the largest allowed distance from the start's value")
    options: dict[str, Any] = Field(default_factory=dict, description="the statistic's options, e.g. {threshold: 0.1}")

    @model_validator(mode="after")
    def _a_band(self) -> StatisticBand:
        if self.min is None and self.max is None and self.max_change is None:
            raise ValueError("give min, max or max_change (or remove the statistic)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}; swap them")
        return self


class GuardConfig(StrictModel):
    """A stage's guard: every ``every`` budget units it samples the stage's held-out prompts from the current
    weights and scores them; when ``metric`` falls more than ``max_drop`` below its value at the stage start,
    or a statistic of ``bounds`` leaves its band, the stage ends with the last checkpoint that passed."""

    metric: MetricConfig | None = Field(None, description="the judge: a registered metric, not the stage's reward")
    max_drop: float | None = Field(None, ge=0, description="the largest allowed fall of metric below its start")
    better: Literal["higher", "lower"] = Field("higher", description="which direction of metric is better")
    bounds: dict[str, StatisticBand] = Field(
        default_factory=dict, description="registered metric (e.g. brightness) -> the band it must stay in"
    )
    every: int | None = Field(None, ge=1, description="budget units between checks; default: train.checkpoint_every")
    samples: int = Field(100, ge=2, description="held-out samples per check (the same noise at every check)")
    steps: int = Field(20, ge=1, description="ODE steps per sample")
    guidance: float = Field(1.0, ge=0)
    seed: int = Field(4321, description="the noise seed of the samples")
    batch_size: int = Field(250, ge=1)
    weights: Literal["ema", "live"] = Field("ema", description="the weights checked; ema falls back to live")

    @model_validator(mode="after")
    def _something_guarded(self) -> GuardConfig:
        if (self.metric is None) != (self.max_drop is None):
            raise ValueError("metric and max_drop go together; give both, or neither and only bounds")
        if self.metric is None and not self.bounds:
            raise ValueError("a guard needs a metric with max_drop, or bounds")
        return self


# what an evaluation's metrics.json holds besides the metrics
RESULT_FIELDS = """trained_reward reward_judge_gap intervals per_seed metrics headline n_samples samples_per_seed
weights seed eval_seed eval_seeds smoke steps guidance stage step grid curve""".split()
DIGITS_METRICS = ("adherence", {"name": "digit_adherence", "key": "reward_mean"}, "fd")  # judge, reward, judge FD
REFERENCE_METRICS = ("fd", "fd_clip", "fd_dinov2")  # compare the samples with held-out real images


class EvaluateConfig(StrictModel):
    """Evaluation of stage checkpoints on a dataset's held-out prompts: the held-out split of the digits or of
    an image dataset (``split.eval``), or every prompt of a prompt-files dataset no stage trains on."""

    after: list[str] = Field(default_factory=list)
    dataset: str | None = Field(
        None,
        description="held-out prompts (and real images): a dataset with a held-out split, or a prompt-files "
        "dataset of test prompts kept apart from the training ones; default: first dataset",
    )
    conditions: str | None = Field(None, description="condition cache of the prompts; default: first one")
    metrics: list[MetricConfig] | None = Field(
        None,
        description="registered metrics or rewards; the first is the headline (judge). Default for a builtin-digits "
        "dataset: adherence, digit_adherence (as reward_mean), fd",
    )
    samples: int = Field(500, ge=2, description="per seed; at least 2: a Frechet distance needs a covariance")
    steps: int = Field(20, ge=1)
    guidance: float = Field(1.0, ge=0)
    seed: int = 1234
    seeds: list[int] | None = Field(
        None,
        min_length=1,
        description="noise seeds; several give each metric's mean and 95 % interval; default: [seed]",
    )
    batch_size: int = Field(250, ge=1)
    weights: Literal["ema", "live"] = Field("ema", description="ema falls back to live without EMA")
    every: int | None = Field(
        None,
        ge=1,
        description="budget units between scored checkpoints (a multiple of each evaluated stage's "
        "train.checkpoint_every): eval.<stage>/curve.json, one row per checkpoint and the final weights; "
        "null: the final weights only",
    )

    @model_serializer(mode="wrap")
    def _omit_unset_every(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``every`` only when configured, so pipelines without curves keep their params and fingerprints."""
        data = handler(self)
        if self.every is None:
            data.pop("every", None)
        return data

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("a seed is listed twice; list each seed once")
        return value

    @field_validator("metrics")
    @classmethod
    def _distinct_keys(cls, value: list[MetricConfig] | None) -> list[MetricConfig] | None:
        keys = [metric.result_key for metric in value or []]
        if twice := sorted({key for key in keys if keys.count(key) > 1}):
            raise ValueError(f"{', '.join(twice)} is listed twice; give one of them another key")
        if taken := [key for key in keys if key in RESULT_FIELDS]:
            raise ValueError(f"{', '.join(taken)} is a field of metrics.json already; give the metric another key")
        return value

    def noise_seeds(self) -> list[int]:
        """The seeds the samples are drawn with: ``seeds``, or ``seed`` alone."""
        return list(self.seeds) if self.seeds is not None else [self.seed]


class PromoteConfig(StrictModel):
    """The promotion gate: an export replaces the promoted one unless a metric regresses beyond ``tolerance``."""

    metrics: dict[str, Literal["higher", "lower"]] = Field(
        min_length=1, description="evaluation metric -> which direction is better"
    )
    tolerance: float = Field(0.0, ge=0, description="allowed absolute regression of each metric")

    @field_validator("metrics")
    @classmethod
    def _evaluated(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = [name for name in value if name not in EVAL_METRICS]
        if unknown:
            raise ValueError(
                f"unknown metric {', '.join(map(repr, unknown))}; the evaluation reports: {', '.join(EVAL_METRICS)}"
            )
        return value


class ExportConfig(StrictModel):
    from_stage: str = Field(alias="from")
    formats: list[Literal["diffusers", "pipeline"]] = Field(
        default_factory=lambda: ["diffusers"],
        description="diffusers: transformer/ (and lora/ when the stage trained LoRA); pipeline: a complete "
        "diffusers pipeline folder (families loaded from model.pretrained)",
    )
    promote: PromoteConfig | None = None

    @model_serializer(mode="wrap")
    def _omit_unset_promote(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``promote`` only when configured, so pipelines without a gate keep their params."""
        data = handler(self)
        if self.promote is None:
            data.pop("promote", None)
        return data


class PipelineConfig(StrictModel):
    """A whole pipeline file."""

    name: str = Name
    seed: int = 0
    smoke: bool = False
    datasets: dict[Key, DatasetConfig] = Field(min_length=1)
    conditions: dict[Key, ConditionsConfig] = Field(default_factory=dict)
    latents: dict[Key, LatentsConfig] = Field(default_factory=dict)
    stages: dict[Key, StageConfig] = Field(min_length=1)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    export: ExportConfig | None = None

    @model_serializer(mode="wrap")
    def _omit_no_latents(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``latents`` only when a cache is declared, so pipelines without one keep their params."""
        data = handler(self)
        if not self.latents:
            data.pop("latents", None)
        return data

    @model_validator(mode="after")
    def _references(self) -> PipelineConfig:
        errors: list[tuple[str, str]] = []
        for name, latents in self.latents.items():
            errors += _latents_problems(name, latents, self.datasets)
        for name, cond in self.conditions.items():
            for i, ds in enumerate(cond.datasets):
                if ds not in self.datasets:
                    errors.append((f"conditions.{name}.datasets.{i}", _unknown("dataset", ds, self.datasets)))
                elif self.datasets[ds].source == TRAJECTORIES:
                    errors.append(
                        (
                            f"conditions.{name}.datasets.{i}",
                            f"{ds!r} is sampled with this cache's conditions; list its trajectories.prompts "
                            "dataset instead",
                        )
                    )
                elif (sample := self.datasets[ds].sample) is not None:
                    errors.append(
                        (
                            f"conditions.{name}.datasets.{i}",
                            f"dataset {ds!r} is sampled from stage {sample.stage!r} on the prompts of "
                            f"{sample.prompts!r}; list {sample.prompts!r} instead",
                        )
                    )
        for name, dataset in self.datasets.items():
            if dataset.trajectories is not None:
                errors += self._sampled_dataset_problems(f"datasets.{name}.trajectories", dataset.trajectories)
            if dataset.sample is not None:
                errors += self._sampled_dataset_problems(f"datasets.{name}.sample", dataset.sample)
        earlier: list[str] = []
        for name, stage in self.stages.items():
            if name in INIT_KEYWORDS:
                errors.append((f"stages.{name}", f"{name!r} is reserved for model.init; rename the stage"))
            if stage.data is not None:
                errors += self._data_problems(name, stage.data)
                errors += self._latent_reader_problems(name, stage)
                read = self.datasets.get(stage.data.dataset)
                sampled = read.trajectories if read is not None else None
                if sampled is not None and sampled.stage not in earlier:
                    errors.append(
                        (
                            f"stages.{name}.data.dataset",
                            f"{stage.data.dataset!r} is sampled from stage {sampled.stage!r}, which must "
                            "be an earlier stage",
                        )
                    )
            errors += _init_problems(name, stage.model, earlier, gated=bool(self.export and self.export.promote))
            earlier.append(name)
        for i, stage_name in enumerate(self.evaluate.after):
            if stage_name not in self.stages:
                errors.append((f"evaluate.after.{i}", _unknown("stage", stage_name, self.stages)))
        if self.evaluate.dataset is None:
            self.evaluate.dataset = next(iter(self.datasets))
        if self.evaluate.conditions is None and self.conditions:
            self.evaluate.conditions = next(iter(self.conditions))
        if self.evaluate.dataset not in self.datasets:
            errors.append(("evaluate.dataset", _unknown("dataset", self.evaluate.dataset, self.datasets)))
        else:
            errors += self._evaluation_problems(self.datasets[self.evaluate.dataset])
        if self.evaluate.after and self.evaluate.conditions not in self.conditions:
            errors.append(
                (
                    "evaluate.conditions",
                    _unknown("conditions", str(self.evaluate.conditions), self.conditions),
                )
            )
        if self.export is not None and self.export.from_stage not in self.stages:
            errors.append(("export.from", _unknown("stage", self.export.from_stage, self.stages)))
        elif self.export is not None and "pipeline" in self.export.formats:
            if self.stages[self.export.from_stage].model.pretrained is None:
                errors.append(("export.formats", "'pipeline' needs a stage loaded from model.pretrained"))
        elif self.export is not None and self.export.promote and self.export.from_stage not in self.evaluate.after:
            errors.append(
                (
                    "export.promote",
                    f"compares evaluation metrics, but stage {self.export.from_stage!r} is not evaluated; "
                    "add it to evaluate.after",
                )
            )
        if errors:
            raise ValueError("\n  ".join(f"{path}: {msg}" for path, msg in errors))
        return self

    def _evaluation_problems(self, dataset: DatasetConfig) -> list[tuple[str, str]]:
        """Fills the digits metrics in for a digits dataset; other datasets need metrics and held-out prompts."""
        if self.evaluate.metrics is None and dataset.source == "builtin-digits":
            self.evaluate.metrics = [MetricConfig.model_validate(m) for m in DIGITS_METRICS]
        if not self.evaluate.after:
            return []
        name = self.evaluate.dataset
        if self.evaluate.metrics is None:
            return [("evaluate.metrics", f"name the metrics for dataset {name!r}, e.g. [brightness, clip_score]")]
        if dataset.source in IMAGE_SOURCES and dataset.split.eval == 0:
            return [("evaluate.dataset", f"dataset {name!r} holds nothing out; set datasets.{name}.split.eval")]
        cache = self.evaluate.conditions
        test = "test_prompts" if "test_prompts" not in self.datasets else f"{name}_test"
        advice = (
            f"put the test prompts in a file of their own (as Flow-GRPO's test.txt), add it as datasets.{test}: "
            f"{{source: prompt-files, path: prompts/test.txt}}, list {test} in conditions.{cache}.datasets and set "
            f"evaluate.dataset: {test}"
        )
        if dataset.source in SAMPLED_SOURCES:
            return [("evaluate.dataset", f"dataset {name!r} is sampled from a stage, not held out; {advice}")]
        errors = []
        if dataset.source == "prompt-files":
            if users := self._prompt_users(name):
                errors.append(
                    (
                        "evaluate.dataset",
                        f"dataset {name!r} holds training prompts ({users[0]} reads them), so none is held out; "
                        + advice,
                    )
                )
            errors += [
                (
                    f"evaluate.metrics.{i}",
                    f"{metric.name!r} compares the samples with held-out real images, which prompt-files dataset "
                    f"{name!r} has none of; drop it, or evaluate on an image dataset with split.eval",
                )
                for i, metric in enumerate(self.evaluate.metrics)
                if metric.name in REFERENCE_METRICS
            ]
        if cache in self.conditions and name not in self.conditions[cache].datasets:
            errors.append(
                ("evaluate.conditions", f"cache {cache!r} does not encode dataset {name!r}; add it to its datasets")
            )
        return errors

    def _prompt_users(self, name: str) -> list[str]:
        """Where prompt dataset ``name`` is trained on: a stage's data, or a dataset sampled on its prompts."""
        users = [
            f"stages.{stage}.data.{key}"
            for stage, config in self.stages.items()
            for key in ("dataset", "prompts")
            if config.data is not None and getattr(config.data, key) == name
        ]
        for other, dataset in self.datasets.items():
            sampled = dataset.trajectories or dataset.sample
            if sampled is not None and sampled.prompts == name:
                users.append(f"datasets.{other}.{'trajectories' if dataset.trajectories else 'sample'}.prompts")
        return users

    def _sampled_dataset_problems(
        self, where: str, sampled: TrajectoriesConfig | SampledPairsConfig
    ) -> list[tuple[str, str]]:
        """A dataset sampled from a finished stage (``where``: its trajectories or sample block): the stage,
        the prompt dataset (not itself sampled) and the condition cache must exist, the cache must encode
        those prompts."""
        errors = []
        if sampled.stage not in self.stages:
            errors.append((f"{where}.stage", _unknown("stage", sampled.stage, self.stages)))
        prompts = self.datasets.get(sampled.prompts)
        if prompts is None or prompts.source in SAMPLED_SOURCES:
            others = [n for n, d in self.datasets.items() if d.source not in SAMPLED_SOURCES]
            errors.append((f"{where}.prompts", _unknown("prompt dataset", sampled.prompts, others)))
        cache = self.conditions.get(sampled.conditions)
        if cache is None:
            errors.append((f"{where}.conditions", _unknown("conditions", sampled.conditions, self.conditions)))
        elif prompts is not None and sampled.prompts not in cache.datasets:
            errors.append(
                (
                    f"{where}.conditions",
                    f"cache {sampled.conditions!r} does not encode dataset {sampled.prompts!r}; "
                    f"add it to conditions.{sampled.conditions}.datasets",
                )
            )
        return errors

    def _data_problems(self, name: str, data: DataRef) -> list[tuple[str, str]]:
        """Unknown datasets or caches, a prompt set that is not prompt files, a dataset its cache lacks."""
        errors = []
        cache = self.conditions.get(data.conditions)
        if cache is None:
            errors.append((f"stages.{name}.data.conditions", _unknown("conditions", data.conditions, self.conditions)))
        elif problem := _encoder_mismatch(self.stages[name].model, cache, data.conditions):
            errors.append((f"stages.{name}.model.family", problem))
        for key, dataset in (("dataset", data.dataset), ("prompts", data.prompts)):
            if dataset is None:
                continue
            where = f"stages.{name}.data.{key}"
            if dataset not in self.datasets:
                errors.append((where, _unknown("dataset", dataset, self.datasets)))
                continue
            if key == "prompts" and self.datasets[dataset].source != "prompt-files":
                errors.append((where, f"dataset {dataset!r} is not a 'prompt-files' source"))
            sampled = self.datasets[dataset].trajectories
            sample = self.datasets[dataset].sample
            if sample is not None and sample.stage in self.stages and not _before(self.stages, sample.stage, name):
                errors.append((where, f"dataset {dataset!r} samples stage {sample.stage!r}, which must come earlier"))
            # sampled datasets reuse the conditions of the prompts they were sampled on
            encoded = sampled.prompts if sampled is not None else sample.prompts if sample is not None else dataset
            if cache is not None and encoded not in cache.datasets:
                errors.append(
                    (
                        f"stages.{name}.data.conditions",
                        f"cache {data.conditions!r} does not encode dataset {encoded!r}; "
                        f"add it to conditions.{data.conditions}.datasets",
                    )
                )
        return errors

    def _latent_reader_problems(self, name: str, stage: StageConfig) -> list[tuple[str, str]]:
        """A stage's ``data.latents``: a declared cache of the stage's dataset, filled by the stage's family
        (and pipeline), read by a trainer that encodes dataset media."""
        if stage.data is None or stage.data.latents is None:
            return []
        key = stage.data.latents
        where = f"stages.{name}.data.latents"
        cache = self.latents.get(key)
        if cache is None:
            return [(where, _unknown("latents", key, self.latents))]
        errors = []
        if cache.dataset != stage.data.dataset:
            errors.append(
                (
                    where,
                    f"cache {key!r} encodes dataset {cache.dataset!r}, not {stage.data.dataset!r}; point "
                    f"latents.{key}.dataset at {stage.data.dataset!r} or read another cache",
                )
            )
        codec, model = cache.model, stage.model
        if codec.family != model.family or (model.pretrained is not None and codec.pretrained != model.pretrained):
            errors.append(
                (
                    where,
                    f"cache {key!r} was encoded by {codec.family!r} ({codec.pretrained or 'no pipeline'}), the "
                    f"stage trains {model.family!r} ({model.pretrained or 'no pipeline'}); set latents.{key}.model to "
                    "the stage's family and pretrained",
                )
            )
        try:
            reads = stage.arguments().reads_latents
        except (FlowpostError, ValueError):  # an unknown trainer or bad arguments: reported where they are checked
            reads = True
        if not reads:
            errors.append((where, f"trainer {stage.trainer!r} encodes no dataset media; remove data.latents"))
        return errors


def _latents_problems(name: str, latents: LatentsConfig, datasets: dict[str, DatasetConfig]) -> list[tuple[str, str]]:
    """The cache ``latents.<name>`` needs a dataset of media whose preprocessing is deterministic."""
    where = f"latents.{name}"
    dataset = datasets.get(latents.dataset)
    if dataset is None:
        return [(f"{where}.dataset", _unknown("dataset", latents.dataset, datasets))]
    if dataset.source in ("prompt-files", TRAJECTORIES):
        return [(f"{where}.dataset", f"dataset {latents.dataset!r} ({dataset.source}) holds no media to encode")]
    if dataset.source in IMAGE_SOURCES and dataset.preprocess.crop == "random":
        return [
            (
                f"datasets.{latents.dataset}.preprocess.crop",
                f"{where} caches this dataset once, so its preprocessing must be "
                "deterministic; set crop: center (or read the dataset without data.latents)",
            )
        ]
    return []


def _before(stages: dict[str, StageConfig], first: str, second: str) -> bool:
    """Whether stage ``first`` is defined before stage ``second``."""
    order = list(stages)
    return order.index(first) < order.index(second)


def _init_problems(name: str, model: ModelConfig, earlier: list[str], *, gated: bool) -> list[tuple[str, str]]:
    """What is wrong with where stage ``name`` starts from, given the stages defined before it."""
    where = f"stages.{name}.model"
    if model.init == "previous":
        problems = []
        if not gated:
            problems.append(
                (
                    f"{where}.init",
                    "'previous' starts from the export the promotion gate promoted; configure export.promote",
                )
            )
        if model.fallback != "scratch" and model.fallback not in earlier:
            problems.append((f"{where}.fallback", _unknown("earlier stage", model.fallback, ["scratch", *earlier])))
        return problems
    if model.init != "scratch" and model.init not in earlier:
        return [(f"{where}.init", _unknown("earlier stage", model.init, [*INIT_KEYWORDS, *earlier]))]
    return []


def _encoder_mismatch(model: ModelConfig, cache: ConditionsConfig, key: str) -> str | None:
    """Why a stage's model cannot read the cache ``conditions.<key>``: another family's text encoders
    filled it, or MiniLM did while the stage loads a pretrained family."""
    if cache.model is not None and cache.model.family != model.family:
        return (
            f"{model.family!r} differs from {cache.model.family!r}, whose text encoders filled "
            f"conditions.{key} (conditions.{key}.model.family); use one family"
        )
    if cache.model is None and model.pretrained is not None:
        return (
            f"{model.family!r} loads from model.pretrained, but {cache.encoder} encoded conditions.{key}; "
            f"set conditions.{key}.model to the stage's family and pretrained"
        )
    return None


def _unknown(kind: str, value: str, allowed: Any) -> str:
    return f"unknown {kind} {value!r}; allowed: {', '.join(sorted(allowed)) or 'none defined'}"
