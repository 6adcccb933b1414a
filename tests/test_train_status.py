"""The Train tab's status bar and live charts, built from real run directories (no browser): which phase runs and
how far, the remaining time, readable chart axes per phase, labelled eval sizes; and the prepare hint for a known
dataset that is not prepared yet."""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path

import pytest

from dashboard.core import charts
from dashboard.core.run_data import RunCache
from dashboard.train.model_picker import model_choices
from dashboard.train.status import planned_phases, status_html
from training.config import TrainConfig
from training.run.directory import RunDir, now_iso

REPO = Path(__file__).resolve().parent.parent
TINY = TrainConfig.from_json(REPO / "configs" / "tiny_cpu.json").resolved().to_dict()  # SFT, base eval, GRPO, final eval


def _planned(tmp_path, **fields) -> list[dict]:
    """status.json's `phases` as `training.train` writes them for a run of TINY with `fields` changed (the plan of
    a real run: `training.phases.planned_phases` over its resolved RunPlan)."""
    from training.run.recorder import RunRecorder
    from training.phases import RunState, planned_phases
    from training.plan import RunPlan

    plan = RunPlan.resolve(TrainConfig.from_dict({**TINY, "output_dir": str(tmp_path / "plan"), **fields}))
    run = RunDir(plan.run_dir)
    return planned_phases(RunState(plan, run, RunRecorder(run, is_main=False)))


def _run(tmp_path, **status):
    run = RunDir.create(tmp_path, "r1")
    run.write_config(TINY)
    run.write_status("running", started_at=now_iso(), step=0, total_steps=TINY["max_steps"],
                     phases=_planned(tmp_path), **status)
    return run


def _bar(tmp_path) -> str:
    return status_html(RunCache(tmp_path).snapshot("r1"), None)


def _phase_states(bar: str) -> dict[str, str]:
    return dict(re.findall(r'data-phase="([^"]+)" data-state="(\w+)"', bar.split('id="train-phases"', 1)[1]))


def test_the_phases_of_a_run_are_listed_with_their_sizes(tmp_path):
    """The run records its plan (the phases it will play, with their sizes) and the status bar lists it: the
    dashboard reads the trainer's own decision, never a guess from the config."""
    phases = planned_phases({"phases": _planned(tmp_path)})
    assert [name for name, _ in phases] == ["loading model", "sft", "base eval", "grpo", "comparison"]
    labels = dict(phases)
    assert labels["sft"] == "warm start (SFT, 5000 steps)" and labels["grpo"] == "GRPO (40 steps)"
    assert labels["base eval"] == "base eval (200 episodes)" and labels["comparison"] == "final eval (200 episodes)"
    # A pretrained model warm-started plays its zero-shot eval first; without evals there are none to show.
    smol = _planned(tmp_path, model="smollm2-135m", sft={"enabled": True}, compare_base=True, comparison_episodes=30,
                    zero_shot_episodes=10)
    assert dict(planned_phases({"phases": smol}))["zero-shot eval"] == "zero-shot eval (10 episodes)"
    bare = {"phases": _planned(tmp_path, sft={"enabled": False}, comparison_episodes=0)}
    assert [name for name, _ in planned_phases(bare)] == ["loading model", "grpo"]
    # A phase the plan does not list still shows, in run order; a run without its plan yet lists nothing.
    assert [n for n, _ in planned_phases(bare, "sft")] == ["loading model", "sft", "grpo"]
    assert planned_phases({}, "starting") == []


def test_every_phase_of_the_run_record_has_a_label_a_place_in_the_order_and_the_step_phases_a_panel():
    """The dashboard takes the phases and their order from `training.run.schema`: a phase added there is shown."""
    from dashboard.core.progress import PHASE_ORDER
    from dashboard.train.status import PHASE_LABELS
    from training.run.schema import PHASES, TRAINER_PHASES

    assert PHASE_ORDER == list(PHASES)
    assert set(PHASES) <= set(PHASE_LABELS)
    assert [phase for phase, _ in charts.PHASE_PANELS] == list(TRAINER_PHASES)


def test_the_status_bar_names_the_warm_start_not_grpo_step_0(tmp_path):
    run = _run(tmp_path, phase="sft", phase_step=1200, phase_total=5000, sft_started_at=now_iso())
    bar = _bar(tmp_path)
    assert "warm start (SFT) step <b>1200 / 5000</b>" in bar and "(phase 2 of 5)" in bar
    assert "GRPO step <b>0" not in bar
    assert _phase_states(bar) == {"loading model": "done", "sft": "current", "base eval": "todo", "grpo": "todo",
                                  "comparison": "todo"}
    assert 'style="width:24.0%"' in bar  # the bar fills with the warm start's own steps

    run.write_status(phase="base eval")
    bar = _bar(tmp_path)
    assert "<b>base eval (200 episodes)</b> (phase 3 of 5)" in bar
    assert _phase_states(bar)["sft"] == "done" and _phase_states(bar)["base eval"] == "current"

    run.write_status(phase="grpo", step=10, total_steps=40, grpo_started_at=now_iso())
    bar = _bar(tmp_path)
    assert "GRPO step <b>10 / 40</b> (phase 4 of 5)" in bar and 'style="width:25.0%"' in bar

    run.write_status("completed", phase="done", step=40, finished_at=now_iso())
    bar = _bar(tmp_path)
    assert set(_phase_states(bar).values()) == {"done"} and "remaining 0m 00s (done)" in bar


