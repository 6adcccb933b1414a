"""The training entry point: `run_training(config, stop_event=None, listener=None) -> run directory`.

One function for the CLI, the notebook and the dashboard (which calls it in a thread):

    run_dir = run_training(TrainConfig.from_json("configs/tiny_cpu.json"))

It writes `runs/<run_id>/` (format in `training/run/directory.py`): config.json, status.json (queued → running →
completed | stopped | failed, with the error message, and a `phase`: loading model, zero-shot eval, sft, base
eval, grpo, saving, comparison, done), then plays the run's phases in order (`training.phases`): load the model
(`training.models`), warm-start it with SFT when enabled (`training.warm_start`), play the model before GRPO when it is
compared, train with GRPO (`training.grpo.build_trainer`; live files by `training.callbacks.RunCallback`) and save
`final/` (temp dir, then renamed), and play the comparison: the random policy, the trained model (and the model as
GRPO found it, when cheap) on the same eval questions with the same seeds → comparison.jsonl. Any exception marks
the run failed with its message and is re-raised.

Stopping (`stop_event.set()`): training ends after the current step, final/ is saved and the run is marked
`stopped` at once; a short comparison (at most 5 episodes) still follows, so a stopped run can be compared,
and status.json says `phase: done` when it is over.

The CLI (`python -m training.train --config configs/tiny_cpu.json --set max_steps=20`, `--resume runs/<id>`) lives in
`training/cli.py`; `resume_training` continues a stopped, failed or interrupted run from its last checkpoint.

Checkpoints (`save_steps`, `save_total_limit`) go to `checkpoints/<phase>/` and are removed when the run completes;
while a run lives its status.json carries `pid`, `host` and a `heartbeat_at` refreshed every few seconds, so a run
whose process died reads `interrupted` (`training.run.directory.live_status`). Under `accelerate launch` every rank
trains and only the main process writes the run files.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m training.train` runs the CLI (training/cli.py), before this module's imports:
    import runpy  # a bad argument is refused in a fraction of a second, not after torch and transformers load

    runpy.run_module("training.cli", run_name="__main__", alter_sys=True)  # exits

import gc
import shutil
import os
import threading
import time
from pathlib import Path
from typing import Any

from training.config import TrainConfig
from training.distributed import is_main_process, world_size
from training.phases import RunState, RunStopped, planned_phases, run_phases, save_final
from training.run import schema
from training.run.directory import HEARTBEAT_SECONDS, RESUMABLE_STATUSES, RunDir, now_iso, this_host
from training.run.recorder import Listener, RunRecorder

__all__ = ["run_training", "resume_training", "check_resumable", "RunStopped"]


def run_training(config: TrainConfig | dict, stop_event: threading.Event | None = None,
                 listener: Listener | None = None, *, resume: bool = False) -> Path:
    """Run one training run end to end and return its run directory.

    Args:
        config: a `TrainConfig` (or a dict of its fields). Auto fields are resolved and saved as config.json.
        stop_event: set it (from another thread) to stop: training ends within one step, a checkpoint and the
            weights (final/) are saved, and the run is marked `stopped`.
        listener: `listener(event, payload)` called in-process on every record written (status, metrics,
            evals, transcripts, comparison).
        resume: continue the run in `config.output_dir` (a stopped, failed or interrupted one) from its last
            checkpoint instead of refusing an existing directory; see `resume_training`.

    Returns:
        The run directory (`Path`), also when the run was stopped.

    Raises:
        Whatever ended the run (after marking it failed with the message).
    """
    if isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    config = _shared_across_ranks(config.resolved())
    from training.plan import RunPlan

    plan = RunPlan.resolve(config)
    config = plan.config
    run = RunDir(plan.run_dir)
    is_main = is_main_process()
    recorder = RunRecorder(run, listener, is_main=is_main)
    if is_main:
        if resume:
            check_resumable(run)
        elif (run.path / "status.json").exists():
            raise FileExistsError(f"{run.path} already holds a run: choose another run_id or output_dir")
        run.path.mkdir(parents=True, exist_ok=True)
    if not resume:
        recorder.config(config.to_dict())
        recorder.status("queued", created_at=now_iso(), step=0, total_steps=config.max_steps, error=None,
                        model=config.model, dataset=config.dataset, phase="queued", **_writer())
    else:
        previous = run.read_status(default={})
        recorder.status("queued", error=None, phase="resuming", resumes=int(previous.get("resumes") or 0) + 1,
                        resumed_at=now_iso(), finished_at=None, stopped_at=None, **_writer())
    heartbeat = _Heartbeat(recorder, gpu=plan.device == "cuda") if is_main else None
    started = time.time()
    state = RunState(plan, run, recorder, stop_event=stop_event, resume=resume, is_main=is_main)
    threads_before = _set_cpu_threads(plan)
    try:
        written = run.read_status(default={})
        # The plan as the run began: a resumed run skips what it has done, but its list of phases stays whole.
        phases = written.get("phases") if resume and written.get("phases") else planned_phases(state)
        recorder.status("running", started_at=written.get("started_at") or now_iso(),
                        phase=schema.LOADING_MODEL, phases=phases, device=plan.device, precision=plan.precision,
                        cpu_threads=plan.cpu_threads)
        for phase in run_phases():
            if not phase.wanted(state):
                continue
            if phase.stoppable:
                state.check_stop()
            phase.run(state)
        if not state.stopped and is_main:
            shutil.rmtree(plan.checkpoints_dir, ignore_errors=True)  # the run is complete: final/ holds what it made
        recorder.status("stopped" if state.stopped else "completed", finished_at=now_iso(), phase="done",
                        final_dir=str(run.final_dir), seconds=round(time.time() - started, 2))
        return run.path
    except RunStopped:  # before GRPO: keep what the model has become
        if state.model is not None:
            recorder.status(phase=schema.SAVING)
            save_final(run, None, state.tokenizer, is_main, model=state.model)
        recorder.status("stopped", stopped_at=now_iso(), finished_at=now_iso(), phase="done",
                        final_dir=str(run.final_dir) if run.final_dir.exists() else None,
                        seconds=round(time.time() - started, 2))
        return run.path
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        try:
            recorder.status("failed", error=message, finished_at=now_iso(), phase="failed",
                            seconds=round(time.time() - started, 2))
        except Exception:  # noqa: BLE001 - the original error matters more
            pass
        raise
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        state.model = state.tokenizer = None
        _free_memory()
        if threads_before is not None:
            import torch

            torch.set_num_threads(threads_before)


def resume_training(run_dir: str | Path, stop_event: threading.Event | None = None,
                    listener: Listener | None = None) -> Path:
    """Continue a stopped, failed or interrupted run from its last checkpoint, in the same run directory.

    The run's own config.json is used. The phase it was in resumes from its newest checkpoint (`checkpoints/sft/` or
    `checkpoints/grpo/`: weights or adapter, optimizer, scheduler, RNG state and step), or starts over when it has
    none; a finished warm start (`warm_start/`) is not repeated. Lines of metrics/evals/transcripts written after
    that checkpoint are dropped first, so the files continue without duplicated steps.

    Raises:
        FileNotFoundError: `run_dir` holds no run. ValueError: the run completed, or is still running.
    """
    run = RunDir(Path(run_dir))
    if not run.file("config.json").exists():
        raise FileNotFoundError(f"{run.path} holds no run (no config.json)")
    config = TrainConfig.from_dict(run.read_config())
    config = config.with_overrides({"output_dir": str(run.path), "run_id": run.run_id})
    return run_training(config, stop_event, listener, resume=True)


class _Heartbeat:
    """Stamps `heartbeat_at` into status.json every `HEARTBEAT_SECONDS` while the run's process lives, so readers
    can tell a live run from one whose process died (`training.run.directory.live_status`); on a GPU also the memory
    and utilisation (`status["gpu"]`, `training.gpu.gpu_readout`) that the dashboard's Train tab shows."""

    def __init__(self, recorder: RunRecorder, gpu: bool = False):
        self._recorder = recorder
        self._gpu = gpu
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="run-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                if self._gpu:
                    from training.gpu import gpu_readout

                    self._recorder.heartbeat(gpu=gpu_readout())
                else:
                    self._recorder.heartbeat()
            except Exception:  # noqa: BLE001 - a missed beat is not worth killing the run
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _writer() -> dict[str, Any]:
    """Who writes the run: read by `live_status` to tell a dead run."""
    return {"pid": os.getpid(), "host": this_host(), "heartbeat_at": time.time()}


