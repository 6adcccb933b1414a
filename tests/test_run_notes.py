"""What Runs and Compare say beside a run's figures, from real run directories: which weights the run kept and why
(status.json's `keep_best`, the comparison summary's `trained_weights`), and a final comparison that failed (an
error, not a 0% column)."""

from __future__ import annotations

import re

from dashboard.core.run_data import RunCache
from dashboard.core.run_notes import comparison_error_html, kept_html
from dashboard.runs.detail import detail_header
from health_records import write_grpo_run
from training.run.recorder import RunRecorder
from training.run.kept_weights import kept_weights
from training.run.directory import RunDir, now_iso


def _run(tmp_path, name: str, *, status: str = "completed", **fields) -> RunDir:
    run = RunDir.create(tmp_path, name)
    run.write_config({"model": "builtin:tiny", "dataset": "builtin", "max_steps": 20})
    run.write_status(status, started_at=now_iso(), phase="grpo", step=20, total_steps=20, **fields)
    write_grpo_run(run, collapse=False)
    return run


KEEP_START = {"metric_for_best_model": "validation_success", "best_step": 0, "best_metric": 0.45,
              "start_metric": 0.45, "last_step": 20, "last_metric": 0.25, "kept": "start",
              "reason": "GRPO did not beat the warm start on validation: the warm start is kept"}
KEEP_BEST = {**KEEP_START, "best_step": 10, "best_metric": 0.55, "last_metric": 0.5, "kept": "best",
             "reason": "step 10 scored best on validation"}


def test_runs_and_compare_say_which_weights_were_kept_and_why(tmp_path):
    _run(tmp_path, "start", keep_best=KEEP_START)
    run = _run(tmp_path, "best", keep_best=KEEP_BEST)
    RunRecorder(run).append("comparison", {"kind": "summary", "n_episodes": 2, "trained_weights": {
        "step": 10, "kept": "best", "reason": "step 10 scored best on validation"}})
    _run(tmp_path, "running", status="running", keep_best=KEEP_BEST)
    cache = RunCache(tmp_path)

    header = re.sub(r"<[^>]+>", "", detail_header(cache.snapshot("start")))
    assert ("Kept the start (step 0) — GRPO did not beat the warm start on validation: the warm start is kept. "
            "Validation success: 45% at the start, last 25% at step 20.") in header
    header = detail_header(cache.snapshot("best"))
    assert 'data-kept="best" data-kept-step="10"' in header
    assert ("Kept step 10, the best on validation — step 10 scored best on validation. The final comparison's "
            "trained model plays these weights.") in re.sub(r"<[^>]+>", "", header)
    note = kept_html(cache.snapshot("best"), "compare-kept")
    assert note.startswith('<div id="compare-kept"') and "Kept step 10" in note
    # While the run trains, keep_best's choice is the one so far.
    assert ("So far keep_best keeps step 10, the best on validation — step 10 scored best on validation. Validation "
            "success: 45% at the start, best 55% at step 10, last 50% at step 20.") in kept_html(
        cache.snapshot("running"), "x")
    # A run without a validation panel has no keep_best: nothing is said.
    _run(tmp_path, "plain")
    assert kept_html(cache.snapshot("plain"), "x") == ""


def test_kept_weights_reads_odd_records_as_nothing():
    for record in (None, [], {}, {"kept": "somewhere"}, {"kept": 3}, "start"):
        assert kept_weights(record) is None
    odd = kept_weights({"kept": "best", "best_step": "ten", "reason": 7, "start_metric": "x"})
    assert odd is not None and odd.step is None and odd.text() == "Kept its step, the best on validation."


def test_a_failed_comparison_is_an_error_on_compare(tmp_path):
    run = _run(tmp_path, "r1", status="failed", error="RuntimeError: CUDA out of memory")
    RunRecorder(run).append("comparison", {"kind": "error", "error": "RuntimeError: CUDA out of memory"})
    snap = RunCache(tmp_path).snapshot("r1")
    assert snap.pairs == [] and snap.summary is None
    note = comparison_error_html(snap)
    assert 'id="compare-error"' in note and "The final comparison failed: RuntimeError: CUDA out of memory" in note