def test_a_run_that_did_not_complete_marks_where_it_ended(tmp_path):
    run = _run(tmp_path, phase="sft", phase_step=700, phase_total=5000, sft_started_at=now_iso())
    run.write_status("stopped", phase="done", finished_at=now_iso())  # what train.py writes after a stop
    bar = _bar(tmp_path)
    assert _phase_states(bar) == {"loading model": "done", "sft": "ended", "base eval": "todo", "grpo": "todo",
                                  "comparison": "todo"}
    assert "warm start (SFT, 5000 steps): stopped" in bar and "stopped in <b>warm start (SFT, 5000 steps)</b>" in bar
    # Stopped in GRPO: the short final eval still ran.
    run.write_status("stopped", step=12, grpo_started_at=now_iso())
    bar = _bar(tmp_path)
    assert _phase_states(bar)["grpo"] == "ended" and _phase_states(bar)["comparison"] == "done"
    assert "at GRPO step <b>12 / 40</b>" in bar
    run.write_status("failed", phase="failed", error="boom")
    assert "failed in <b>GRPO (40 steps)</b>" in _bar(tmp_path)


def test_remaining_time_says_what_it_knows_in_each_phase(tmp_path):
    # 100 s into a 5000-step warm start at step 1000: 400 s left in it; this config has no measurement, so the bar
    # names the phases after it instead of passing the warm start's time off as the run's. (configs/measured.json
    # measures builtin:tiny on builtin data; a model it has no entry for stands for an unmeasured config.)
    earlier = (dt.datetime.now() - dt.timedelta(seconds=100)).isoformat(timespec="seconds")
    run = _run(tmp_path, phase="sft", phase_step=1000, phase_total=5000)
    run.write_config({**TINY, "model": "runs/models/never-measured"})
    run.write_status(phase_started_at=earlier)
    bar = _bar(tmp_path)
    assert re.search(r"remaining 6m 4\ds in this phase, then 3 more phases not timed for this config", bar), bar
    run.write_status(phase="base eval")
    assert "remaining not timed for this config (this phase, then 2 more phases)" in _bar(tmp_path)
    run.write_status(phase="grpo", step=0, total_steps=40)
    assert "remaining estimating from this phase's first steps…" in _bar(tmp_path)
    run.write_status("stopped", phase="done", finished_at=now_iso())
    assert "remaining — (ended)" in _bar(tmp_path)


def test_model_picker_labels_are_short():
    """The picker's entries fit its box (the browser test measures them): name · size · device, the rest in the
    field's help."""
    labels = dict((value, label) for label, value in model_choices())
    assert labels["builtin:tiny"] == "builtin:tiny · 0.66M · CPU"
    assert all(len(label) <= 28 and label.startswith(value) for value, label in labels.items())


# ------------------------------------------------------------------------------------------------- charts
def _warm_then_grpo(t0: float) -> list[dict]:
    """A run's metrics: a 5000-step warm start over 50 minutes (loss 8 → 0.03), then 40 GRPO steps in 5 minutes."""
    metrics = [{"phase": "sft", "step": s, "loss": 8.0 * (0.03 / 8.0) ** (s / 5000), "mean_token_accuracy": s / 5000,
                "time": t0 + 0.6 * s} for s in range(50, 5001, 50)]
    metrics += [{"phase": "grpo", "step": s, "reward": 0.1 + s / 100, "reward_std": 0.05,
                 "rewards/reward_correctness/mean": s / 50, "tools/call_frequency": 2.0,
                 "tools/failure_frequency": 0.1, "time": t0 + 3000 + 7.5 * s} for s in range(1, 41)]
    return metrics


def test_learning_signal_has_a_step_axis_per_phase_and_readable_log_ticks():
    fig = charts.reward_figure(_warm_then_grpo(1000.0), t0=1000.0)
    layout = fig["layout"]
    by_name = {t["name"]: t for t in fig["data"]}
    # The warm start and GRPO each on their own step axis: GRPO's 40 steps fill their panel.
    assert by_name["SFT loss"]["xaxis"] == "x" and by_name["reward (mean)"]["xaxis"] == "x2"
    assert layout["xaxis"]["title"]["text"] == "warm start (SFT) step"
    assert layout["xaxis2"]["title"]["text"] == "GRPO step"
    assert by_name["reward (mean)"]["x"] == list(range(1, 41))
    assert layout["xaxis"]["domain"][1] < layout["xaxis2"]["domain"][0]
    # The log axis: explicit ticks whose labels read as the numbers they are, in order.
    loss_axis = layout["yaxis" if by_name["SFT loss"]["yaxis"] == "y" else "yaxis" + by_name["SFT loss"]["yaxis"][1:]]
    assert loss_axis["type"] == "log" and loss_axis["tickmode"] == "array"
    assert [float(t) for t in loss_axis["ticktext"]] == loss_axis["tickvals"] == sorted(loss_axis["tickvals"])
    assert loss_axis["tickvals"] == [0.01, 0.1, 1.0, 10.0]  # 8 → 0.03 spans over two decades: decades only
    assert math.log10(min(by_name["SFT loss"]["y"])) >= loss_axis["range"][0]
    # Each point's hover still says when it was logged.
    assert by_name["reward (mean)"]["customdata"][0][0] == pytest.approx(50.125)
    go = pytest.importorskip("plotly.graph_objects")
    go.Figure(fig)  # valid plotly JSON


