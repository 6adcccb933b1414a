"""The training entry point: `run_training(config, stop_event=None, listener=None) -> run directory`.

One function for the CLI, the notebook and the dashboard (which calls it in a thread):

    run_dir = run_training(TrainConfig.from_json("configs/tiny_cpu.json"))

It writes `runs/<run_id>/` (format in `training/run_dir.py`): config.json, status.json (queued → running →
completed | stopped | failed, with the error message, and a `phase`: loading model, zero-shot eval, sft, base
eval, grpo, saving, comparison, done), then loads the model (`training.models`), warm-starts
it with SFT when enabled (`training.sft`), trains with GRPO (`training.grpo.build_trainer`; live files by
`training.callbacks.RunCallback`), saves `final/` (temp dir, then renamed), and plays the comparison: the
random policy, the trained model (and the model as GRPO found it, when cheap) on the same eval questions with
the same seeds → comparison.jsonl. Any exception marks the run failed with its message and is re-raised.

Stopping (`stop_event.set()`): training ends after the current step, final/ is saved and the run is marked
`stopped` at once; a short comparison (at most 5 episodes) still follows, so a stopped run can be compared,
and status.json says `phase: done` when it is over.

CLI (`python -m training.train --config configs/tiny_cpu.json --set max_steps=20 --set grpo.loss_type=dr_grpo`)
prints progress lines; bad arguments print one line and exit with code 2. `python -m training.train --resume
runs/<id>` continues a stopped, failed or interrupted run from its last checkpoint (`resume_training`).

Checkpoints (`save_steps`, `save_total_limit`) go to `checkpoints/<phase>/` and are removed when the run completes;
while a run lives its status.json carries `pid`, `host` and a `heartbeat_at` refreshed every few seconds, so a run
whose process died reads `interrupted` (`training.run_dir.live_status`). Under `accelerate launch` every rank trains
and only the main process writes the run files.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from training.callbacks import PHASES, Listener, RunCallback, RunRecorder
from training.config import ConfigError, TrainConfig
from training.run_dir import (
    HEARTBEAT_SECONDS,
    RESUMABLE_STATUSES,
    RunDir,
    atomic_write_json,
    last_checkpoint,
    now_iso,
    this_host,
)

__all__ = ["run_training", "resume_training", "progress_listener", "main", "RunStopped"]


class RunStopped(Exception):
    """Raised internally when the stop flag is seen between phases (before GRPO starts)."""


def _is_main_process() -> bool:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) == 0


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


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
    run = RunDir(plan.run_dir)
    is_main = _is_main_process()
    recorder = RunRecorder(run, listener, is_main=is_main)
    if is_main:
        if resume:
            _check_resumable(run)
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
    model = trainer = tokenizer = None
    threads_before = _set_cpu_threads(plan)
    try:
        recorder.status("running", started_at=run.read_status(default={}).get("started_at") or now_iso(),
                        phase="loading model", device=plan.device, precision=plan.precision,
                        cpu_threads=plan.cpu_threads)
        _check_stop(stop_event)
        _seed_everything(config.seed)
        from training.models import load_model_and_tokenizer

        warm_started = config.sft and (plan.warm_start_dir / "config.json").exists()
        model, tokenizer = load_model_and_tokenizer(
            str(plan.warm_start_dir) if warm_started else config.model, seed=config.seed, dataset=plan.dataset,
            **_device_kwargs(plan))
        if warm_started:
            _point_at_warm_start(model, plan)
        recorder.status(n_parameters=sum(p.numel() for p in model.parameters()))

        zero_shot = None
        if _wants_zero_shot(config) and is_main:
            zero_shot = _read_zero_shot(run) if resume else None  # played before the run was interrupted
            if zero_shot is None and not warm_started:
                _check_stop(stop_event)
                recorder.status(phase="zero-shot eval")
                zero_shot = _play_model(model, tokenizer, plan, "zero-shot")
                atomic_write_json(run.file(ZERO_SHOT_FILE), {"episodes": zero_shot.episodes})

        if config.sft and not warm_started:
            _check_stop(stop_event)
            from training.sft import run_sft

            checkpoint = last_checkpoint(plan.phase_dir("sft")) if resume else None
            step = _checkpoint_step(checkpoint)
            if resume and is_main:
                _forget_after(run, "sft", step)
            recorder.status(phase="sft")
            sft_callback = RunCallback(recorder, plan, tokenizer, stop_event=stop_event, phase="sft",
                                       evaluate_at_start=checkpoint is None,
                                       last_eval_step=_last_eval_step(run, "sft", step))
            if checkpoint is None and is_main:
                sft_callback.evaluate_start(model)  # before the episodes are prepared: the chart starts sooner
            sft = run_sft(model, tokenizer, _sft_settings(plan), callbacks=[sft_callback],
                          resume_from_checkpoint=str(checkpoint) if checkpoint else None,
                          tracker_dir=str(plan.run_dir / "tracker" / "sft") if config.report_to else None)
            if is_main:
                atomic_write_json(run.file("sft_config.json"), sft.trainer_args)
            recorder.status(sft={"steps": sft.steps, "examples": sft.n_examples, "first_loss": sft.first_loss,
                                 "final_loss": sft.final_loss, "seconds": round(sft.seconds, 2),
                                 "teacher_error_rate": config.sft_teacher_error_rate})
            if sft_callback.stopped:
                raise RunStopped()
            _save_warm_start(plan, model, tokenizer, is_main)

        base_result = None
        if config.compare_base and is_main and config.comparison_episodes > 0:
            _check_stop(stop_event)
            recorder.status(phase="base eval")
            base_result = _play_model(model, tokenizer, plan, "base")

        _check_stop(stop_event)
        from training.grpo import build_trainer

        checkpoint = last_checkpoint(plan.phase_dir("grpo")) if resume else None
        step = _checkpoint_step(checkpoint)
        if resume and is_main:
            _forget_after(run, "grpo", step)
        # After SFT its last eval measured this very model: GRPO's curve continues from it.
        callback = RunCallback(recorder, plan, tokenizer, stop_event=stop_event, phase="grpo",
                               evaluate_at_start=not config.sft and checkpoint is None,
                               last_eval_step=_last_eval_step(run, "grpo", step))
        trainer = build_trainer(plan, model, tokenizer, callbacks=[callback])
        if is_main:
            atomic_write_json(run.file("grpo_config.json"), trainer.args.to_dict())
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        stopped = callback.stopped
        model = trainer.model

        recorder.status(phase="saving")
        _save_final(run, trainer, tokenizer, is_main, merge=bool((config.resolved_lora() or {}).get("merge")))
        if stopped:
            recorder.status("stopped", stopped_at=now_iso(), phase="comparison", final_dir=str(run.final_dir))
        model = _inference_model(model)
        if is_main and config.comparison_episodes > 0:
            recorder.status(phase="comparison")
            n = min(config.comparison_episodes, 5) if stopped else config.comparison_episodes
            _comparison(recorder, model, tokenizer, plan, n, base_result, zero_shot)
        if not stopped and is_main:
            _remove_checkpoints(plan)  # the run is complete: final/ holds what it made
        recorder.status("stopped" if stopped else "completed", finished_at=now_iso(), phase="done",
                        final_dir=str(run.final_dir), seconds=round(time.time() - started, 2))
        return run.path
    except RunStopped:
        if model is not None:
            recorder.status(phase="saving")
            _save_final(run, None, tokenizer, is_main, model=model)
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
        del trainer, model, tokenizer
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
    can tell a live run from one whose process died (`training.run_dir.live_status`); on a GPU also the memory and
    utilisation (`status["gpu"]`, `training.gpu.gpu_readout`) that the dashboard's Train tab shows."""

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


