"""The one exception type for errors a user can cause and fix."""

from __future__ import annotations


class FlowpostError(Exception):
    """A user-facing error: the message names the config path or file and what to do.

    The CLI prints it without a traceback and exits non-zero.
    """

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class TransientError(FlowpostError):
    """A failure that may pass when retried: a reward server or data source that did not answer.

    Pipeline runs retry the node that raised it (``flowpost run --retries``); a training node
    then resumes from its latest checkpoint.
    """