def check_resumable(run: RunDir) -> None:
    """Raise ValueError unless `run` can be resumed: it holds a stopped, failed or interrupted run."""
    status = run.read_live_status()
    state = status.get("status")
    if state == "completed":
        raise ValueError(f"{run.path} completed: nothing to resume (start a new run)")
    if state in ("queued", "running"):
        raise ValueError(f"{run.path} is still {state} (pid {status.get('pid')} on {status.get('host')}): "
                         "stop it first")
    if state not in RESUMABLE_STATUSES:
        raise ValueError(f"{run.path} cannot be resumed (status {state!r})")
















def _set_cpu_threads(plan: Any) -> int | None:
    """Apply `cpu_threads` on CPU runs; returns the previous thread count to restore (None: unchanged)."""
    threads = plan.cpu_threads
    if threads is None or plan.device != "cpu":
        return None
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    return before






def _shared_across_ranks(config: TrainConfig) -> TrainConfig:
    """Under `accelerate launch`, every rank must use the main process's run id and directory."""
    if world_size() <= 1:
        return config
    import dataclasses

    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    PartialState()  # initialises the process group
    shared = broadcast_object_list([config.run_id, config.output_dir], from_process=0)
    return dataclasses.replace(config, run_id=shared[0], output_dir=shared[1])


def _free_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass
