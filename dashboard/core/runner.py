"""The training runner: owns the dashboard's one training run at a time (UI code never touches it).

The app builds one runner (`dashboard.core.context.AppContext.create`, once per app) and passes it to every tab, so
every browser tab (and every reload) sees the same active run: the page holds no training state, it asks the
runner and reads the run directory.
Training goes through the same entry point as the CLI, `training.train.run_training(config, stop_event,
listener)`, so a run started here writes the same run directory as `python -m training.train`.

It runs in a child process (spawned), watched by a thread of the app: in the app's own process every
visitor's request would take the interpreter lock from the training loop, step for step (measured with
bench/serving/visitors.py: 20 visitors slowed a tiny run by a third or more through the lock alone, while the app used
little CPU). The child sends each record's event back through a queue (pages waiting for news wake up), and
the stop flag is shared with it; its memory (and GPU memory) is all given back when it exits.

The child dies with the app: it watches its parent (`multiprocessing.parent_process()`, whose sentinel pipe
reads EOF when the parent is gone, `kill -9` included) and then stops its run as Stop would (the run ends
`stopped`, weights saved, resumable), or exits within `PARENT_GONE_GRACE_S` whatever it is doing (the run then
reads `interrupted`). With nobody reading its events it drops them rather than wait on the full pipe at exit.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import queue
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from training.config import TrainConfig
from training.plan import check_config
from training.run.directory import (FINISHED_STATUSES, RESUMABLE_STATUSES, RunDir, default_runs_root, new_run_id,
                                    now_iso, resolve_run)


class RunnerBusy(RuntimeError):
    """A run is already training; the message names it."""


class ConfigInvalid(ValueError):
    """The form's values do not make a valid TrainConfig; `field` names the offending field when known."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def _config_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def build_config(values: dict[str, Any]) -> Any:
    """A TrainConfig from form values, checked as its run plan will check it, or ConfigInvalid naming the field.

    TrainConfig checks the values at construction and `training.plan.check_config` what they name (the dataset on
    disk, TRL's own checks, trackers), so their message is what the user sees; we only work out which field it is
    about (the first form field named in the message) so the UI can point at it."""
    known = set(_config_fields())
    unknown = [k for k in values if k not in known]
    if unknown:
        raise ConfigInvalid(f"unknown config field(s): {', '.join(unknown)}", unknown[0])
    try:
        config = TrainConfig(**values)
        check_config(config)
        return config
    except (TypeError, ValueError) as exc:
        message = str(exc) or type(exc).__name__
        field = next((k for k in sorted(values, key=len, reverse=True) if k in message), None)
        raise ConfigInvalid(message, field) from exc