def _check_resumable(run: RunDir) -> None:
    status = run.read_live_status()
    state = status.get("status")
    if state == "completed":
        raise ValueError(f"{run.path} completed: nothing to resume (start a new run)")
    if state in ("queued", "running"):
        raise ValueError(f"{run.path} is still {state} (pid {status.get('pid')} on {status.get('host')}): "
                         "stop it first")
    if state not in RESUMABLE_STATUSES:
        raise ValueError(f"{run.path} cannot be resumed (status {state!r})")


def _checkpoint_step(checkpoint: Path | None) -> int | None:
    return int(checkpoint.name.rsplit("-", 1)[1]) if checkpoint is not None else None


def _forget_after(run: RunDir, phase: str, step: int | None) -> None:
    """Drop what a resumed `phase` will write again: its lines after `step` (all of them when it restarts), every
    later phase's lines, and the comparison."""
    later = PHASES[PHASES.index(phase) + 1:]

    def keep(record: dict) -> bool:
        record_phase = record.get("phase", "grpo")
        if record_phase in later:
            return False
        if record_phase != phase:
            return True
        return step is not None and isinstance(record.get("step"), (int, float)) and record["step"] <= step

    for kind in ("metrics", "evals", "transcripts"):
        run.truncate(kind, keep)
    run.truncate("comparison", lambda record: False)


