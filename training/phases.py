"""A training run as a short sequence of phases, each one object that runs, resumes and reports itself.

    LoadModel → ZeroShotEval (a pretrained model before its warm start, when compared) → WarmStart (SFT, when
    enabled) → BaseEval (the model before GRPO, when compared) → GRPO (then final/) → Comparison (random vs trained
    [vs base, zero-shot] on the same eval questions)

`training.train.run_training` resolves the plan, opens the run directory and plays `run_phases(plan)` in order over
one `RunState`: the plan, the run directory and its writer, the stop flag, and the model the phases hand on. Each
phase says whether the run wants it (`wanted`), whether a stop is honoured before it (`stoppable`; the comparison
still runs after a stop, on at most 5 episodes), writes its own `phase` into status.json, and, on `resume`, picks up
from its own checkpoint (`checkpoints/<phase>/`) after dropping the lines it will write again, or skips what the run
already holds (a finished warm start in `warm_start/`). How the evals play a model and write the comparison is
`training.evals`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path
from typing import Any

from training.callbacks import RunCallback
from training.distributed import world_size
from training.evals import play_model, record_comparison
from training.run import schema
from training.run.directory import RunDir, atomic_write_json, last_checkpoint, now_iso
from training.run.recorder import RunRecorder

__all__ = ["RunState", "Phase", "LoadModel", "ZeroShotEval", "WarmStart", "BaseEval", "GRPO", "Comparison",
           "run_phases", "RunStopped", "save_final", "sft_settings", "ZERO_SHOT_FILE"]

#: The pretrained model's zero-shot episodes, kept so that a run resumed after its warm start still compares them.
ZERO_SHOT_FILE = "zero_shot.json"


class RunStopped(Exception):
    """Raised when the stop flag is seen before a stoppable phase, or when the warm start was stopped."""


@dataclasses.dataclass
class RunState:
    """What the phases of one run share.

    Args:
        plan: the run's `training.plan.RunPlan`.
        run: its directory (`training.run.directory.RunDir`).
        recorder: the run's writer (status, metrics, evals, transcripts, comparison) and listeners.
        stop_event: set from another thread to stop the run (None: never).
        resume: the run continues from its checkpoints.
        is_main: this process writes the run files (rank 0 under `accelerate launch`).
        model, tokenizer: what the phases hand on (loaded, warm-started, trained).
        baselines: eval results of models played before GRPO, by name (`"zero_shot"`, `"base"`), for the comparison.
        stopped: GRPO was stopped (final/ is saved; the comparison is short).
        kept: which GRPO weights the run hands back and why (status.json's `keep_best`; None without a validation
            panel), for the comparison's summary.
    """

    plan: Any
    run: RunDir
    recorder: RunRecorder
    stop_event: threading.Event | None = None
    resume: bool = False
    is_main: bool = True
    model: Any = None
    tokenizer: Any = None
    baselines: dict[str, Any] = dataclasses.field(default_factory=dict)
    stopped: bool = False
    kept: dict | None = None

    @property
    def config(self) -> Any:
        return self.plan.config

    def check_stop(self) -> None:
        if self.stop_event is not None and self.stop_event.is_set():
            raise RunStopped()


class Phase:
    """One step of a run. `name` is what status.json's `phase` says while it runs; `label` what a reader calls it
    (with its size), in status.json's `phases`, the run's plan."""

    name = ""
    #: honour a stop before the phase starts (the comparison runs after a stop too)
    stoppable = True

    def wanted(self, state: RunState) -> bool:
        return True

    def label(self, state: RunState) -> str:
        return self.name

    def run(self, state: RunState) -> None:
        raise NotImplementedError


class LoadModel(Phase):
    """Load the model (`config.model`, or `warm_start/` when a resumed run already warm-started it)."""

    name = schema.LOADING_MODEL

    def label(self, state: RunState) -> str:
        return "load model"

    def run(self, state: RunState) -> None:
        from training.models import load_model_and_tokenizer

        plan, config = state.plan, state.config
        _seed_everything(config.seed)
        warm_started = WarmStart.done(state)
        state.model, state.tokenizer = load_model_and_tokenizer(
            str(plan.warm_start_dir) if warm_started else config.model, seed=config.seed, dataset=plan.dataset,
            **_device_kwargs(plan))
        if warm_started:
            _point_at_warm_start(state.model, plan)
        state.recorder.status(n_parameters=sum(p.numel() for p in state.model.parameters()))


class ZeroShotEval(Phase):
    """Play the comparison's eval questions with a pretrained model before its warm start, so the comparison shows
    what SFT and GRPO each add. Only for pretrained models (the built-in one starts from random weights: its
    zero-shot is 0%) that are warm-started (without a warm start the `base` eval already is the model before any
    training). Kept in `zero_shot.json`: a run resumed after its warm start reads it back."""

    name = schema.ZERO_SHOT_EVAL

    def wanted(self, state: RunState) -> bool:
        config = state.config
        return (bool(config.compare_base) and bool(config.sft.enabled) and not config.is_builtin_model
                and config.resolved_zero_shot_episodes() > 0 and state.is_main)

    def label(self, state: RunState) -> str:
        return f"zero-shot eval ({state.config.resolved_zero_shot_episodes()} episodes)"

    def run(self, state: RunState) -> None:
        from sqlenv.evaluation.evaluate import EvaluationResult

        path = state.run.file(ZERO_SHOT_FILE)
        if state.resume and path.is_file():  # played before the run was interrupted
            episodes = json.loads(path.read_text(encoding="utf-8"))["episodes"]
            state.baselines["zero_shot"] = EvaluationResult.from_episodes(episodes, policy="zero-shot")
        elif not WarmStart.done(state):
            state.recorder.status(phase=self.name)
            result = play_model(state.model, state.tokenizer, state.plan, "zero-shot",
                                 state.config.resolved_zero_shot_episodes())
            atomic_write_json(path, {"episodes": result.episodes})
            state.baselines["zero_shot"] = result


class WarmStart(Phase):
    """SFT on the teacher's episodes (`config.sft`), resumable from `checkpoints/sft/`; keeps `warm_start/`."""

    name = schema.SFT

    @staticmethod
    def done(state: RunState) -> bool:
        return bool(state.config.sft.enabled) and (state.plan.warm_start_dir / "config.json").exists()

    def wanted(self, state: RunState) -> bool:
        return bool(state.config.sft.enabled) and not self.done(state)

    def label(self, state: RunState) -> str:
        steps = state.config.sft.max_steps
        return f"warm start (SFT, {steps} steps)" if isinstance(steps, int) and steps > 0 else "warm start (SFT)"

    def run(self, state: RunState) -> None:
        from training.warm_start import run_sft

        plan, config, run, recorder = state.plan, state.config, state.run, state.recorder
        checkpoint, last_eval_step = _resume_point(state, "sft")
        recorder.status(phase=self.name)
        callback = RunCallback(recorder, plan, state.tokenizer, stop_event=state.stop_event, phase="sft",
                               evaluate_at_start=checkpoint is None, last_eval_step=last_eval_step)
        if checkpoint is None and state.is_main:
            callback.evaluate_start(state.model)  # before the episodes are prepared: the chart starts sooner
        sft = run_sft(state.model, state.tokenizer, sft_settings(plan), callbacks=[callback],
                      resume_from_checkpoint=str(checkpoint) if checkpoint else None,
                      tracker_dir=str(plan.run_dir / "tracker" / "sft") if config.report_to else None)
        if state.is_main:
            atomic_write_json(run.file("sft_config.json"), sft.trainer_args)
        recorder.status(sft={"steps": sft.steps, "examples": sft.n_examples, "first_loss": sft.first_loss,
                             "final_loss": sft.final_loss, "seconds": round(sft.seconds, 2),
                             "teacher_error_rate": config.sft.teacher_error_rate})
        if callback.stopped:
            raise RunStopped()
        _save_warm_start(plan, state.model, state.tokenizer, state.is_main)


