"""The Compare tab's tables and added columns, the Runs table's EX: a real 2-step tiny-model run on spider10 (real
Spider data), a saved evaluation on the same questions, and a run written before EX existed."""

from __future__ import annotations

import json
import os

import pytest
from training_helpers import small_train_config

from dashboard.compare.added_columns import columns_for, source_choices
from dashboard.core.results import breakdown_frame, run_columns, summary_frame
from dashboard.core.run_data import RunCache
from dashboard.runs.detail import results_frame
from dashboard.runs.table import runs_table
from sqlenv.environment import SQLEnvironment
from sqlenv.evaluation.evaluate import evaluate
from sqlenv.evaluation.policies import OraclePolicy
from sqlenv.evaluation.saved import EVALUATIONS_FOLDER, save_evaluation
from training.run.directory import RunDir
from training.run.listing import list_runs

pytestmark = [pytest.mark.usefixtures("one_cpu_thread")]
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
N = 4  # comparison episodes


@pytest.fixture(scope="module")
def spider10_run(spider_source, tmp_path_factory):
    """(runs root, run id) of a finished 2-step tiny run on spider10, and an oracle evaluation saved beside it."""
    from sqlenv.data.spider import prepare_spider
    from training.train import run_training

    tmp = tmp_path_factory.mktemp("compare")
    info = prepare_spider(spider_source, tmp / "data" / "spider10", preset="spider10")
    runs = tmp / "runs"
    config = small_train_config(tmp, dataset=str(info.root), comparison_episodes=N, eval_every=1,
                                output_dir=str(runs / "tiny-spider10"))
    run_training(config)
    # The oracle on the run's eval questions: same split, seed and count as the run's comparison.
    with SQLEnvironment(info.questions_path("eval"), info.db_dir, step_budget=config.step_budget) as env:
        result = evaluate(env, OraclePolicy(), n_episodes=N, seed=config.seed)
    save_evaluation(result, runs / EVALUATIONS_FOLDER / "oracle-spider10", dataset=info.name, split="eval",
                    step_budget=config.step_budget, question_order="seeded")
    # An oracle on other questions only: nothing in common with the run.
    with SQLEnvironment(info.questions_path("train"), info.db_dir) as env:
        other = evaluate(env, OraclePolicy(), n_episodes=2, seed=0)
    save_evaluation(other, runs / EVALUATIONS_FOLDER / "oracle-train", dataset=info.name, split="train",
                    step_budget=config.step_budget, question_order="seeded")
    return runs, "tiny-spider10"


def test_the_tiny_spider10_run_shows_its_tables(spider10_run):
    runs_root, run_id = spider10_run
    cache = RunCache(runs_root)
    snap = cache.snapshot(run_id)
    summary = snap.summary
    assert summary["trained"]["n_episodes"] == N and isinstance(summary["trained"]["execution_accuracy"], float)
    assert summary["trained"]["breakdown"]["overall"]["n"] == N
    evals = [e for e in snap.evals if e.get("split") == "eval"]
    assert evals and all("breakdown" in e and "execution_accuracy" in e for e in evals)

    columns = run_columns(snap)
    assert [c.label for c in columns] == ["random", "trained"]
    frame = summary_frame(columns)
    assert list(frame["policy"]) == ["random", "trained"] and list(frame["episodes"]) == [str(N), str(N)]
    assert all(ex.endswith("%") for ex in frame["EX"])  # EX known for every policy of a new run
    hardness = breakdown_frame(columns, "hardness")
    played = [ep["difficulty"] for ep in columns[0].episodes]
    assert list(hardness["hardness"]) == ["all"] + [h for h in ("easy", "medium", "hard", "extra") if h in played]
    assert list(hardness.columns) == ["hardness", "random success", "random EX", "trained success", "trained EX"]
    assert hardness.iloc[0]["trained success"].endswith(f"({N})")
    databases = breakdown_frame(columns, "database")
    assert sorted(databases["database"]) == sorted({ep["database"] for ep in columns[0].episodes})

    # Runs table and run detail: EX beside success, results by hardness.
    rows = list_runs(runs_root)
    assert [r["run_id"] for r in rows] == [run_id]  # saved evaluations are not runs
    table = runs_table(rows, runs_root)
    assert table.iloc[0]["EX"].endswith("%")
    assert table.iloc[0]["measured on"] == f"trained model · final comparison · {N} eval questions"
    detail = results_frame(snap)
    assert list(detail.columns) == list(hardness.columns) and detail.iloc[0]["hardness"] == "all"