def _last_eval_step(run: RunDir, phase: str, step: int | None) -> int | None:
    """`step` when the run already holds that phase's eval at `step` (the resumed phase must not repeat it)."""
    if step is None:
        return None
    found = any(e.get("phase", "grpo") == phase and e.get("step") == step for e in run.read("evals"))
    return step if found else None


def _sft_settings(plan: Any):
    """The warm start's settings: the config's `sft_*` fields, the plan's dataset and precision, checkpoints."""
    import dataclasses

    from training.sft import SFTSettings

    config = plan.config
    settings = SFTSettings.from_config(config)
    return dataclasses.replace(
        settings, dataset=plan.dataset, output_dir=str(plan.phase_dir("sft")), precision=plan.precision,
        save_steps=config.resolved_save_steps("sft"), save_total_limit=config.save_total_limit,
        report_to=list(config.report_to), run_name=config.run_id)


def _save_warm_start(plan: Any, model: Any, tokenizer: Any, is_main: bool) -> None:
    """Keep the warm-started model (`warm_start/`): a resumed run starts GRPO from it, and it is the base that a
    LoRA adapter and the KL reference refer to (the model's `name_or_path` is pointed at it)."""
    import shutil

    folder = plan.warm_start_dir
    if is_main:
        tmp = plan.run_dir / ".warm_start-tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        shutil.rmtree(plan.phase_dir("sft"), ignore_errors=True)  # warm_start/ supersedes the SFT checkpoints
    _point_at_warm_start(model, plan)


def _point_at_warm_start(model: Any, plan: Any) -> None:
    """Where TRL (KL reference) and PEFT (adapter_config's base_model_name_or_path) look for this model's weights."""
    model.config.name_or_path = model.name_or_path = str(plan.warm_start_dir.resolve())


def _remove_checkpoints(plan: Any) -> None:
    import shutil

    shutil.rmtree(plan.checkpoints_dir, ignore_errors=True)


def _inference_model(model: Any) -> Any:
    """The model to play the comparison with: a LoRA model with its adapter merged (faster generation); a
    quantized (QLoRA) base keeps its adapter, as 4-bit weights cannot absorb it exactly."""
    if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
        if getattr(getattr(model, "config", None), "quantization_config", None) is None:
            return model.merge_and_unload()
    return model


# ------------------------------------------------------------------------------------------- phases
def _check_stop(stop_event: threading.Event | None) -> None:
    if stop_event is not None and stop_event.is_set():
        raise RunStopped()


def _set_cpu_threads(plan: Any) -> int | None:
    """Apply `cpu_threads` on CPU runs; returns the previous thread count to restore (None: unchanged)."""
    threads = plan.cpu_threads
    if threads is None or plan.device != "cpu":
        return None
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    return before


def _seed_everything(seed: int) -> None:
    from transformers import set_seed

    set_seed(seed)


def _device_kwargs(plan: Any) -> dict[str, Any]:
    import torch

    device = plan.device
    # Master weights stay fp32 whatever the precision: bf16/fp16 is autocast (GRPOConfig.bf16/fp16), as TRL does
    # by default. Pure bf16 weights would round GRPO's ~1e-6 updates away.
    dtype = torch.float32
    if _world_size() > 1:
        device = "cpu"  # the Trainer moves each rank's copy to its own GPU
    kwargs: dict[str, Any] = {"device": device, "dtype": dtype}
    if (plan.config.resolved_lora() or {}).get("load_in_4bit"):
        kwargs["load_in_4bit"] = True  # QLoRA: the frozen base in 4-bit NF4, computing in bf16
    return kwargs


def _shared_across_ranks(config: TrainConfig) -> TrainConfig:
    """Under `accelerate launch`, every rank must use the main process's run id and directory."""
    if _world_size() <= 1:
        return config
    import dataclasses

    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    PartialState()  # initialises the process group
    shared = broadcast_object_list([config.run_id, config.output_dir], from_process=0)
    return dataclasses.replace(config, run_id=shared[0], output_dir=shared[1])


def _save_final(run: RunDir, trainer: Any, tokenizer: Any, is_main: bool, model: Any = None,
                merge: bool = False) -> None:
    """Save model + tokenizer to a temp folder beside final/, then swap it in (never a half-written final/).

    With a trainer every rank takes part (sharded models are gathered), into one folder the main rank commits. A
    LoRA model saves its adapter (`adapter_config.json`, `adapter_model.safetensors`); with `merge` the merged model
    also goes to `final/merged/`.
    """
    import shutil

    if trainer is not None:
        tmp = run.path / ".final-tmp"
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        trainer.accelerator.wait_for_everyone()
        trainer.save_model(str(tmp))
        trainer.accelerator.wait_for_everyone()
        if not is_main:
            return
    else:
        if not is_main:
            return
        tmp = run.final_tmp_dir()
        model.save_pretrained(str(tmp))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    if merge and trainer is not None:
        import copy

        peft_model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(peft_model, "merge_and_unload"):
            merged = copy.deepcopy(peft_model).merge_and_unload()
            merged.save_pretrained(str(tmp / "merged"))
            if tokenizer is not None:
                tokenizer.save_pretrained(str(tmp / "merged"))
            del merged
    run.commit_final(tmp)


def _play_model(model: Any, tokenizer: Any, plan: Any, name: str, n: int | None = None):
    """The comparison's episodes for `model`: `n` (default `comparison_episodes`) eval questions, the run's seed."""
    from training.policy import evaluate_model

    config = plan.config
    return evaluate_model(model, tokenizer, dataset=plan.dataset, split=config.eval_split,
                          n_episodes=config.comparison_episodes if n is None else n, seed=config.seed,
                          step_budget=config.step_budget, name=name, max_turn_tokens=config.max_turn_tokens,
                          enable_thinking=config.enable_thinking)


#: The pretrained model's zero-shot episodes, kept so that a run resumed after its warm start still compares them.
ZERO_SHOT_FILE = "zero_shot.json"


def _wants_zero_shot(config: TrainConfig) -> bool:
    """Play the pretrained model before its warm start too: the comparison then shows what SFT and GRPO each add.

    Only for pretrained models (the built-in one starts from random weights: its zero-shot is 0%) warm-started by
    SFT (without a warm start the `base` eval already is the model before any training)."""
    return (bool(config.compare_base) and bool(config.sft) and not config.is_builtin_model
            and config.comparison_episodes > 0)


def _read_zero_shot(run: RunDir) -> Any:
    from sqlenv.evaluation import EvaluationResult

    path = run.file(ZERO_SHOT_FILE)
    if not path.is_file():
        return None
    return EvaluationResult.from_episodes(json.loads(path.read_text())["episodes"], policy="zero-shot")


def _comparison(recorder: RunRecorder, model: Any, tokenizer: Any, plan: Any, n: int,
                base_result: Any, zero_shot: Any = None) -> None:
    """Random policy vs the trained model (and the base, and the pretrained model's zero-shot before its warm
    start) on the same eval questions with the same seeds."""
    from sqlenv.evaluation import evaluate
    from sqlenv.policies import RandomPolicy

    config = plan.config
    env = plan.environment(config.eval_split)
    try:
        random_result = evaluate(env, RandomPolicy(seed=config.seed), n_episodes=n, seed=config.seed)
    finally:
        env.close()
    trained = _play_model(model, tokenizer, plan, "trained", n)
    base_episodes = base_result.episodes[:n] if base_result is not None else None
    zero_episodes = zero_shot.episodes[:n] if zero_shot is not None else None
    for i in range(n):
        pair = {"kind": "pair", "index": i, "seed": config.seed + i, "split": config.eval_split,
                "question_id": trained.episodes[i].get("question_id"),
                "random": random_result.episodes[i], "trained": trained.episodes[i]}
        if base_episodes is not None and i < len(base_episodes):
            pair["base"] = base_episodes[i]
        if zero_episodes is not None and i < len(zero_episodes):
            pair["zero_shot"] = zero_episodes[i]
        recorder.append("comparison", pair)

    def scores(result: Any) -> dict[str, float]:
        return {"success_rate": result.success_rate, "avg_reward": result.avg_reward,
                "avg_steps": result.avg_steps, "explore_rate": result.explore_rate,
                "n_episodes": result.n_episodes}

    summary = {"kind": "summary", "split": config.eval_split, "n_episodes": n, "seed": config.seed,
               "random": scores(random_result), "trained": scores(trained),
               "base": scores(type(trained).from_episodes(base_episodes, policy="base")) if base_episodes else None,
               "base_label": _base_label(config) if base_episodes else None,
               "zero_shot": scores(type(trained).from_episodes(zero_episodes, policy="zero-shot"))
               if zero_episodes else None,
               "time": time.time()}
    recorder.append("comparison", summary)


def _base_label(config: TrainConfig) -> str:
    if config.sft:
        return "SFT warm-start (before GRPO)"
    if config.is_builtin_model:
        return "random init (before GRPO)"
    return "pretrained, zero-shot (before any training)"


def _free_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