class BaseEval(Phase):
    """Play the comparison's eval questions with the model as GRPO finds it (`compare_base`)."""

    name = schema.BASE_EVAL

    def wanted(self, state: RunState) -> bool:
        config = state.config
        return bool(config.compare_base) and state.is_main and config.comparison_episodes > 0

    def label(self, state: RunState) -> str:
        return f"base eval ({state.config.comparison_episodes} episodes)"

    def run(self, state: RunState) -> None:
        state.recorder.status(phase=self.name)
        state.baselines["base"] = play_model(state.model, state.tokenizer, state.plan, "base")


class GRPO(Phase):
    """GRPO with TRL (`training.grpo.build_trainer`), resumable from `checkpoints/grpo/`; saves `final/`."""

    name = schema.GRPO

    def label(self, state: RunState) -> str:
        return f"GRPO ({state.config.max_steps} steps)"

    def run(self, state: RunState) -> None:
        from training.grpo import build_trainer

        plan, config, run, recorder = state.plan, state.config, state.run, state.recorder
        checkpoint, last_eval_step = _resume_point(state, "grpo")
        # After SFT its last eval measured this very model: GRPO's curve continues from it.
        callback = RunCallback(recorder, plan, state.tokenizer, stop_event=state.stop_event, phase="grpo",
                               evaluate_at_start=not config.sft.enabled and checkpoint is None,
                               last_eval_step=last_eval_step)
        from training.validation import ValidationCallback

        validation = ValidationCallback(
            recorder, plan, state.tokenizer, stop_event=state.stop_event, resume_step=_checkpoint_step(checkpoint),
            weights_file=plan.phase_dir("grpo") / "best_weights.pt" if config.resolved_save_steps("grpo") > 0
            else None)
        # In this order: the run's end-of-GRPO eval plots the last step's weights (the curve's end, at its step);
        # then keep_best puts the kept weights back, which final/ and the comparison hold.
        trainer = build_trainer(plan, state.model, state.tokenizer, callbacks=[callback, validation])
        from training.models.trainable import trainable_parameters

        recorder.status(grpo_trainable_parameters=trainable_parameters(trainer.model))
        if state.is_main:
            atomic_write_json(run.file("grpo_config.json"), trainer.args.to_dict())
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        state.stopped = callback.stopped
        state.kept = validation.kept
        recorder.status(phase=schema.SAVING)
        save_final(run, trainer, state.tokenizer, state.is_main,
                   merge=bool((config.resolved_lora() or {}).get("merge")))
        if state.stopped:
            recorder.status("stopped", stopped_at=now_iso(), phase=schema.COMPARISON, final_dir=str(run.final_dir))
        state.model = _inference_model(trainer.model)
        del trainer


