"""The built-in generated dataset and dataset resolution (real SQLite files in temp folders)."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from sqlenv.data.builtin import BUILTIN_VERSION, UNSEEN_DB, build_builtin
from sqlenv.data.datasets import (
    DatasetInfo,
    DatasetNotFoundError,
    data_root,
    list_datasets,
    load_questions,
    resolve_dataset,
)
from sqlenv.data.difficulty import spider_hardness
from sqlenv.types import ANSWER_TYPES, DIFFICULTIES

SPLITS = ("train", "eval", "eval_unseen_db")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> DatasetInfo:
    return build_builtin(tmp_path_factory.mktemp("builtin") / "builtin", seed=0)


@pytest.fixture(scope="module")
def questions(built) -> dict[str, list]:
    return {s: load_questions(built.questions_path(s)) for s in SPLITS}


def test_layout_and_stamp(built):
    assert built.splits == list(SPLITS)
    meta = json.loads((built.root / "dataset.json").read_text())
    assert meta["name"] == "builtin" and meta["source"] == "builtin"
    assert meta["builder_version"] == BUILTIN_VERSION and meta["seed"] == 0
    assert meta["dropped"] == sum(meta["dropped_reasons"].values())
    for split in SPLITS:
        assert meta["counts"][split] == len(json.loads(built.questions_path(split).read_text()))


def test_databases_are_small_related_and_varied(built):
    dbs = sorted(p.name for p in built.db_dir.iterdir())
    assert len(dbs) >= 6
    for db in dbs:
        conn = sqlite3.connect(f"file:{built.db_dir / db / (db + '.sqlite')}?mode=ro", uri=True)
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert 2 <= len(tables) <= 5, (db, tables)
        fks = sum(len(conn.execute(f"PRAGMA foreign_key_list({t})").fetchall()) for t in tables)
        assert fks >= 1, db
        for t in tables:
            n = conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            assert 8 <= n <= 500, (db, t, n)
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        conn.close()


def test_question_counts_difficulties_and_types(questions):
    everything = [q for qs in questions.values() for q in qs]
    assert len(everything) >= 600
    assert set(Counter(q.difficulty for q in everything)) == set(DIFFICULTIES)
    assert set(Counter(q.answer_type for q in everything)) == set(ANSWER_TYPES)
    # every level occurs in the eval split too, so per-difficulty success rates mean something
    assert set(q.difficulty for q in questions["eval"]) == set(DIFFICULTIES)
    ids = [q.question_id for q in everything]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"builtin-[a-z_]+-\d+", i) for i in ids)
    assert len({q.question_text for q in everything}) > 0.9 * len(everything)


def test_gold_answers_match_running_gold_sql(built, questions):
    for split, qs in questions.items():
        for q in qs:
            assert q.split == split
            conn = sqlite3.connect(f"file:{built.db_dir / q.database_name / (q.database_name + '.sqlite')}?mode=ro", uri=True)
            cur = conn.execute(q.gold_sql)
            rows = cur.fetchall()
            conn.close()
            assert rows, q.question_id
            if q.answer_type in ("integer", "float", "string"):
                assert len(rows) == 1 and len(rows[0]) == 1
                assert rows[0][0] == q.gold_answer
            elif q.answer_type == "list":
                assert [r[0] for r in rows] == q.gold_answer
            else:
                assert [list(r) for r in rows] == q.gold_answer
            assert q.difficulty == spider_hardness(q.gold_sql)
            assert q.tables_involved and all(t in q.gold_sql for t in q.tables_involved)


def test_literals_in_gold_sql_appear_verbatim_in_the_question(questions):
    for qs in questions.values():
        for q in qs:
            for literal in re.findall(r"'((?:[^']|'')*)'", q.gold_sql):
                assert literal.replace("''", "'") in q.question_text, (q.question_text, q.gold_sql)


def test_splits_hold_out_instances_and_one_database(questions):
    train, evl, unseen = questions["train"], questions["eval"], questions["eval_unseen_db"]
    total = len(train) + len(evl) + len(unseen)
    assert 0.60 <= len(train) / total <= 0.72
    assert 0.15 <= len(evl) / total <= 0.22
    assert {q.database_name for q in unseen} == {UNSEEN_DB}
    assert UNSEEN_DB not in {q.database_name for q in train + evl}
    assert {q.database_name for q in evl} <= {q.database_name for q in train}
    train_texts = {q.question_text for q in train}
    assert not any(q.question_text for q in evl if q.question_text in train_texts)
    # held-out instances reuse question shapes seen in training: same templates, other values
    train_shapes = {json.dumps(_shape(q.gold_sql)) for q in train}
    shared = sum(json.dumps(_shape(q.gold_sql)) in train_shapes for q in evl)
    assert shared == len(evl)


def test_held_out_instances_are_phrased_like_a_training_instance_of_their_shape(questions):
    def pattern(q):
        text = q.question_text
        literals = [x.replace("''", "'") for x in re.findall(r"'((?:[^']|'')*)'", q.gold_sql)]
        for lit in sorted(set(literals + re.findall(r"\b\d+(?:\.\d+)?\b", q.gold_sql)), key=len, reverse=True):
            text = re.sub(r"(?<![\w.])" + re.escape(lit) + r"(?!\w|\.\d)", "<V>", text)
        return q.database_name, text
    train = {pattern(q) for q in questions["train"]}
    covered = sum(pattern(q) in train for q in questions["eval"])
    assert covered / len(questions["eval"]) > 0.9
    # ... while the dataset as a whole still uses every phrasing of the common templates
    openings = {" ".join(q.question_text.split()[:2]) for qs in questions.values() for q in qs if q.gold_sql.startswith("SELECT count(*) FROM") and "WHERE" in q.gold_sql and "JOIN" not in q.gold_sql}
    assert openings >= {"How many", "Count the", "What is"}


def _shape(sql: str) -> str:
    return re.sub(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b", "?", sql)


def test_answers_are_short(questions):
    for qs in questions.values():
        for q in qs:
            if q.answer_type in ("list", "table"):
                assert 1 <= len(q.gold_answer) <= 8


def test_deterministic_from_seed(tmp_path, built):
    again = build_builtin(tmp_path / "again", seed=0)
    other = build_builtin(tmp_path / "other", seed=1)
    for split in SPLITS:
        assert again.questions_path(split).read_bytes() == built.questions_path(split).read_bytes()
    assert other.questions_path("train").read_bytes() != built.questions_path("train").read_bytes()
    db = "music/music.sqlite"
    assert (again.db_dir / db).read_bytes() == (built.db_dir / db).read_bytes()


def test_resolve_builds_on_first_use_and_rebuilds_when_stale(tmp_path):
    info = resolve_dataset("builtin", data_root=tmp_path)
    assert info.root == tmp_path / "builtin" and info.splits == list(SPLITS)
    stamp = (info.root / "dataset.json").stat().st_mtime_ns
    assert resolve_dataset("builtin", data_root=tmp_path).root == info.root
    assert (info.root / "dataset.json").stat().st_mtime_ns == stamp  # current: not rebuilt
    meta = json.loads((info.root / "dataset.json").read_text())
    meta["builder_version"] = -1
    (info.root / "dataset.json").write_text(json.dumps(meta))
    rebuilt = resolve_dataset("builtin", data_root=tmp_path)
    assert rebuilt.meta["builder_version"] == BUILTIN_VERSION
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".builtin-")] == []  # no temp dirs left


def test_two_processes_building_at_once(tmp_path):
    code = ("import sys; from sqlenv.data.datasets import resolve_dataset; "
            "print(resolve_dataset('builtin', data_root=sys.argv[1]).counts)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]
    info = resolve_dataset(tmp_path / "builtin")
    assert sum(info.counts.values()) == sum(len(load_questions(info.questions_path(s))) for s in SPLITS)


def test_resolution_by_name_path_and_errors(tmp_path, built, monkeypatch):
    assert resolve_dataset(str(built.root)).root == built.root
    assert resolve_dataset(built.root).name == "builtin"
    assert resolve_dataset(built) is built  # already resolved: returned as it is, nothing looked up again
    prepared = tmp_path / "mine"
    prepared.mkdir()
    (prepared / "questions_train.json").write_text("[]")
    assert resolve_dataset("mine", data_root=tmp_path).splits == ["train"]
    assert [d.name for d in list_datasets(tmp_path)] == ["mine"]
    with pytest.raises(DatasetNotFoundError, match="available: builtin, mine"):
        resolve_dataset("nope", data_root=tmp_path)
    with pytest.raises(DatasetNotFoundError):
        resolve_dataset(str(tmp_path / "missing"), data_root=tmp_path)
    with pytest.raises(ValueError, match="splits: train, eval, eval_unseen_db"):
        built.questions_path("dev")
    monkeypatch.setenv("SQLENV_DATA_DIR", str(tmp_path))
    assert data_root() == Path(tmp_path)
    assert resolve_dataset("mine").root == prepared


def test_a_build_from_another_seed_is_kept_unless_a_seed_is_asked_for(tmp_path):
    from sqlenv.data.builtin import ensure_builtin

    build_builtin(tmp_path / "builtin", seed=3)
    assert resolve_dataset("builtin", data_root=tmp_path).meta["seed"] == 3
    assert ensure_builtin(tmp_path / "builtin", seed=0).meta["seed"] == 0


def test_a_pattern_copying_baseline_solves_held_out_questions(built, questions):
    """Learnability: held-out questions are answerable by copying a training question's SQL with the new
    literals — the mapping a small model must learn. The baseline sees only question texts at eval time;
    it turns each training question into a regex (its literals become slots) and its SQL into a template."""
    literal = r"'((?:[^']|'')*)'|\b(\d+(?:\.\d+)?)\b"
    patterns: dict[str, tuple[re.Pattern, str, int]] = {}
    for q in questions["train"]:
        text, sql = q.question_text, q.gold_sql
        values = {a.replace("''", "'") if a else b for a, b in re.findall(literal, sql)}
        slots = sorted((v for v in values if re.search(r"(?<![\w.])" + re.escape(v) + r"(?!\w|\.\d)", text)), key=text.index)
        regex = re.escape(text)
        for i, v in enumerate(slots):
            regex = regex.replace(re.escape(v), f"(?P<v{i}>.+?)", 1)
            sql = re.sub(r"'" + re.escape(v.replace("'", "''")) + r"'|\b" + re.escape(v) + r"\b", f"{{v{i}}}", sql)
        fixed = len(text) - sum(len(v) for v in slots)  # the more fixed text, the more specific the pattern
        patterns.setdefault(regex, (re.compile(f"^{regex}$"), sql, fixed))
    ranked = sorted(patterns.values(), key=lambda p: -p[2])

    def run(db: str, sql: str):
        conn = sqlite3.connect(f"file:{built.db_dir / db / (db + '.sqlite')}?mode=ro", uri=True)
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.Error:
            return None
        finally:
            conn.close()

    solved = 0
    for q in questions["eval"]:
        for compiled, sql, _ in ranked:
            m = compiled.match(q.question_text)
            if m:
                values = {k: (v if re.fullmatch(r"\d+(?:\.\d+)?", v) else "'" + v.replace("'", "''") + "'")
                          for k, v in m.groupdict().items()}
                solved += run(q.database_name, sql.format(**values)) == run(q.database_name, q.gold_sql)
                break
    print(f"pattern-copy baseline: {solved}/{len(questions['eval'])}")
    assert solved / len(questions["eval"]) >= 0.95


def test_one_question_loader_with_clear_errors(built, tmp_path):
    """`load_questions` is the one loader: `sqlenv.data.datasets`, `DatasetInfo.load` and `SQLEnvironment(path, ...)`
    all read a questions file through it, and a bad file names itself and what is wrong."""
    import sqlenv.data.dataset_dir
    from sqlenv.environment import SQLEnvironment

    assert load_questions is sqlenv.data.dataset_dir.load_questions
    path = built.questions_path("eval")
    loaded = load_questions(path)
    assert loaded == built.load("eval") and len(loaded) == built.counts["eval"]
    with SQLEnvironment(path, built.db_dir) as env:
        assert env.questions == loaded
    with pytest.raises(FileNotFoundError, match="questions file not found"):
        load_questions(tmp_path / "missing.json")
    cases = {"dict.json": ("{}", "expected a JSON list"), "torn.json": ("[{", "not JSON"),
             "record.json": ('[{"question_id": "q1"}]', "question 0 is not a question record")}
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=message):
            load_questions(tmp_path / name)