def test_log_ticks_within_two_decades_use_1_2_5():
    assert charts.log_ticks([0.3, 4.0]) == ([0.2, 0.5, 1.0, 2.0, 5.0], ["0.2", "0.5", "1", "2", "5"])
    assert charts.log_ticks([2.0, 2.0]) == ([2.0, 5.0], ["2", "5"])  # one value: still a scale
    assert charts.log_ticks([]) == ([], [])


def test_the_legend_sits_below_the_x_axis_titles():
    """Plotly puts an x-axis title about 45 px under the plot (tick labels, then the title); the legend's top must
    start lower, inside the bottom margin, for every Train-tab chart."""
    for fig in (charts.reward_figure(_warm_then_grpo(0.0)), charts.tool_health_figure(_warm_then_grpo(0.0)),
                charts.success_figure([{"phase": "grpo", "step": 5, "split": "eval", "success_rate": 0.5}])):
        layout = fig["layout"]
        plot_height = layout["height"] - layout["margin"]["t"] - layout["margin"]["b"]
        legend_top = -layout["legend"]["y"] * plot_height
        assert layout["legend"]["yanchor"] == "top" and legend_top >= 55
        # The margin holds the rows it is meant to (a legend of more grows the figure: test_dashboard_parts).
        assert layout["margin"]["b"] - legend_top >= charts.LEGEND_ROW_PX * charts.LEGEND_ROWS_IN_MARGIN


def test_success_chart_labels_each_split_with_its_eval_size():
    evals = [{"phase": "sft", "step": 0, "split": "eval", "success_rate": 0.0, "n_episodes": 4},
             {"phase": "sft", "step": 1000, "split": "eval", "success_rate": 0.3, "n_episodes": 32},
             {"phase": "grpo", "step": 5, "split": "eval", "success_rate": 0.4, "n_episodes": 32},
             {"phase": "grpo", "step": 5, "split": "train", "success_rate": 0.5, "n_episodes": 32}]
    fig = charts.success_figure(evals)
    shown = [t["name"] for t in fig["data"] if t["showlegend"]]
    assert shown == ["eval split (4–32 episodes)", "train split (32 episodes)"]
    # One legend entry per split across both panels; the hover gives each point's own size.
    assert [t["xaxis"] for t in fig["data"] if t["name"].startswith("eval split")] == ["x", "x2"]
    assert fig["data"][0]["customdata"][0][1] == 4 and "episodes" in fig["data"][0]["hovertemplate"]
    assert charts.eval_sizes([{"n_episodes": 32}] * 3) == "32" and charts.eval_sizes([{}]) == ""


def test_health_chart_panels_keep_the_calls_axis_on_grpo():
    fig = charts.tool_health_figure(_warm_then_grpo(0.0))
    calls = next(t for t in fig["data"] if t["name"].startswith("tool calls"))
    axis = fig["layout"]["yaxis" + calls["yaxis"][1:]]
    assert calls["xaxis"] == "x2" and axis["side"] == "right" and axis["anchor"] == "x2"
    only_grpo = charts.tool_health_figure([m for m in _warm_then_grpo(0.0) if m["phase"] == "grpo"])
    assert {t["xaxis"] for t in only_grpo["data"]} == {"x"}
    assert only_grpo["layout"]["xaxis"]["title"]["text"] == "GRPO step"


# ------------------------------------------------------------------------------------------ prepare hint
def test_an_unprepared_known_dataset_names_the_command_that_prepares_it(tmp_path):
    from dashboard.access.inputs import InputRefused, dataset_source
    from sqlenv.data.datasets import DatasetNotFoundError, resolve_dataset
    from training.plan import check_config

    with pytest.raises(DatasetNotFoundError) as err:
        resolve_dataset("spider_dev", tmp_path)
    assert "python -m sqlenv data prepare spider --preset spider_dev" in str(err.value)
    assert f"--out {tmp_path / 'spider_dev'}" in str(err.value)  # a data folder other than the default: said
    with pytest.raises(ValueError, match="data prepare spider --preset spider10"):  # the training config's check
        check_config(TrainConfig(dataset="spider10", data_dir=str(tmp_path)))
    with pytest.raises(InputRefused, match="data prepare spider --preset spider_dev"):  # the app's pages
        dataset_source("spider_dev", tmp_path)
    with pytest.raises(DatasetNotFoundError) as err:  # a name nothing prepares: no hint
        resolve_dataset("nope", tmp_path)
    assert "data prepare" not in str(err.value)