class Comparison(Phase):
    """Random policy vs the trained model (and the baselines) on the same eval questions with the same seeds; a
    stopped run plays at most 5."""

    name = schema.COMPARISON
    stoppable = False

    def wanted(self, state: RunState) -> bool:
        return state.is_main and state.config.comparison_episodes > 0

    def label(self, state: RunState) -> str:
        return f"final eval ({state.config.comparison_episodes} episodes)"

    def run(self, state: RunState) -> None:
        state.recorder.status(phase=self.name)
        n = state.config.comparison_episodes
        record_comparison(state.recorder, state.model, state.tokenizer, state.plan,
                          min(n, 5) if state.stopped else n, state.baselines.get("base"),
                          state.baselines.get("zero_shot"), trained_weights=state.kept)


def run_phases() -> list[Phase]:
    """The phases of a run, in order."""
    return [LoadModel(), ZeroShotEval(), WarmStart(), BaseEval(), GRPO(), Comparison()]


def planned_phases(state: RunState) -> list[dict[str, str]]:
    """The phases this run will play, in order, as status.json's `phases` records them for readers (the dashboard's
    phase list): `{"name": <its status.json phase>, "label": "warm start (SFT, 5000 steps)"}`."""
    return [{"name": phase.name, "label": phase.label(state)} for phase in run_phases() if phase.wanted(state)]


