"""The validation panel and `keep_best`: a run never hands back a model worse on validation than its start.

A panel of `validation_questions` train-split questions is held out of the warm start and of GRPO
(`RunPlan.validation_ids`, chosen once by `training.panel.choose_panel`; `EpisodeSource(held_out=...)` keeps every sampler away from
them) and played greedily at GRPO's step 0, every `eval_every` steps and at its end (`ValidationCallback`). Greedy
play of the same questions makes two evals comparable question by question (paired): `evals.jsonl` keeps each
question's outcome, so a reader counts the questions gained and lost between two steps.

With `keep_best`, the callback keeps a copy of the trainable weights of the best validated step — the start counts as
step 0 — and puts them back into the model when GRPO ends, so `final/` and the comparison play them (HF Trainer's
`load_best_model_at_end` / `metric_for_best_model`, on a metric of our own). A later step is kept only when it
scores strictly higher: a tie keeps the earlier weights, which drifted less. status.json's `keep_best` says which
step was kept and why, after every validation (what the run would hand back if it ended there).

A resumed run must know the best as of its checkpoint, so the copy goes to disk with each checkpoint, not with each
new best: `best_weights.pt` (written only when the best changed since the last checkpoint; SmolLM2-135M: 0.54 GB)
and `best_weights.json` (the `keep_best` record as of that checkpoint, and its step). A best found after the last
checkpoint is never written: a run that dies there resumes from that checkpoint and plays those steps again.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from training.distributed import is_main, unwrap
from training.run.directory import atomic_write_json, read_json
from training.run.recorder import RunRecorder, error_message

__all__ = ["ValidationCallback", "WeightsSnapshot", "METRIC", "VALIDATION_SPLIT"]

logger = logging.getLogger(__name__)

#: The metric `keep_best` picks by (status.json's `keep_best.metric_for_best_model`).
METRIC = "validation_success"
#: The `split` of the panel's lines in evals.jsonl.
VALIDATION_SPLIT = "validation"


class WeightsSnapshot:
    """A copy of a model's trainable weights (CPU tensors, by parameter name) and the step they are from.

    Trainable only: frozen weights cannot change, so a LoRA run copies its adapter, a `train_top_layers` run its top
    layers and head, a full fine-tune every weight (SmolLM2-135M: 0.54 GB)."""

    def __init__(self, step: int, tensors: dict[str, Any]):
        self.step = step
        self.tensors = tensors

    @classmethod
    def of(cls, model: Any, step: int) -> "WeightsSnapshot":
        return cls(step, {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()
                          if p.requires_grad})

    def restore(self, model: Any) -> None:
        """Copy the kept weights back into `model` (in place: the optimizer and the trainer keep their tensors)."""
        import torch

        params = dict(model.named_parameters())
        missing = [name for name in self.tensors if name not in params]
        if missing:
            raise RuntimeError(f"kept weights name parameters the model lacks: {missing[:3]}")
        with torch.no_grad():
            for name, tensor in self.tensors.items():
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))

    def save(self, path: Any) -> None:
        import os

        import torch

        tmp = f"{path}.tmp"
        torch.save({"step": self.step, "tensors": self.tensors}, tmp)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Any) -> "WeightsSnapshot":
        import torch

        data = torch.load(path, map_location="cpu", weights_only=True)
        return cls(int(data["step"]), data["tensors"])


class ValidationCallback(TrainerCallback):
    """Plays the validation panel during GRPO and keeps the best validated weights (see the module docstring).

    Args:
        recorder: the run's writer (evals.jsonl lines with `split: "validation"`, status.json's `keep_best`).
        plan: the run's `RunPlan`: its panel (`validation_ids`), `eval_every`, `keep_best` and play settings.
        tokenizer: the model's tokenizer.
        stop_event: the run's stop flag: a stopped run is not validated again; it keeps its best validated weights.
        resume_step: the step of the checkpoint this run resumes from (None on a fresh run): the best as of that
            checkpoint and its `keep_best` record are read back from `weights_file`, and the panel is not played again
            at steps already validated.
        weights_file: where the best weights are written with each checkpoint for a resumed run to read back, its
            record beside it (`.json`); None: not written, as when the run saves no checkpoints and so cannot resume.

    After `trainer.train()`, `kept` is the status.json record (None without a panel).
    """

    def __init__(self, recorder: RunRecorder, plan: Any, tokenizer: Any, *,
                 stop_event: threading.Event | None = None, resume_step: int | None = None, weights_file: Any = None):
        self.recorder = recorder
        self.plan = plan
        self.config = plan.config
        self.tokenizer = tokenizer
        self.stop_event = stop_event
        self.weights_file = Path(weights_file) if weights_file is not None else None
        self.keep_best = bool(self.config.keep_best)
        self.kept: dict | None = None
        self._best: WeightsSnapshot | None = None
        self._written_step: int | None = None  # the step of the weights in `weights_file`
        self._replayed_step: int | None = None  # a resume that lost the record plays the panel again at this step
        if resume_step is not None and self.weights_file is not None and self.active:
            if not self._read_back(resume_step):
                self._replayed_step = resume_step
        self._last_validated: int | None = self.kept.get("last_step") if self.kept else None
        self._envs: list[Any] = []

    @property
    def active(self) -> bool:
        return bool(self.plan.validation_ids)

    # ------------------------------------------------------------------------------- trainer events
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.active and is_main(state) and self._last_validated is None:
            self.validate(model, state.global_step)
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        every = self.config.eval_every
        if (self.active and is_main(state) and every > 0 and state.global_step % every == 0
                and not self._stopping()):
            self.validate(model, state.global_step)
        return control

    def on_save(self, args, state, control, **kwargs):
        """A checkpoint was written: write the best as of it (its weights only when they changed), for a resume."""
        if self.weights_file is None or self.kept is None or not is_main(state):
            return control
        if self.keep_best and self._best is not None and self._best.step != self._written_step:
            self._best.save(self.weights_file)
            self._written_step = self._best.step
        atomic_write_json(self.weights_file.with_suffix(".json"), {
            "checkpoint_step": state.global_step, "weights_step": self._written_step, "keep_best": self.kept})
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if not (self.active and is_main(state)):
            self._close()
            return control
        if not self._stopping() and self._last_validated != state.global_step:
            self.validate(model, state.global_step)
        if self.keep_best and self._best is not None and self._best.step != state.global_step:
            self._best.restore(unwrap(model))  # also when a stop left the model at a step never validated
        if self.kept is not None:
            self._decide(final_step=state.global_step)
        self._close()
        return control

    # ------------------------------------------------------------------------------------ validation
    def validate(self, model: Any, step: int) -> Any:
        """Play the panel greedily with `model`, record it, and keep its weights when they score best so far. A
        panel that raises writes an eval line with its `error` (the step is then not a candidate) and returns None."""
        from training.evals import eval_batch_size
        from training.generation.model_policy import evaluate_model

        ids = list(self.plan.validation_ids)
        model = unwrap(model)
        while len(self._envs) < min(len(ids), eval_batch_size(self.config, model)):
            self._envs.append(self.plan.environment(self.config.train_split))
        try:
            result = evaluate_model(model, self.tokenizer, question_ids=ids, seed=self.config.seed, name="model",
                                    max_turn_tokens=self.config.max_turn_tokens, envs=self._envs,
                                    enable_thinking=self.config.enable_thinking, prompt=self.config.prompt,
                                    precision=self.plan.precision)
        except Exception as exc:  # noqa: BLE001 - an error line, not a 0% step; keep_best judges the steps it could
            logger.exception("validation at step %s failed", step)
            self.recorder.append("evals", {"step": step, "phase": "grpo", "split": VALIDATION_SPLIT,
                                           "error": error_message(exc), "time": time.time()})
            return None
        correct = [bool(e.get("correct")) for e in result.episodes]
        if step == self._replayed_step:  # this line replaces the one the interrupted process wrote at this step
            self.recorder.run.truncate("evals", lambda r: not (r.get("split") == VALIDATION_SPLIT
                                                                and r.get("step") == step))
            self._replayed_step = None
        self.recorder.append("evals", {
            "step": step, "phase": "grpo", "split": VALIDATION_SPLIT, "success_rate": result.success_rate,
            "avg_reward": result.avg_reward, "avg_steps": result.avg_steps, "explore_rate": result.explore_rate,
            "execution_accuracy": result.execution_accuracy, "n_episodes": result.n_episodes,
            "question_ids": ids, "correct": correct, "time": time.time(),
        })
        self._last_validated = step
        self._track(model, step, result.success_rate)
        return result

    def _track(self, model: Any, step: int, success: float) -> None:
        kept = self.kept or {"metric_for_best_model": METRIC, "best_step": step, "best_metric": success,
                             "start_step": step, "start_metric": success}
        new_best = self.kept is None or success > kept["best_metric"]
        kept.update(last_step=step, last_metric=success)
        if new_best:
            kept.update(best_step=step, best_metric=success)
            if self.keep_best:
                self._best = WeightsSnapshot.of(model, step)  # to disk with the next checkpoint (`on_save`)
        self.kept = kept
        self._decide()

    def _decide(self, final_step: int | None = None) -> None:
        """Which weights the run hands back, and why (status.json's `keep_best`)."""
        kept = self.kept
        best, start, last = kept["best_step"], kept["start_step"], kept["last_step"]
        start_name = "the warm start" if self.config.sft.enabled else "the starting weights"
        if start != 0:  # GRPO's start was not validated (its panel raised, or a resume lost the record)
            start_name = f"the first validated step ({start})"
        unvalidated = final_step is not None and final_step != last
        if not self.keep_best:
            kept.update(kept="last", reason="keep_best is off: the last weights are kept")
        elif best == start:
            kept.update(kept="start", reason=f"GRPO did not beat {start_name} on validation: {start_name} "
                                             f"{'is' if self.config.sft.enabled else 'are'} kept")
        elif best == last and not unvalidated:
            kept.update(kept="last", reason="the last validated step scored best on validation")
        else:
            kept.update(kept="best", reason=f"step {best} scored best on validation: its weights are kept")
        if unvalidated and self.keep_best:
            kept["reason"] += f" (the run stopped at step {final_step}, after its last validation)"
        kept["step"] = best if self.keep_best else (final_step if final_step is not None else last)
        self.recorder.status(keep_best=dict(kept))

    # ------------------------------------------------------------------------------------ helpers
    def _read_back(self, resume_step: int) -> bool:
        """The best as of the checkpoint at `resume_step` and its record, from what `on_save` wrote with it; False
        when they are missing or belong to another checkpoint (a process killed after its checkpoint was written and
        before `on_save` wrote them): the panel is then played again at `resume_step` and the steps validated from
        there on are judged afresh."""
        try:
            record = read_json(self.weights_file.with_suffix(".json"))
            if record.get("checkpoint_step") != resume_step:
                raise ValueError(f"written with checkpoint {record.get('checkpoint_step')}, not {resume_step}")
            kept = dict(record["keep_best"])
            best = None
            if self.keep_best:
                best = WeightsSnapshot.load(self.weights_file)
                if best.step != kept.get("best_step"):
                    raise ValueError(f"weights of step {best.step}, record's best {kept.get('best_step')}")
        except (OSError, RuntimeError, AttributeError, KeyError, TypeError, ValueError) as exc:  # odd or torn files
            logger.warning("best weights not read back (%s): the best of the steps validated from now on is kept",
                           exc)
            return False
        self.kept, self._best = kept, best
        self._written_step = best.step if best is not None else None
        return True

    def _stopping(self) -> bool:
        return self.stop_event is not None and self.stop_event.is_set()

    def _close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs.clear()
