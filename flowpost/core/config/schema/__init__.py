"""Typed schema of a pipeline file, one module per part of it. Every section rejects unknown keys."""

from flowpost.core.config.schema.captioned import (
    CaptionedDataset,
    EditPairsDataset,
    FileDataset,
    HfDataset,
    ImageFolderDataset,
    PreferencePairsDataset,
    TableDataset,
    VideoFolderDataset,
    WebShardsDataset,
)
from flowpost.core.config.schema.dataset_base import SOURCES, DatasetBase, StoredDataset
from flowpost.core.config.schema.datasets import (
    DatasetConfig,
    PromptFilesDataset,
    SampledDataset,
    SampledPairsDataset,
    TrajectoriesDataset,
    dataset_config,
)
from flowpost.core.config.schema.evaluation import EvaluateConfig, GuardConfig, MetricConfig, StatisticBand
from flowpost.core.config.schema.export import ExportConfig, PromoteConfig
from flowpost.core.config.schema.fingerprints import UNFINGERPRINTED, fingerprinted, fingerprinted_keys
from flowpost.core.config.schema.media import FrameSampling, HubDataset, PreprocessConfig, SplitConfig
from flowpost.core.config.schema.models import (
    CodecModelConfig,
    CompileConfig,
    ConditionsConfig,
    EncoderModelConfig,
    LatentsConfig,
    LoraConfig,
    ModelConfig,
)
from flowpost.core.config.schema.pipeline import PipelineConfig
from flowpost.core.config.schema.rewards import RewardConfig
from flowpost.core.config.schema.sampled import SAMPLED_PAIRS, TRAJECTORIES, SampledPairsConfig, TrajectoriesConfig
from flowpost.core.config.schema.stages import (
    CallbacksConfig,
    DataRef,
    EMAConfig,
    GradClipConfig,
    LaunchConfig,
    StageConfig,
    ValidationConfig,
)

__all__ = [
    "SAMPLED_PAIRS",
    "SOURCES",
    "TRAJECTORIES",
    "UNFINGERPRINTED",
    "CallbacksConfig",
    "CaptionedDataset",
    "CodecModelConfig",
    "CompileConfig",
    "ConditionsConfig",
    "DataRef",
    "DatasetBase",
    "DatasetConfig",
    "EMAConfig",
    "EditPairsDataset",
    "EncoderModelConfig",
    "EvaluateConfig",
    "ExportConfig",
    "FileDataset",
    "FrameSampling",
    "GradClipConfig",
    "GuardConfig",
    "HfDataset",
    "HubDataset",
    "ImageFolderDataset",
    "LatentsConfig",
    "LaunchConfig",
    "LoraConfig",
    "MetricConfig",
    "ModelConfig",
    "PipelineConfig",
    "PreferencePairsDataset",
    "PreprocessConfig",
    "PromoteConfig",
    "PromptFilesDataset",
    "RewardConfig",
    "SampledDataset",
    "SampledPairsConfig",
    "SampledPairsDataset",
    "SplitConfig",
    "StageConfig",
    "StatisticBand",
    "StoredDataset",
    "TableDataset",
    "TrajectoriesConfig",
    "TrajectoriesDataset",
    "ValidationConfig",
    "VideoFolderDataset",
    "WebShardsDataset",
    "dataset_config",
    "fingerprinted",
    "fingerprinted_keys",
]
