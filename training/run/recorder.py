"""The one writer of a run directory during a run (`training.run.directory.RunDir`): `RunRecorder` writes each record
and hands it to an in-process `listener(event, payload)` (the dashboard), with event in "status", "metrics", "evals",
"transcripts", "comparison". Only the main process writes (under `accelerate launch` the other ranks get a recorder
that does nothing). `error_message`: what a run's records keep of an exception.

No torch import here: the phases, the trainer hooks (`training.callbacks`), the evals and the dashboard all use it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from training.run.directory import RunDir

__all__ = ["RunRecorder", "Listener", "error_message", "ERROR_CHARS"]

logger = logging.getLogger(__name__)

Listener = Callable[[str, dict], None]

#: Most characters of an error kept in a run's records (an exception's text can hold a whole tensor).
ERROR_CHARS = 500


class RunRecorder:
    """Writes one run directory and notifies the listener of every record.

    Args:
        run: the run directory.
        listener: `listener(event, payload)`, called after each write; its exceptions are logged, not raised
            (a broken UI must not kill a training run).
        is_main: whether this process writes (False on non-main ranks: every method is then a no-op).
    """

    def __init__(self, run: RunDir, listener: Listener | None = None, is_main: bool = True):
        self.run = run
        self.listener = listener
        self.is_main = is_main
        self._lock = threading.Lock()

    def _notify(self, event: str, payload: dict) -> None:
        if self.listener is None:
            return
        try:
            self.listener(event, payload)
        except Exception:  # noqa: BLE001
            logger.exception("run listener failed on %s", event)

    def status(self, status: str | None = None, **fields: Any) -> dict:
        if not self.is_main:
            return {}
        with self._lock:
            record = self.run.write_status(status, **fields)
        self._notify("status", record)
        return record

    def heartbeat(self, **fields: Any) -> None:
        """Stamp `heartbeat_at` (epoch seconds), and `fields` (e.g. the GPU readout), into status.json without
        notifying the listener: a beat is not news."""
        if not self.is_main:
            return
        with self._lock:
            self.run.write_status(heartbeat_at=time.time(), **fields)

    def config(self, config: dict) -> None:
        if self.is_main:
            self.run.write_config(config)

    def append(self, kind: str, record: dict) -> None:
        if not self.is_main:
            return
        with self._lock:
            self.run.append(kind, record)
        self._notify(kind, record)


def error_message(exc: BaseException) -> str:
    """`Type: message` of an exception, at most `ERROR_CHARS` characters: what a run's records keep of an error."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"