class TrainingRunner:
    """One training thread at a time, a stop Event, and the id of the active run.

    Args:
        runs_root: where run directories go (default `$SQLENV_RUNS_DIR` or `runs/`).
        train_fn: None (default) runs `training.train.run_training` in a child process; a caller may pass
            another function with the same signature (`(config, stop_event=None, listener=None) -> Path`),
            which runs in a thread of this process.
    """

    def __init__(self, runs_root: Path | None = None, train_fn: Callable[..., Any] | None = None):
        self.runs_root = Path(runs_root) if runs_root is not None else default_runs_root()
        self._train_fn = train_fn
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop: Any = threading.Event()  # a multiprocessing Event while a child process trains
        self.active_run_id: str | None = None
        self.last_run_id: str | None = None
        self.last_error: str | None = None
        self.started_at: float | None = None
        # Wall-clock time each metrics step reached the runner (listener), for the latency benchmark.
        self.metric_times: dict[int, float] = {}
        self._listeners: list[Callable[[str, dict], None]] = []
        # Notified whenever the training writes a record or ends: pages waiting for news wake up at once.
        self._news = threading.Condition()
        self._news_count = 0

    # --- state --------------------------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def current_run_id(self) -> str | None:
        """The run the Train tab shows: the active one, else the last one started here."""
        return self.active_run_id or self.last_run_id

    def add_listener(self, listener: Callable[[str, dict], None]) -> None:
        self._listeners.append(listener)

    @property
    def news_count(self) -> int:
        """How many records the runs started here have written (plus starts and ends); grows on any news."""
        return self._news_count

    def wait_for_news(self, since: int, timeout: float) -> int:
        """Block until `news_count` moves past `since` or `timeout` seconds pass; returns the count."""
        with self._news:
            self._news.wait_for(lambda: self._news_count != since, timeout=timeout)
            return self._news_count

    def _announce(self) -> None:
        with self._news:
            self._news_count += 1
            self._news.notify_all()

    # --- control ------------------------------------------------------------------------------------
    def start(self, config: Any) -> str:
        """Start training `config` in a background thread; returns the run id.

        Raises RunnerBusy (naming the active run) when a run is still training."""
        self._wait_for_an_ended_run()
        with self._lock:
            self._refuse_if_busy("starting")
            run_id = new_run_id()
            while (self.runs_root / run_id).exists():
                run_id = new_run_id()
            # The runner names the run, so the page knows which directory to show before training writes it.
            # The training entry point creates the directory (it refuses one that already holds a run).
            run = RunDir(self.runs_root / run_id)
            if dataclasses.is_dataclass(config):
                config = dataclasses.replace(config, run_id=run_id, output_dir=str(run.path))
            self._launch(config, run, f"train-{run_id}")
            return run_id

    def resume(self, run_id: str) -> str:
        """Continue a stopped, failed or interrupted run (by id, under `runs_root`) from its last checkpoint, in a
        training process like `start` (`training.train.resume_training`). Raises RunnerBusy when a run is training, ValueError
        when the run cannot be resumed (completed, still running, unknown)."""
        self._wait_for_an_ended_run()
        with self._lock:
            self._refuse_if_busy("resuming")
            run = resolve_run(run_id, self.runs_root)  # refuses names that leave the runs folder
            state = run.read_live_status().get("status")
            if state not in RESUMABLE_STATUSES:
                raise ValueError(f"Run {run.run_id} is {state}: only stopped, failed or interrupted runs resume.")
            self._launch(None, run, f"resume-{run.run_id}")
            return run.run_id

    def _wait_for_an_ended_run(self) -> None:
        """A run whose status.json already says how it ended is only its process exiting (about a second; at most
        `_run_child`'s 30 s join and 10 s kill): wait for it instead of refusing a Start pressed just after the page
        showed the run finished. A run still training is not waited for (`_refuse_if_busy` refuses it)."""
        thread, run_id = self._thread, self.active_run_id
        if thread is None or run_id is None or not thread.is_alive():
            return
        if RunDir(self.runs_root / run_id).read_status(default={}).get("status") in FINISHED_STATUSES:
            thread.join(ENDED_RUN_EXIT_S)

    def _refuse_if_busy(self, doing: str) -> None:
        if self.is_running:
            raise RunnerBusy(f"Run {self.active_run_id} is still training: stop it (or wait for it to finish) "
                             f"before {doing} another.")

    def _launch(self, config: Any, run: RunDir, thread_name: str) -> None:
        """(Lock held.) Make `run` the active run and train it (config None: resume it) in a new thread."""
        self._stop = threading.Event() if self._train_fn is not None else _SPAWN.Event()
        self.active_run_id = self.last_run_id = run.run_id
        self.last_error = None
        self.started_at = time.time()
        self.metric_times = {}
        self._thread = threading.Thread(target=self._run, args=(config, run), name=thread_name, daemon=True)
        self._thread.start()
        self._announce()

    def stop(self) -> str:
        """Ask the active run to stop; the training callback ends it within one step and saves weights."""
        with self._lock:
            if not self.is_running:
                return "No run is training."
            self._stop.set()
            return f"Stopping {self.active_run_id}: it ends after the current step and saves its weights."

    def join(self, timeout: float | None = None) -> bool:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.is_running

    # --- the thread ---------------------------------------------------------------------------------
    def _listener(self, event: str, payload: dict) -> None:
        if event == "metrics" and isinstance(payload, dict):
            step = payload.get("step")
            if isinstance(step, (int, float)):
                self.metric_times.setdefault(int(step), time.time())
        for listener in list(self._listeners):
            try:
                listener(event, payload)
            except Exception:  # a broken UI listener must never kill training
                traceback.print_exc()
        self._announce()

    def _run(self, config: Any, run: RunDir) -> None:
        """Train `config` into `run`, or (config None) resume the run in `run`."""
        try:
            if self._train_fn is None:
                self._run_child(config, run)
            elif config is None:  # (an injected entry point trains in this process; a resume too)
                from training.train import resume_training  # here, not at the top: it loads torch

                resume_training(run.path, stop_event=self._stop, listener=self._listener)
            else:
                self._train_fn(config, stop_event=self._stop, listener=self._listener)
            status = run.read_status(default={})
            if status.get("status") in ("queued", "running"):
                # The entry point returned without saying how it ended: trust the stop flag.
                run.write_status("stopped" if self._stop.is_set() else "completed", finished_at=now_iso())
        except BaseException as exc:  # noqa: BLE001 - a crash marks the run failed; the app keeps serving
            message = str(exc) if isinstance(exc, TrainingFailed) else f"{type(exc).__name__}: {exc}"
            self.last_error = message
            # The entry point marks the runs it started failed itself; a run that never got that far (no
            # status.json yet: e.g. the training package failed to import) is marked here.
            if not run.file("status.json").exists():
                run.path.mkdir(parents=True, exist_ok=True)
                run.write_status("failed", error=message, created_at=now_iso(), finished_at=now_iso(),
                                 source="dashboard")
            print(f"[dashboard] run {run.run_id} failed: {message}", file=sys.stderr)
            if not isinstance(exc, TrainingFailed):  # the training process printed its own traceback
                traceback.print_exc()
        finally:
            with self._lock:
                self.active_run_id = None
            self._announce()

    def _run_child(self, config: Any, run: RunDir) -> None:
        """Train (config None: resume `run`) in a spawned child process; relay its events to the listeners until
        it ends. Raises TrainingFailed with the child's error (or its exit code when it died without saying)."""
        events = _SPAWN.Queue()
        child = _SPAWN.Process(target=_train_in_child, args=(config, run.path, self._stop, events),
                               name=f"train-{run.run_id}", daemon=True)
        child.start()
        error, ended = None, False
        while not ended:
            try:
                event, payload = events.get(timeout=0.5)
            except queue.Empty:
                if child.is_alive():
                    continue
                try:  # it has exited: whatever it sent last is already in the pipe
                    event, payload = events.get(timeout=1.0)
                except queue.Empty:
                    break
            if event == _END:
                error, ended = payload, True
            else:
                self._listener(event, payload)
        child.join(30)
        if child.is_alive():  # said it ended but hangs on exit (a stuck thread): it has nothing left to write
            child.kill()
            child.join(10)
        events.close()
        if not ended:
            error = f"the training process exited with code {child.exitcode} before finishing"
            if run.read_status(default={}).get("status") in ("queued", "running"):
                run.write_status("failed", error=error, finished_at=now_iso())
        if error:
            raise TrainingFailed(error)


