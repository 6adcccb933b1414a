"""An eval that crashes is an error, never a 0% eval (issue 45): `evaluate_model` raises the batch's error, a
periodic eval writes its line with `error` and no success (the run goes on), and the final comparison writes an
error line (what Compare shows) before the run fails with it. The crash is injected into the real tiny model with a
forward pre-hook, as an out-of-memory error would come."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dashboard.core.run_data import RunCache
from dashboard.train.status import status_html
from training.callbacks import RunCallback
from training.run.recorder import ERROR_CHARS, RunRecorder, error_message
from training.config import TrainConfig
from training.run.directory import RunDir, now_iso
from training.run.listing import list_runs
from training.run.results import last_eval_measure

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

REPO = Path(__file__).resolve().parent.parent
CRASH = "CUDA out of memory (injected by the test)"


@pytest.fixture
def crashing(tiny):
    """The tiny model, whose every forward raises while the fixture lasts."""
    model, tokenizer = tiny

    def crash(module, args, kwargs):
        raise RuntimeError(CRASH)

    handle = model.register_forward_pre_hook(crash, with_kwargs=True)
    yield model, tokenizer
    handle.remove()


def _plan(tmp_path, **fields):
    from training.plan import RunPlan

    config = TrainConfig.from_json(REPO / "configs" / "tiny_cpu.json").with_overrides(
        {"output_dir": str(tmp_path / "run"), "eval_episodes": 2, "eval_every": 5, "comparison_episodes": 2,
         "step_budget": 3, "max_turn_tokens": 16, **fields})
    plan = RunPlan.resolve(config)
    return plan, RunDir.create(tmp_path, "run")


def test_evaluate_model_raises_the_batch_error(crashing):
    from training.generation.model_policy import evaluate_model

    model, tokenizer = crashing
    with pytest.raises(RuntimeError, match="out of memory"):
        evaluate_model(model, tokenizer, split="eval", n_episodes=2, step_budget=2, max_turn_tokens=8)


def test_a_periodic_eval_that_crashes_writes_an_error_line(crashing, tmp_path):
    model, tokenizer = crashing
    plan, run = _plan(tmp_path)
    callback = RunCallback(RunRecorder(run), plan, tokenizer)
    try:
        callback.evaluate_start(model)
    finally:
        callback.close()
    lines = run.read("evals")
    assert [line["split"] for line in lines] == ["train", "eval"]
    for line in lines:
        assert line["step"] == 0 and line["error"] == f"RuntimeError: {CRASH}"
        assert "success_rate" not in line and "n_episodes" not in line


def test_a_failed_eval_reads_as_an_error_not_as_the_last_success(tmp_path):
    run = RunDir.create(tmp_path, "r1")
    run.write_status("running", started_at=now_iso(), phase="grpo", step=20, total_steps=20)
    recorder = RunRecorder(run)
    recorder.append("evals", {"phase": "grpo", "step": 5, "split": "eval", "success_rate": 0.5, "n_episodes": 4,
                              "time": 0.0})
    for step in (10, 20):
        recorder.append("evals", {"phase": "grpo", "step": step, "split": "eval", "time": 0.0,
                                  "error": f"RuntimeError: {CRASH}"})
    bar = status_html(RunCache(tmp_path).snapshot("r1"), None)
    assert re.search(r'id="train-eval-error"[^>]*>The eval on the eval split at step 20 failed \(2 evals failed in '
                     rf"all\): RuntimeError: {re.escape(CRASH)}", bar)
    # The run's headline (Runs, `python -m training.runs list`) is the last eval that measured something.
    measured = last_eval_measure(run.read("evals"), "eval")
    assert measured.success == 0.5 and measured.model == "model at GRPO step 5"
    (row,) = list_runs(tmp_path)
    assert row["eval_success"] == 0.5 and row["final_success"] == 0.5


def test_a_comparison_that_crashes_is_recorded_as_an_error_and_raises(crashing, tmp_path):
    from training.evals import record_comparison

    model, tokenizer = crashing
    plan, run = _plan(tmp_path)
    with pytest.raises(RuntimeError, match="out of memory"):
        record_comparison(RunRecorder(run), model, tokenizer, plan, 2, None)
    (line,) = run.read("comparison")
    assert line["kind"] == "error" and line["error"] == f"RuntimeError: {CRASH}"


def test_error_messages_are_bounded():
    assert error_message(ValueError()) == "ValueError"
    long = error_message(RuntimeError("x" * 10_000))
    assert len(long) == ERROR_CHARS and long.startswith("RuntimeError: xxx") and long.endswith("…")
