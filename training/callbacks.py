"""The trainer hooks of a run: metrics, traces, periodic evals, the stop flag. What they write goes through the run
record's writer (`training.run.recorder.RunRecorder`).

`RunCallback` is the `TrainerCallback` that drives the recorder during `trainer.train()`, for one phase of the run — the SFT
warm-start (`phase="sft"`) or GRPO (`phase="grpo"`); every line it writes carries its `phase`, and its `step` is
the phase's own step:

- every trainer log → one `metrics.jsonl` line (SFT: loss, mean_token_accuracy, learning_rate, grad_norm; GRPO:
  reward, reward_std, rewards/<func>/mean, loss, kl, learning_rate, tools/call_frequency,
  tools/failure_frequency, completions/clipped_ratio, frac_reward_zero_std, groups_mixed_success_frac (the share of
  groups with mixed success, `training.grpo.sampler`), step_time…);
- every `trace_every` steps → one full episode of the current model → `transcripts.jsonl`;
- every `eval_every` steps (and at the end; at the start unless an earlier phase already measured this model)
  → `eval_episodes` greedy episodes on the train and on the eval split → `evals.jsonl` (an eval that raises writes
  its line with `error` and no success: a crash is not a 0% eval, and the run goes on);
- every step → `status.json` progress (GRPO: `step`/`total_steps`; SFT: `phase_step`/`phase_total`), and a look
  at the stop flag: when set, training ends after the current step (`control.should_training_stop`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from transformers import TrainerCallback

from training.distributed import is_main, unwrap
from training.run.directory import now_iso
from training.run.recorder import RunRecorder, error_message
from training.run.schema import TRAINER_PHASES

__all__ = ["RunCallback"]

logger = logging.getLogger(__name__)

#: Seconds between two writes of the warm start's progress (`phase_step`) to status.json.
PROGRESS_EVERY_S = 0.5

#: Episodes per split of the eval before the warm start (see `RunCallback.on_train_begin`).
UNTRAINED_EVAL_EPISODES = 4

# TRL's end-of-training summary log: kept in status.json, not plotted as a metrics point.
_SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss")


class RunCallback(TrainerCallback):
    """Writes metrics, traces and evals of one training phase, and honours the stop flag (see module docstring).

    Args:
        recorder: the run's writer.
        plan: the run's `training.plan.RunPlan`: its config (splits, budgets, eval size) and its environments.
        tokenizer: the model's tokenizer (for traces and evals).
        stop_event: a `threading.Event`; when set, training stops after the current step.
        phase: `"grpo"` (default) or `"sft"`; it picks the cadences from the config (`eval_every`/`trace_every`
            for GRPO, `sft.eval_every` for both in SFT) and is written on every line.
        evaluate_at_start: also evaluate before the first step (default True). False when an earlier phase
            ended with an eval of this very model (GRPO after SFT), or when the phase resumes from a checkpoint.
        last_eval_step: the step of this phase's last eval already recorded (a resumed phase), so the end-of-phase
            eval is not repeated at that step (default None).

    A stop also asks the trainer to save a checkpoint at that step (when it saves checkpoints at all), so a stopped
    run resumes exactly where it stopped.
    """

    def __init__(self, recorder: RunRecorder, plan: Any, tokenizer: Any,
                 stop_event: threading.Event | None = None, *, phase: str = "grpo", evaluate_at_start: bool = True,
                 last_eval_step: int | None = None):
        if phase not in TRAINER_PHASES:
            raise ValueError(f"unknown phase {phase!r}; expected one of {TRAINER_PHASES}")
        self.recorder = recorder
        self.plan = plan
        self.config = config = plan.config
        self.tokenizer = tokenizer
        self.stop_event = stop_event
        self.phase = phase
        self.evaluate_at_start = evaluate_at_start
        if phase == "sft":
            self.eval_every = self.trace_every = config.resolved_sft().eval_every
        else:
            self.eval_every, self.trace_every = config.eval_every, config.trace_every
        self.stopped = False
        self._last_step_end: float | None = None
        self._last_progress = float("-inf")
        self._last_eval_step: int | None = last_eval_step
        self._envs: dict[str, list[Any]] = {}

    # ------------------------------------------------------------------------------- trainer events
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._last_step_end = time.perf_counter()
        if self.phase == "grpo":
            self.recorder.status(phase="grpo", step=0, total_steps=state.max_steps, grpo_started_at=now_iso())
        else:
            self.recorder.status(phase="sft", phase_step=0, phase_total=state.max_steps, sft_started_at=now_iso())
        if is_main(state) and self.evaluate_at_start and self._last_eval_step is None:
            self.evaluate_start(model)
        return control

    def evaluate_start(self, model: Any) -> None:
        """The eval at step 0 (when `eval_every` > 0), also callable before the trainer exists: SFT's comes before
        its episodes are prepared, so the success chart starts seconds after the model loads. An untrained model
        babbles until the step budget runs out, the slowest episodes there are: in SFT a few show its 0% where a
        full eval would hold the run up for a minute."""
        if self.eval_every <= 0:
            return
        n = min(self.config.eval_episodes, UNTRAINED_EVAL_EPISODES) if self.phase == "sft" else None
        self._evaluate(model, 0, n)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        now = time.perf_counter()
        wall = now - self._last_step_end if self._last_step_end is not None else None
        self._last_step_end = now
        if self.phase == "grpo":
            self.recorder.status(step=step, total_steps=state.max_steps, last_step_seconds=wall)
        elif now - self._last_progress >= PROGRESS_EVERY_S or step >= state.max_steps:
            # SFT steps take tens of milliseconds: its progress is written (and sent to the page) twice a second.
            self._last_progress = now
            self.recorder.status(phase_step=step, phase_total=state.max_steps)
        if self.stop_event is not None and self.stop_event.is_set():
            self._stop(args, control)
            return control
        if is_main(state):
            if self.trace_every > 0 and step % self.trace_every == 0:
                self._trace(model, step)
            if self.eval_every > 0 and step % self.eval_every == 0:
                self._evaluate(model, step)
        self._last_step_end = time.perf_counter()  # evals and traces are not part of the next step's time
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The trainer logs after on_step_end and checks the flag after logging: a stop requested meanwhile
        # (e.g. by a listener reacting to this very log) still ends training at this step.
        if self.stop_event is not None and self.stop_event.is_set() and not self.stopped:
            self._stop(args, control)
        if not logs or not is_main(state):
            return control
        if any(key in logs for key in _SUMMARY_KEYS):
            summary = {k: v for k, v in logs.items() if _is_number(v)}
            self.recorder.status(**{"train_summary" if self.phase == "grpo" else f"{self.phase}_summary": summary})
            return control
        record = {k: (v if not isinstance(v, float) or math.isfinite(v) else None)
                  for k, v in logs.items() if _is_number(v) or v is None}
        if self.phase == "grpo" and "health/sampled_entropy" not in record and record.get("entropy") is not None:
            # TRL's tool loop decodes with `generate`, which reports no entropy: TRL's own (over the completions in
            # the loss) stands in for the batched decoder's figure.
            record["health/sampled_entropy"] = record["entropy"]
        record["phase"] = self.phase
        record["step"] = state.global_step
        record["time"] = time.time()
        self.recorder.append("metrics", record)
        if self.stop_event is not None and self.stop_event.is_set():
            self._stop(args, control)
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # GRPO always ends with an eval (`eval_every` 0 = only then); SFT only when it evaluates at all.
        wanted = self.phase == "grpo" or self.eval_every > 0
        if is_main(state) and not self.stopped and wanted and self._last_eval_step != state.global_step:
            self._evaluate(model, state.global_step)
        self.close()
        return control

    # ------------------------------------------------------------------------------------ helpers
    def _stop(self, args, control) -> None:
        self.stopped = True
        control.should_training_stop = True
        if getattr(args, "save_strategy", "no") != "no":  # SaveStrategy is a str enum
            control.should_save = True  # a checkpoint at the stop step: resume continues from exactly here

    def _env_list(self, split: str, n: int) -> list[Any]:
        envs = self._envs.setdefault(split, [])
        while len(envs) < n:
            envs.append(self.plan.environment(split))
        return envs[:n]

    def _play(self, model: Any, split: str, n: int, seed: int):
        from training.generation.model_policy import evaluate_model

        return evaluate_model(
            unwrap(model), self.tokenizer, n_episodes=n, seed=seed, name="model",
            max_turn_tokens=self.config.max_turn_tokens, enable_thinking=self.config.enable_thinking,
            envs=self._env_list(split, n), prompt=self.config.prompt, precision=self.plan.precision,
        )

    def _trace(self, model: Any, step: int) -> None:
        try:
            split = self.config.train_split
            result = self._play(model, split, 1, seed=self.config.seed + 1000 + step)
            transcript = result.episodes[0]
            transcript["policy"] = f"model@{self.phase}-{step}"
            self.recorder.append("transcripts", {"step": step, "phase": self.phase, "time": time.time(),
                                                 "split": split, "transcript": transcript})
        except Exception:  # noqa: BLE001 - a failed trace must not end the run
            logger.exception("trace at step %s failed", step)

    def _evaluate(self, model: Any, step: int, n: int | None = None) -> None:
        self._last_eval_step = step
        n = self.config.eval_episodes if n is None else n
        if n <= 0:
            return
        for split in dict.fromkeys((self.config.train_split, self.config.eval_split)):
            try:
                # Same seeds at every eval: the curve compares the same questions over time.
                result = self._play(model, split, n, seed=self.config.seed)
                self.recorder.append("evals", {
                    "step": step, "phase": self.phase, "split": split, "success_rate": result.success_rate,
                    "avg_reward": result.avg_reward, "avg_steps": result.avg_steps,
                    "explore_rate": result.explore_rate, "execution_accuracy": result.execution_accuracy,
                    "n_episodes": result.n_episodes, "breakdown": result.breakdown(), "time": time.time(),
                })
            except Exception as exc:  # noqa: BLE001 - recorded as a failed eval, not as failed episodes
                logger.exception("eval on %s at step %s failed", split, step)
                self.recorder.append("evals", {"step": step, "phase": self.phase, "split": split,
                                               "error": error_message(exc), "time": time.time()})

    def close(self) -> None:
        for envs in self._envs.values():
            for env in envs:
                env.close()
        self._envs.clear()


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
