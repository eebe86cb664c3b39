"""A write that fails names the file the user asked for (not its temporary sibling), and the reporter
turns file-system errors, and only those, into one message naming that file."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
from unwritable import file_size_limit, read_only

from flowpost.core.io import atomic_directory, file_errors_reported, write_bytes_atomic
from flowpost.errors import FlowpostError


def test_a_write_past_the_disks_room_names_the_file_and_leaves_the_old_one(tmp_path: Path) -> None:
    target = tmp_path / "metrics.json"
    target.write_bytes(b"old")
    with file_size_limit(1024), pytest.raises(OSError) as raised:
        write_bytes_atomic(target, b"x" * 4096)
    assert raised.value.errno == errno.EFBIG and raised.value.filename == str(target)
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_a_file_in_a_read_only_folder_is_named_not_its_temporary_sibling(tmp_path: Path) -> None:
    with read_only(tmp_path), pytest.raises(OSError) as raised:
        write_bytes_atomic(tmp_path / "report.md", b"text")
    assert raised.value.filename == str(tmp_path / "report.md")


def test_a_file_inside_a_folder_being_written_is_named_under_the_final_folder(tmp_path: Path) -> None:
    final = tmp_path / "step-2"
    with file_size_limit(1024), pytest.raises(OSError) as raised, atomic_directory(final) as tmp:
        with open(tmp / "model.safetensors", "wb") as handle:
            handle.write(b"x" * 4096)
    assert raised.value.errno == errno.EFBIG and raised.value.filename == str(final)
    assert list(tmp_path.iterdir()) == []
    with read_only(tmp_path), pytest.raises(OSError) as raised, atomic_directory(final):
        pass
    assert raised.value.filename == str(final)


def test_the_reporter_names_the_file_and_what_to_do(tmp_path: Path) -> None:
    with file_size_limit(1024), pytest.raises(FlowpostError) as raised:
        with file_errors_reported("writing the report", where=tmp_path):
            write_bytes_atomic(tmp_path / "report.md", b"x" * 4096)
    assert str(raised.value) == (
        f"{tmp_path / 'report.md'}: writing the report failed (File too large); check the path, free space "
        "on the disk or make the folder writable, then run it again"
    )


def test_the_reporter_names_the_destination_of_a_failed_copy(tmp_path: Path) -> None:
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "weights.safetensors").write_bytes(b"x" * 4096)
    with file_size_limit(1024), pytest.raises(FlowpostError, match=r"copying failed \(File too large\)") as raised:
        with file_errors_reported("copying", where=tmp_path):
            shutil.copytree(tmp_path / "source", tmp_path / "copy")
    assert raised.value.where == str(tmp_path / "copy" / "weights.safetensors")


@pytest.mark.parametrize("error", [ConnectionRefusedError(errno.ECONNREFUSED, "refused"), TimeoutError("timed out")])
def test_network_errors_pass_the_reporter_unchanged(tmp_path: Path, error: OSError) -> None:
    with pytest.raises(type(error)) as raised, file_errors_reported("scoring", where=tmp_path):
        raise error
    assert raised.value is error
