"""The dashboard's parts without a browser: chart builders, transcript HTML, run reading, the runner.

Fast checks of the pure pieces on real run directories (written with `RunDir`), plus the runner driving the
real training entry point into a clear failure.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from dashboard.core import charts
from dashboard.core.progress import progress
from dashboard.core.run_data import RunCache
from dashboard.core.runner import ConfigInvalid, RunnerBusy, TrainingRunner, build_config
from dashboard.core.transcripts import transcript_html
from training.run.directory import RunDir, now_iso

STEP = {"step": 1, "action_type": "QUERY", "argument": "SELECT '<b>x</b>'", "observation": "<script>x</script>",
        "error": "", "reward": 0.16, "layers": {"operational": 0.01, "progress": 0.15, "terminal": 0.0, "total": 0.16},
        "budget_remaining": 9, "done": False}
TRANSCRIPT = {"question_id": "q1", "question": "How many?", "database": "db", "difficulty": "easy",
              "answer_type": "integer", "gold_sql": "SELECT 1", "gold_answer": 4, "policy": "random", "seed": 0,
              "steps": [STEP], "answer": "7", "correct": False, "outcome": "wrong_answer", "total_reward": 0.16,
              "reward_breakdown": {"operational": 0.01, "progress": 0.15, "correctness": 0.0, "total": 0.16},
              "n_steps": 1}


def test_reward_chart_has_mean_band_and_each_component():
    metrics = [{"step": s, "reward": 0.1 * s, "reward_std": 0.05, "rewards/reward_correctness/mean": 0.0,
                "rewards/reward_progress/mean": 0.2} for s in (1, 2, 3)]
    metrics.append({"step": 4, "reward": float("nan")})  # skipped, not a crash
    metrics.append({"step": "x", "reward": "junk"})
    fig = charts.reward_figure(metrics)
    names = [t["name"] for t in fig["data"]]
    assert names == ["± std", "reward (mean)", "correctness", "progress"]
    assert fig["data"][1]["y"] == pytest.approx([0.1, 0.2, 0.3])
    assert charts.last_step(metrics) == 4
    go = pytest.importorskip("plotly.graph_objects")
    go.Figure(fig)  # valid plotly JSON (plotly validates every property)
    assert json.loads(charts.plot_data(fig).plot)["data"][1]["name"] == "reward (mean)"


def test_success_and_tool_health_charts():
    evals = [{"step": 5, "split": "train", "success_rate": 0.5}, {"step": 5, "split": "eval", "success_rate": 0.25}]
    fig = charts.success_figure(evals)
    assert {t["name"] for t in fig["data"]} == {"train split", "eval split"}
    health = charts.tool_health_figure([{"step": 1, "tools/call_frequency": 2.5, "tools/failure_frequency": 0.1,
                                         "completions/clipped_ratio": 0.0, "frac_reward_zero_std": 0.5}])
    assert len(health["data"]) == 4 and health["data"][0]["yaxis"] == "y2"
    empty = charts.reward_figure([])  # empty run: an empty chart with a note
    assert not empty["data"] and empty["layout"]["annotations"]


def test_a_legend_of_many_rows_grows_the_figure_not_into_the_axis_titles():
    """The legend is not allowed to push the margin (that shrinks the plot and pulls the legend up into the
    x-axis titles): a legend of more rows than the margin holds makes the figure taller, the plot area unchanged."""
    evals = [{"step": s, "split": split, "success_rate": 0.5, "n_episodes": n, "explore_rate": 0.5}
             for s in (0, 2) for split, n in (("train", 2), ("eval", 2), ("validation", 64))]
    few = charts.success_figure([{"step": 0, "split": "train", "success_rate": 0.5}])["layout"]
    many = charts.success_figure(evals)["layout"]
    assert few["margin"]["autoexpand"] is False and many["margin"]["autoexpand"] is False
    rows = charts.legend_rows(charts.success_figure(evals)["data"])
    assert rows > charts.LEGEND_ROWS_IN_MARGIN  # four long entries: a row each in a ~300 px chart
    assert few["height"] == charts.CHART_HEIGHT
    assert many["height"] == charts.CHART_HEIGHT + (rows - charts.LEGEND_ROWS_IN_MARGIN) * charts.LEGEND_ROW_PX
    assert many["height"] - many["margin"]["b"] == few["height"] - few["margin"]["b"]  # the same plot area


def test_train_tab_charts_during_the_warm_start(tmp_path):
    """While SFT runs (before any GRPO step) every Train-tab chart already has data, on one minutes timeline; once
    GRPO logs, its reward joins the SFT loss, after a 'GRPO' marker."""
    from dashboard.train.status import status_html

    run = RunDir.create(tmp_path, "warm")
    run.write_status("running", started_at=now_iso(), phase="sft", phase_step=20, phase_total=5000, step=0,
                     total_steps=20)
    t0 = RunCache(tmp_path).snapshot("warm").t0
    for step in (10, 20):
        run.append("metrics", {"phase": "sft", "step": step, "loss": 7.0 / step, "mean_token_accuracy": step / 100,
                               "learning_rate": 1e-3, "time": t0 + 3 * step})
    for split in ("train", "eval"):
        run.append("evals", {"phase": "sft", "step": 0, "split": split, "success_rate": 0.0, "explore_rate": 0.0,
                             "time": t0 + 5})
    snap = RunCache(tmp_path).snapshot("warm")
    learning = charts.reward_figure(snap.metrics, t0=snap.t0)
    assert [t["name"] for t in learning["data"]] == ["SFT loss"]
    # Each phase on its own step axis (the hover keeps the minutes since the start).
    assert learning["data"][0]["x"] == [10, 20] and learning["layout"]["yaxis"]["type"] == "log"
    assert [c[0] for c in learning["data"][0]["customdata"]] == pytest.approx([0.5, 1.0])
    assert learning["layout"]["xaxis"]["title"]["text"] == "warm start (SFT) step"
    success = charts.success_figure(snap.evals, t0=snap.t0)
    assert {t["name"] for t in success["data"]} == {"train split", "eval split", "eval: looked before answering"}
    health = charts.tool_health_figure(snap.metrics, t0=snap.t0)
    assert [t["name"] for t in health["data"]] == ["SFT token accuracy"]
    bar = status_html(snap, None)
    assert "warm start (SFT) step <b>20 / 5000</b>" in bar and 'data-plotted-phase="sft"' in bar

    run.append("metrics", {"phase": "grpo", "step": 1, "reward": 0.2, "reward_std": 0.1,
                           "rewards/reward_correctness/mean": 0.1, "tools/call_frequency": 1.5, "time": t0 + 120})
    snap = RunCache(tmp_path).snapshot("warm")
    learning = charts.reward_figure(snap.metrics, t0=snap.t0)
    reward = next(t for t in learning["data"] if t["name"] == "reward (mean)")
    assert reward["xaxis"] == "x2" and learning["layout"]["xaxis2"]["title"]["text"] == "GRPO step"
    assert reward["customdata"][0][0] == pytest.approx(2.0)  # GRPO's first step at minute 2
    go = pytest.importorskip("plotly.graph_objects")
    for fig in (learning, success, charts.tool_health_figure(snap.metrics, t0=snap.t0)):
        go.Figure(fig)


def test_transcript_html_escapes_and_shows_layers_and_verdict():
    page = transcript_html(TRANSCRIPT, title="Random baseline")
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "prog +0.150" in page and "wrong answer" in page and "SELECT 1" in page
    assert "no transcript" in transcript_html(None)
    assert "sqe-ex" not in page  # a transcript from before EX: nothing claimed
    assert 'data-ex="true"' in transcript_html({**TRANSCRIPT, "execution_match": True})
    assert 'data-ex="false"' in transcript_html({**TRANSCRIPT, "execution_match": False})


def test_run_cache_refuses_names_outside_runs(tmp_path):
    cache = RunCache(tmp_path / "runs")
    (tmp_path / "runs").mkdir()
    (tmp_path / "secret").mkdir()
    for name in ("../secret", "/etc", "..", "a/../../secret"):
        snap, err = cache.try_snapshot(name)
        assert snap is None and "Refused" in err


def test_run_cache_reads_half_written_runs_and_rereads_on_change(tmp_path):
    run = RunDir.create(tmp_path, "r1")
    run.write_status("running", started_at=now_iso(), step=2, total_steps=10)
    run.append("metrics", {"step": 1, "reward": 0.5})
    with open(run.file("metrics.jsonl"), "a") as f:
        f.write('{"step": 2, "rew')  # torn last line
    cache = RunCache(tmp_path)
    snap = cache.snapshot("r1")
    assert [m["step"] for m in snap.metrics] == [1] and snap.config is None and "config.json" in snap.config_error
    assert cache.snapshot("r1") is snap  # unchanged files: cached
    time.sleep(0.01)
    with open(run.file("metrics.jsonl"), "a") as f:
        f.write('ard": 0.7}\n')
    assert [m["step"] for m in cache.snapshot("r1").metrics] == [1, 2]
    p = progress(snap.status)
    assert p["step"] == 2 and p["total"] == 10 and p["elapsed"] is not None


def test_build_config_names_the_field():
    with pytest.raises(ConfigInvalid) as err:
        build_config({"num_generations": 1})
    assert err.value.field == "num_generations"
    with pytest.raises(ConfigInvalid) as err:
        build_config({"no_such_field": 1})
    assert err.value.field == "no_such_field"


def test_runner_refuses_a_second_run_and_stops_the_first(tmp_path):
    started = threading.Event()

    def train_until_stopped(config, stop_event=None, listener=None):
        run = RunDir(config.output_dir)
        run.write_status("running", started_at=now_iso())
        started.set()
        stop_event.wait(30)
        run.write_status("stopped", finished_at=now_iso())

    runner = TrainingRunner(tmp_path, train_fn=train_until_stopped)
    run_id = runner.start(build_config({"max_steps": 3}))
    assert started.wait(10)
    with pytest.raises(RunnerBusy, match=run_id):
        runner.start(build_config({"max_steps": 3}))
    assert "Stopping" in runner.stop()
    assert runner.join(10)
    assert json.loads((tmp_path / run_id / "status.json").read_text())["status"] == "stopped"
    assert runner.active_run_id is None and runner.current_run_id == run_id


def test_start_right_after_a_run_says_it_ended_waits_for_its_process_instead_of_refusing(tmp_path):
    # A training process writes "completed" and then takes a moment to exit; a Start pressed in that moment (the
    # page already shows the run finished) starts the next run once the last one is gone, instead of RunnerBusy.
    ended = threading.Event()

    def train_then_exit_slowly(config, stop_event=None, listener=None):
        run = RunDir(config.output_dir)
        run.write_status("completed", started_at=now_iso(), finished_at=now_iso())
        ended.set()
        time.sleep(1.5)

    runner = TrainingRunner(tmp_path, train_fn=train_then_exit_slowly)
    first = runner.start(build_config({"max_steps": 3}))
    assert ended.wait(10) and runner.is_running
    second = runner.start(build_config({"max_steps": 3}))
    assert second != first
    assert runner.join(10)


@pytest.mark.slow
def test_runner_marks_an_unloadable_model_failed_and_keeps_going(tmp_path):
    runner = TrainingRunner(tmp_path)  # the real training entry point
    run_id = runner.start(build_config({"model": str(tmp_path / "no-such-model"), "max_steps": 2, "sft": False}))
    assert runner.join(120)
    status = json.loads((tmp_path / run_id / "status.json").read_text())
    assert status["status"] == "failed"
    assert "no-such-model" in status["error"] and "no-such-model" in runner.last_error
    # The runner is free again.
    second = runner.start(build_config({"model": str(tmp_path / "still-missing"), "max_steps": 2, "sft": False}))
    assert second != run_id and runner.join(120)


def test_advanced_form_values_and_refusals():
    from dashboard.train.form import advanced_values

    assert advanced_values(False, 16, 32, "") == {}
    values = advanced_values(True, 8, None, '{"grpo": {"loss_type": "dr_grpo"}, "save_steps": 5}')
    assert values == {"grpo": {"loss_type": "dr_grpo"}, "save_steps": 5, "lora": {"r": 8, "alpha": 16.0}}
    config = build_config({**values, "device": "cpu"})
    assert config.grpo == {"loss_type": "dr_grpo"} and config.resolved_lora()["r"] == 8
    for text, field in (("{not json", "advanced"), ("[1]", "advanced"), ('{"output_dir": "/etc"}', "output_dir"),
                        ('{"data_dir": "/"}', "data_dir")):
        with pytest.raises(ConfigInvalid) as err:
            advanced_values(False, 16, 32, text)
        assert err.value.field == field
    with pytest.raises(ConfigInvalid) as err:  # TrainConfig names the nearest GRPOConfig field
        build_config(advanced_values(False, 16, 32, '{"grpo": {"loss_typ": "x"}}'))
    assert err.value.field == "grpo" and "loss_type" in str(err.value)


def test_a_dead_run_reads_interrupted_in_the_dashboard(tmp_path):
    import subprocess
    import sys

    from training.run.directory import this_host

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = RunDir.create(tmp_path, "crashed")
    run.write_config({"model": "builtin:tiny", "dataset": "builtin"})
    run.write_status("running", step=3, total_steps=10, started_at=now_iso(), pid=dead.pid, host=this_host(),
                     heartbeat_at=time.time())
    cache = RunCache(tmp_path)
    snap = cache.snapshot("crashed")
    assert snap.state == "interrupted" and "resume" in snap.status["error"]
    assert progress(snap.status)["remaining"] == 0.0
    assert cache.list()[0]["status"] == "interrupted"


@pytest.mark.slow
def test_runner_resumes_a_stopped_run(tmp_path):
    from training.train import run_training

    stop = threading.Event()
    # No validation panel and no KL probe (as `training_helpers.small_train_config`): the runner's resume is what is
    # checked here; a resumed run's panel and kept weights are tests/test_validation.py's and tests/test_resume.py's.
    config = build_config({"max_steps": 2, "num_generations": 2, "per_device_train_batch_size": 2, "step_budget": 2,
                           "max_completion_length": 64, "max_turn_tokens": 8, "sft": False, "compare_base": False,
                           "eval_every": 0, "trace_every": 0, "eval_episodes": 0, "comparison_episodes": 1,
                           "validation_questions": 0, "kl_probe_episodes": 0,
                           "plot_every": 1, "save_steps": 1, "device": "cpu", "cpu_threads": 1,
                           "output_dir": str(tmp_path / "stopped")})
    run_training(config, stop_event=stop, listener=lambda e, p: stop.set() if e == "metrics" else None)
    runner = TrainingRunner(tmp_path)
    with pytest.raises(ValueError, match="only stopped, failed or interrupted"):
        done = RunDir.create(tmp_path, "done")
        done.write_status("completed")
        runner.resume("done")
    with pytest.raises(ValueError):  # a name that would leave the runs folder
        runner.resume("../x")
    assert runner.resume("stopped") == "stopped"
    assert runner.join(300)
    status = json.loads((tmp_path / "stopped" / "status.json").read_text())
    assert status["status"] == "completed" and status["step"] == 2 and status["resumes"] == 1
    assert [m["step"] for m in RunDir(tmp_path / "stopped").read("metrics")] == [1, 2]