class TrainingFailed(RuntimeError):
    """The training process ended with an error; the message is its own."""


# Spawned, not forked: the app's process has web-server threads (a fork copies their locks mid-use) and CUDA
# cannot be used in a forked child.
_SPAWN = multiprocessing.get_context("spawn")
_END = "__end__"
# Seconds Start waits for a run that has written its final status to finish exiting (`_run_child` joins its process
# for 30 s, then kills it and waits 10 s more).
ENDED_RUN_EXIT_S = 45.0
# Seconds a training child whose app died has to stop cleanly (finish its step, save weights) before it exits.
PARENT_GONE_GRACE_S = 120.0


def _watch_parent(stop_event: Any, events: Any, parent_gone: threading.Event, trained: threading.Event,
                  grace_s: float) -> None:
    """(A daemon thread of the child.) Wait for the parent's end; then stop the run and end the process as soon
    as the run has ended, or `grace_s` seconds later whatever it is doing."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    parent.join()  # returns when the parent's sentinel pipe reads EOF: the parent exited or was killed
    parent_gone.set()
    print("[training] the dashboard is gone: stopping this run", file=sys.stderr, flush=True)
    events.cancel_join_thread()  # nobody reads the pipe any more: never wait on it at exit
    stop_event.set()
    # The child holds the pipe's read end too, so a writer blocked on a full pipe would wait for ever: once the
    # run has written its end, leave without flushing; if it has not ended in time, its status reads
    # "interrupted" (its pid is gone) and it resumes from its last checkpoint.
    os._exit(0 if trained.wait(grace_s) else 3)


def _train_in_child(config: Any, run_path: Path, stop_event: Any, events: Any,
                    grace_s: float = PARENT_GONE_GRACE_S) -> None:
    """The child process: run the training entry point (config None: resume the run in `run_path`), sending each
    record's event to the parent, then (_END, None) or (_END, the error message). If the parent dies, the run is
    stopped (see `_watch_parent`)."""
    parent_gone, trained = threading.Event(), threading.Event()
    threading.Thread(target=_watch_parent, args=(stop_event, events, parent_gone, trained, grace_s),
                     name="watch-parent", daemon=True).start()

    def listener(event: str, payload: dict) -> None:
        if parent_gone.is_set():
            return  # nobody reads them: do not pile events up in memory
        try:
            payload = json.loads(json.dumps(payload, default=str))  # plain data crosses the process line
        except (TypeError, ValueError):
            payload = {}
        events.put((event, payload))

    try:
        # Imported in the child only: the app's own process never loads torch.
        from training.train import resume_training, run_training

        if config is None:
            resume_training(run_path, stop_event=stop_event, listener=listener)
        else:
            run_training(config, stop_event=stop_event, listener=listener)
        events.put((_END, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which marks the run
        traceback.print_exc()
        events.put((_END, f"{type(exc).__name__}: {exc}"))
    finally:
        trained.set()
        events.close()
        if not parent_gone.is_set():
            events.join_thread()  # everything sent reaches the parent before the process exits
