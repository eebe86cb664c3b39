"""Run the ``flowpost`` command in-process, through ``flowpost.cli.main`` as the installed script does."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass

from flowpost.cli import main


@dataclass(frozen=True)
class Outcome:
    """What a user sees: the exit status and the two streams."""

    code: int
    stdout: str
    stderr: str


def flowpost_main(*args: str) -> Outcome:
    """``flowpost ARGS`` through ``main()``: an exception other than ``SystemExit`` propagates (it would
    be a traceback on the terminal). The environment is put back afterwards (topology flags export
    ``FLOWPOST_*`` variables)."""
    environ, argv = dict(os.environ), sys.argv
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["flowpost", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.argv = argv
        os.environ.clear()
        os.environ.update(environ)
    return Outcome(code, out.getvalue(), err.getvalue())