def _resume_point(state: RunState, phase: str) -> tuple[Path | None, int | None]:
    """Where a trainer phase picks up: its newest checkpoint (None on a fresh run or when it has none), after dropping
    the lines it will write again; and the step of its last eval already recorded (not to repeat it)."""
    checkpoint = last_checkpoint(state.plan.phase_dir(phase)) if state.resume else None
    step = _checkpoint_step(checkpoint)
    if state.resume and state.is_main:
        _forget_after(state.run, phase, step)
    return checkpoint, _last_eval_step(state.run, phase, step)


def _checkpoint_step(checkpoint: Path | None) -> int | None:
    return int(checkpoint.name.rsplit("-", 1)[1]) if checkpoint is not None else None


def _forget_after(run: RunDir, phase: str, step: int | None) -> None:
    """Drop what a resumed `phase` will write again: its lines after `step` (all of them when it restarts), every
    later phase's lines, and the comparison."""
    later = schema.TRAINER_PHASES[schema.TRAINER_PHASES.index(phase) + 1:]

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


#: Warm starts of at most this many steps log every `plot_every` steps (see `sft_settings`).
SHORT_WARM_START_STEPS = 200


def sft_settings(plan: Any):
    """The warm start's settings: the config's `sft` section, the plan's dataset and precision (`sft.precision` when
    set), checkpoints."""
    import dataclasses

    from training.warm_start import SFTSettings

    config = plan.config
    settings = SFTSettings.from_config(config)
    # A short warm start logs every `plot_every` steps, so its loss is a curve, not a point (a long one keeps the
    # default: it groups episodes of similar length in runs of 50 batches, so fewer steps swing between lengths).
    steps = config.resolved_sft().max_steps
    logging_steps = config.plot_every if 0 < steps <= SHORT_WARM_START_STEPS else settings.logging_steps
    return dataclasses.replace(
        settings, dataset=plan.dataset, output_dir=str(plan.phase_dir("sft")),
        precision=config.sft.precision or plan.precision,
        logging_steps=logging_steps, held_out=tuple(plan.validation_ids),
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


def _inference_model(model: Any) -> Any:
    """The model to play the comparison with: a LoRA model with its adapter merged (faster generation); a
    quantized (QLoRA) base keeps its adapter, as 4-bit weights cannot absorb it exactly."""
    if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
        if getattr(getattr(model, "config", None), "quantization_config", None) is None:
            return model.merge_and_unload()
    return model


def _seed_everything(seed: int) -> None:
    from transformers import set_seed

    set_seed(seed)


def _device_kwargs(plan: Any) -> dict[str, Any]:
    import torch

    device = plan.device
    # Master weights stay fp32 whatever the precision: bf16/fp16 is autocast (GRPOConfig.bf16/fp16), as TRL does
    # by default. Pure bf16 weights would round GRPO's ~1e-6 updates away.
    dtype = torch.float32
    if world_size() > 1:
        device = "cpu"  # the Trainer moves each rank's copy to its own GPU
    kwargs: dict[str, Any] = {"device": device, "dtype": dtype}
    if (plan.config.resolved_lora() or {}).get("load_in_4bit"):
        kwargs["load_in_4bit"] = True  # QLoRA: the frozen base in 4-bit NF4, computing in bf16
    return kwargs


def save_final(run: RunDir, trainer: Any, tokenizer: Any, is_main: bool, model: Any = None,
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
