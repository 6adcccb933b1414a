"""Spider's own dev protocol on the real Spider files: the `spider_dev` preset, `sqlenv eval` scoring every dev
question (oracle: success and EX 1.0), hardness tables, and a saved evaluation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from sqlenv.data.datasets import load_questions, resolve_dataset
from sqlenv.data.difficulty import HARDNESS_LEVELS, spider_hardness
from sqlenv.evaluation.saved import load_evaluation

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def spider_dev(spider_source, tmp_path_factory):
    """spider_dev prepared by the CLI, as a user prepares it."""
    data_root = tmp_path_factory.mktemp("data")
    res = _run(["data", "prepare", "spider", "--source", str(spider_source), "--preset", "spider_dev"], data_root)
    assert res.returncode == 0, res.stderr
    assert "spider_dev" in res.stdout
    return resolve_dataset("spider_dev", data_root)


def _present(spider_source: Path, db_id: str) -> bool:
    return (spider_source / "database" / db_id / f"{db_id}.sqlite").is_file()


def _run(args, data_root):
    env = {**os.environ, "SQLENV_DATA_DIR": str(data_root), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "sqlenv", *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)


def test_spider_dev_is_spiders_own_split(spider_dev, spider_source):
    dev = json.loads((spider_source / "dev.json").read_text())
    train = json.loads((spider_source / "train_spider.json").read_text())
    # Spider's published hardness counts of dev.json: our labels agree on all 1,034 questions.
    assert len(dev) == 1034
    assert Counter(spider_hardness(q["query"]) for q in dev) == {"easy": 248, "medium": 446, "hard": 174, "extra": 166}
    evl, trn = load_questions(spider_dev.questions_path("eval")), load_questions(spider_dev.questions_path("train"))
    # eval is every dev question whose database this copy of Spider has; none is dropped for its SQL
    expected = [f"spider-dev-{i}" for i, q in enumerate(dev) if _present(spider_source, q["db_id"])]
    assert [q.question_id for q in evl] == expected
    assert all(q.question_id.startswith("spider-train-") for q in trn)
    assert len(trn) + spider_dev.meta["dropped_reasons"].get("sql_error", 0) \
        + spider_dev.meta["dropped_reasons"].get("too_many_rows", 0) \
        + sum(1 for q in train if not _present(spider_source, q["db_id"])) == len(train)
    assert not {q.database_name for q in evl} & {q.database_name for q in trn}  # no database shared
    assert {q.database_name for q in evl} == {q["db_id"] for q in dev if _present(spider_source, q["db_id"])}
    by_id = {f"spider-dev-{i}": spider_hardness(q["query"]) for i, q in enumerate(dev)}
    assert all(q.difficulty == by_id[q.question_id] for q in evl)
    meta = spider_dev.meta
    assert meta["split_protocol"] == "spider" and meta["eval_episodes"] == "all"
    assert set(meta["skipped_databases"]) == {q["db_id"] for q in dev + train if not _present(spider_source, q["db_id"])}


def test_eval_scores_every_dev_question_with_tables(spider_dev, spider_source, tmp_path):
    data_root = spider_dev.root.parent
    dev = json.loads((spider_source / "dev.json").read_text())
    present = [q for q in dev if _present(spider_source, q["db_id"])]
    hardness = Counter(spider_hardness(q["query"]) for q in present)

    res = _run(["eval", "--dataset", "spider_dev", "--split", "eval", "--policy", "oracle", "--json"], data_root)
    assert res.returncode == 0, res.stderr
    oracle = json.loads(res.stdout)
    assert oracle["n_episodes"] == len(present) and oracle["question_order"] == "all"
    assert oracle["success_rate"] == 1.0 and oracle["execution_accuracy"] == 1.0
    cells = oracle["breakdown"]
    assert list(cells["hardness"]) == list(HARDNESS_LEVELS)
    assert {k: c["n"] for k, c in cells["hardness"].items()} == hardness
    assert all(c["success_rate"] == c["execution_accuracy"] == 1.0 for c in cells["database"].values())
    assert {k: c["n"] for k, c in cells["database"].items()} == Counter(q["db_id"] for q in present)

    out = tmp_path / "evaluations" / "random-dev"
    res = _run(["eval", "--dataset", "spider_dev", "--policy", "random", "--out", str(out)], data_root)
    assert res.returncode == 0, res.stderr
    assert "hardness" in res.stdout and "extra" in res.stdout and "world_1" in res.stdout
    saved = load_evaluation(out)
    assert saved.meta["policy"] == "random" and saved.meta["question_order"] == "all"
    assert [ep["question_id"] for ep in saved.episodes] == [f"spider-dev-{i}" for i, q in enumerate(dev)
                                                            if _present(spider_source, q["db_id"])]
    summary = saved.meta["summary"]
    assert summary["success_rate"] < 0.05 and summary["execution_accuracy"] < 0.2
    assert {k: c["n"] for k, c in summary["breakdown"]["hardness"].items()} == hardness


def test_oracle_full_ex_on_the_train_split(spider_dev):
    res = _run(["eval", "--dataset", str(spider_dev.root), "--split", "train", "--policy", "oracle",
                "--episodes", "300", "--json"], spider_dev.root.parent)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["n_episodes"] == 300 and data["success_rate"] == data["execution_accuracy"] == 1.0
    # every question by default is the eval split's protocol only
    res = _run(["eval", "--dataset", "spider_dev", "--split", "train", "--policy", "random", "--json"],
               spider_dev.root.parent)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["n_episodes"] == 50 and json.loads(res.stdout)["question_order"] == "seeded"