def test_columns_added_from_a_saved_evaluation_and_refusals(spider10_run):
    runs_root, run_id = spider10_run
    cache = RunCache(runs_root)
    snap = cache.snapshot(run_id)
    choices = dict((value, label) for label, value in source_choices(cache, exclude=run_id))
    assert set(choices) == {"eval:oracle-spider10", "eval:oracle-train"}
    assert "oracle on spider10/eval, 4 episodes" in choices["eval:oracle-spider10"]

    columns, problems = columns_for(cache, snap, ["eval:oracle-spider10", "eval:oracle-train", "eval:../tiny-spider10",
                                                  "run:no-such-run", "bogus"])
    assert [c.label for c in columns] == ["random", "trained", "evaluation: oracle-spider10"]
    assert len(problems) == 4
    assert "played none of this run's eval questions" in problems[0]
    assert "Cannot add" in problems[1] and "Cannot add" in problems[2] and "Unknown column" in problems[3]
    assert columns_for(cache, snap, ["eval:oracle-spider10"] * 7)[1] == ["Too many added columns: 7 (at most 6)."]
    assert columns_for(cache, snap, "eval:oracle-spider10")[1] == ["Added columns must be a list."]
    oracle = columns[-1]
    assert [ep["question_id"] for ep in oracle.episodes] == [ep["question_id"] for ep in columns[0].episodes]
    row = summary_frame(columns).iloc[-1]
    assert (row["success rate"], row["EX"], row["episodes"]) == ("100%", "100%", str(N))
    hardness = breakdown_frame(columns, "hardness")
    assert hardness.iloc[0]["evaluation: oracle-spider10 EX"].startswith("100%")


def test_a_run_from_before_ex_still_displays(tmp_path):
    """comparison.jsonl and evals.jsonl as runs wrote them before EX and breakdowns existed."""
    run = RunDir.create(tmp_path, "old-run")
    run.write_config({"model": "builtin:tiny", "dataset": "builtin", "eval_split": "eval"})
    run.write_status("completed", step=2, total_steps=2)
    run.append("evals", {"step": 2, "split": "eval", "success_rate": 0.5, "avg_reward": 0.1, "avg_steps": 2.0,
                         "n_episodes": 2, "time": 1.0})

    def transcript(qid, correct):
        return {"question_id": qid, "question": "?", "database": "shop", "difficulty": "level_1", "correct": correct,
                "outcome": "correct" if correct else "wrong_answer", "total_reward": 1.0 if correct else 0.0,
                "n_steps": 2, "steps": []}

    for i, qid in enumerate(["q1", "q2"]):
        run.append("comparison", {"kind": "pair", "index": i, "seed": i, "question_id": qid,
                                  "random": transcript(qid, False), "trained": transcript(qid, i == 0)})
    run.append("comparison", {"kind": "summary", "n_episodes": 2,
                              "random": {"success_rate": 0.0, "avg_reward": 0.0, "avg_steps": 2.0, "n_episodes": 2},
                              "trained": {"success_rate": 0.5, "avg_reward": 0.5, "avg_steps": 2.0, "n_episodes": 2}})
    snap = RunCache(tmp_path).snapshot("old-run")
    frame = summary_frame(run_columns(snap))
    assert list(frame["success rate"]) == ["0%", "50%"] and list(frame["EX"]) == ["–", "–"]
    hardness = breakdown_frame(run_columns(snap), "hardness")
    assert list(hardness["hardness"]) == ["all", "level_1"] and hardness.iloc[0]["trained EX"] == "–"
    table = runs_table(list_runs(tmp_path), tmp_path)
    assert table.iloc[0]["success"] == "50%" and table.iloc[0]["EX"] == "–"
    assert table.iloc[0]["measured on"] == "trained model · final comparison · 2 eval questions"
    json.dumps(results_frame(snap).to_dict())
