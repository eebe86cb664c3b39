"""One table says what of a section no result depends on; fingerprints and DVC params both leave it out."""

from __future__ import annotations

from typing import Any

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.config.schema import UNFINGERPRINTED, PipelineConfig, fingerprinted, fingerprinted_keys
from flowpost.tasks.graph import build_nodes, fingerprints

GATE = {"metrics": {"adherence": "higher"}}


def _gated(tiny_pipeline) -> dict[str, Any]:
    config = tiny_pipeline()
    config["export"]["promote"] = dict(GATE)
    return config


def _prints(config: dict[str, Any]) -> dict[str, str]:
    return fingerprints(build_nodes(validate_pipeline(config)), code="code")


def _sections(pipeline: PipelineConfig) -> dict[str, Any]:
    assert pipeline.export is not None
    return {"stages.sft": pipeline.stages["sft"], "evaluate": pipeline.evaluate, "export": pipeline.export}


def test_every_section_of_the_table_leaves_its_keys_out_of_fingerprints_and_params(tiny_pipeline) -> None:
    sections = _sections(validate_pipeline(_gated(tiny_pipeline)))
    assert {type(section) for section in sections.values()} == set(UNFINGERPRINTED)
    for path, section in sections.items():
        config, keys = fingerprinted(section), fingerprinted_keys(path, section)
        for dotted in UNFINGERPRINTED[type(section)]:
            parent, _, key = dotted.rpartition(".")
            assert key not in (config[parent] if parent else config), dotted
            left_out = f"{path}.{dotted}"
            assert not any(left_out == read or left_out.startswith(f"{read}.") for read in keys), (left_out, keys)


def test_a_section_nothing_of_which_is_left_out_is_read_whole(tiny_pipeline) -> None:
    export = validate_pipeline(tiny_pipeline()).export
    assert export is not None and fingerprinted_keys("export", export) == ["export"]


def test_the_hang_timeout_changes_no_fingerprint(tiny_pipeline) -> None:
    config = _gated(tiny_pipeline)
    before = _prints(config)
    config["stages"]["sft"]["launch"] = {"hang_timeout": 10.0}
    assert _prints(config) == before


def test_the_gate_changes_only_the_promote_node_and_the_report(tiny_pipeline) -> None:
    config = _gated(tiny_pipeline)
    before = _prints(config)
    config["export"]["promote"]["tolerance"] = 0.5
    after = _prints(config)
    assert {node for node in before if before[node] != after[node]} == {"promote", "report"}