# ----------------------------------------------------------------------------------------------- CLI
class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


SFT_LINE_SECONDS = 10.0


def progress_listener(total_hint: int) -> Listener:
    """The CLI's terminal progress, as a `run_training` listener: one line per status change, GRPO metrics log
    and eval, an SFT line at most every `SFT_LINE_SECONDS`, and the comparison's summary. `total_hint`: GRPO
    steps."""
    t0 = time.time()
    last_phase: list[str | None] = [None]
    last_sft_line = [-1e9]  # SFT logs every few steps: one line per SFT_LINE_SECONDS is enough for a terminal

    def listener(event: str, payload: dict) -> None:
        elapsed = time.time() - t0
        if event == "status":
            phase = payload.get("phase")
            if phase != last_phase[0] or payload.get("status") in ("failed", "stopped", "completed"):
                last_phase[0] = phase
                line = f"[{elapsed:7.1f}s] {payload.get('status')}: {phase}"
                if payload.get("error"):
                    line += f" — {payload['error']}"
                print(line, flush=True)
        elif event == "metrics":
            step = payload.get("step")
            if payload.get("phase") == "sft":
                if elapsed - last_sft_line[0] < SFT_LINE_SECONDS:
                    return
                last_sft_line[0] = elapsed
                parts, keys = [f"sft step {step}"], (("loss", "loss"), ("mean_token_accuracy", "token acc"),
                                                     ("learning_rate", "lr"))
            else:
                parts, keys = [f"step {step}/{total_hint}"], (
                    ("reward", "reward"), ("rewards/reward_correctness/mean", "correct"), ("loss", "loss"),
                    ("tools/call_frequency", "tool calls"), ("step_time", "step_time"))
            for key, label in keys:
                if isinstance(payload.get(key), (int, float)):
                    parts.append(f"{label}={payload[key]:.3f}")
            print(f"[{elapsed:7.1f}s] " + "  ".join(parts), flush=True)
        elif event == "evals":
            print(f"[{elapsed:7.1f}s] eval {payload.get('phase', 'grpo')} step {payload['step']} {payload['split']}: "
                  f"success={payload['success_rate']:.2f} reward={payload['avg_reward']:.3f} "
                  f"steps={payload['avg_steps']:.1f}", flush=True)
        elif event == "comparison" and payload.get("kind") == "summary":
            for who in ("random", "zero_shot", "base", "trained"):
                s = payload.get(who)
                if s:
                    print(f"[{elapsed:7.1f}s] {who:>9}: success={s['success_rate']:.2f} "
                          f"reward={s['avg_reward']:.3f} steps={s['avg_steps']:.1f}", flush=True)

    return listener


def main(argv: list[str] | None = None) -> int:
    parser = _ArgumentParser(prog="python -m training.train",
                             description="Train a model on SQLEnv with GRPO; writes runs/<run_id>/.")
    parser.add_argument("--config", help="a TrainConfig JSON file (e.g. configs/tiny_cpu.json)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config field (repeatable), e.g. --set max_steps=20")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue a stopped, failed or interrupted run from its last checkpoint (its own config)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    if args.resume and (args.config or args.overrides):
        print("python -m training.train: error: --resume uses the run's own config.json: drop --config/--set",
              file=sys.stderr)
        return 2
    try:
        if args.resume:
            if not (Path(args.resume) / "config.json").is_file():
                raise ConfigError(f"--resume {args.resume}: not a run directory (no config.json)")
            config = TrainConfig.from_dict(RunDir(Path(args.resume)).read_config())
            _check_resumable(RunDir(Path(args.resume)))
        else:
            config = TrainConfig.from_json(args.config) if args.config else TrainConfig()
            config = config.with_overrides(args.overrides)
    except (ConfigError, ValueError) as exc:
        print(f"python -m training.train: error: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        import transformers

        import datasets

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()  # loading and saving weights; progress lines say enough
        datasets.disable_progress_bars()  # the warm start's dataset preparation; progress lines say enough
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    listener = None if args.quiet or not _is_main_process() else progress_listener(config.max_steps)
    try:
        if args.resume:
            run_dir = resume_training(args.resume, listener=listener)
        else:
            run_dir = run_training(config, listener=listener)
    except FileExistsError as exc:  # a taken run_id/output_dir is a bad argument: nothing was written
        print(f"python -m training.train: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: run marked failed", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the run is marked failed; say why in one line
        print(f"python -m training.train: run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if _is_main_process():
        status = RunDir(run_dir).read_status()
        print(json.dumps({"run_dir": str(run_dir), "status": status.get("status")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
