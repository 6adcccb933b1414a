"""Preparing datasets from Spider 1.0: the real Spider files (spider_source fixture) and tiny Spider-layout
directories built here for the failure paths."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from sqlenv.data.datasets import load_questions, resolve_dataset
from sqlenv.data.difficulty import spider_hardness
from sqlenv.data.spider import (
    SPIDER10,
    SpiderError,
    SpiderSourceNotFound,
    default_spider_dir,
    prepare_spider,
)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def spider10(spider_source, tmp_path_factory):
    before = {db: _digest(spider_source / "database" / db / f"{db}.sqlite") for db in SPIDER10}
    info = prepare_spider(spider_source, tmp_path_factory.mktemp("prep") / "spider10", preset="spider10")
    after = {db: _digest(spider_source / "database" / db / f"{db}.sqlite") for db in SPIDER10}
    assert before == after  # the source is only read
    return info


def _source_questions(spider_source: Path, dbs) -> list[dict]:
    out = []
    for f in ("train_spider.json", "dev.json"):
        out += [q for q in json.loads((spider_source / f).read_text()) if q["db_id"] in dbs]
    return out


def test_spider10_counts_and_split(spider10, spider_source):
    assert spider10.name == "spider10" and spider10.splits == ["train", "eval"]
    train, evl = load_questions(spider10.questions_path("train")), load_questions(spider10.questions_path("eval"))
    source = _source_questions(spider_source, set(SPIDER10))
    assert len(source) == 676
    assert spider10.meta["dropped"] + len(train) + len(evl) == 676
    assert (len(train), len(evl)) == (473, 203)
    assert {q.database_name for q in train} == {q.database_name for q in evl} == set(SPIDER10)
    ids = [q.question_id for q in train + evl]
    assert len(set(ids)) == len(ids)
    # stratified by database and hardness: every stratum's eval share is 30% up to rounding
    strata_all = Counter((q.database_name, q.difficulty) for q in train + evl)
    strata_eval = Counter((q.database_name, q.difficulty) for q in evl)
    for key, n in strata_all.items():
        assert abs(strata_eval[key] - 0.3 * n) <= 1, key
    assert {q.difficulty for q in evl} == {"easy", "medium", "hard", "extra"}


def test_spider10_questions_gold_and_databases(spider10, spider_source):
    texts = {(q["db_id"], " ".join(q["question"].split()), q["query"].strip()) for q in _source_questions(spider_source, set(SPIDER10))}
    assert sorted(p.name for p in spider10.db_dir.iterdir()) == sorted(SPIDER10)
    for split in spider10.splits:
        for q in load_questions(spider10.questions_path(split)):
            assert q.split == split
            assert (q.database_name, q.question_text, q.gold_sql) in texts
            assert q.difficulty == spider_hardness(q.gold_sql)
            db = spider10.db_dir / q.database_name / f"{q.database_name}.sqlite"
            assert _digest(db) == _digest(spider_source / "database" / q.database_name / f"{q.database_name}.sqlite")
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            conn.text_factory = lambda b: b.decode("utf-8", "replace")
            cur = conn.execute(q.gold_sql)
            rows, ncols = cur.fetchall(), len(cur.description)
            conn.close()
            if not rows:
                assert (q.answer_type, q.gold_answer) == ("list", [])
            elif len(rows) == 1 and ncols == 1:
                assert q.answer_type in ("integer", "float", "string")
                assert q.gold_answer == rows[0][0] or str(rows[0][0]) == q.gold_answer
            elif ncols == 1:
                assert q.answer_type == "list" and q.gold_answer == [r[0] for r in rows]
            else:
                assert q.answer_type == "table" and q.gold_answer == [list(r) for r in rows]
            assert set(q.tables_involved) <= {t for t in _tables(db)}


def _tables(db: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    conn.close()
    return names


def test_resolve_prepared_and_deterministic_split(spider10, spider_source, tmp_path):
    info = resolve_dataset(spider10.root.name, data_root=spider10.root.parent)
    assert info.root == spider10.root and info.counts == {"train": 473, "eval": 203}
    again = prepare_spider(spider_source, tmp_path / "again", preset="spider10", seed=0)
    assert again.questions_path("eval").read_bytes() == spider10.questions_path("eval").read_bytes()
    other = prepare_spider(spider_source, tmp_path / "other", preset="spider10", seed=1)
    assert other.counts == {"train": 473, "eval": 203}
    ids = lambda i: {q.question_id for q in load_questions(i.questions_path("eval"))}  # noqa: E731
    assert ids(other) != ids(spider10)


def test_db_id_lists_and_all(spider_source, tmp_path):
    two = prepare_spider(spider_source, tmp_path / "two", db_ids=["pets_1", "poker_player"])
    assert sorted(p.name for p in two.db_dir.iterdir()) == ["pets_1", "poker_player"]
    n = len(_source_questions(spider_source, {"pets_1", "poker_player"}))
    assert sum(two.counts.values()) + two.meta["dropped"] == n
    as_text = prepare_spider(spider_source, tmp_path / "text", db_ids="pets_1,poker_player")
    assert as_text.questions_path("train").read_bytes() == two.questions_path("train").read_bytes()

    # `all` on a Spider directory holding only three database files: the rest are skipped and counted
    partial = tmp_path / "partial"
    (partial / "database").mkdir(parents=True)
    for f in ("tables.json", "train_spider.json", "dev.json"):
        (partial / f).symlink_to(spider_source / f)
    for db in ("pets_1", "poker_player", "concert_singer"):
        (partial / "database" / db).symlink_to(spider_source / "database" / db)
    everything = prepare_spider(partial, tmp_path / "all", db_ids="all")
    assert everything.meta["databases"] == ["concert_singer", "pets_1", "poker_player"]
    n_all = len(_source_questions(spider_source, {"pets_1", "poker_player", "concert_singer"}))
    assert sum(everything.counts.values()) + everything.meta["dropped_reasons"].get("sql_error", 0) == n_all
    assert everything.meta["dropped_reasons"]["missing_database"] > 6000
    assert len(everything.meta["skipped_databases"]) > 100


def test_argument_errors(spider_source, tmp_path):
    with pytest.raises(SpiderError, match="unknown preset"):
        prepare_spider(spider_source, tmp_path / "x", preset="spider11")
    with pytest.raises(SpiderError, match="unknown Spider database"):
        prepare_spider(spider_source, tmp_path / "x", db_ids=["pets_1", "no_such_db"])
    with pytest.raises(SpiderError, match="choose the databases"):
        prepare_spider(spider_source, tmp_path / "x")
    with pytest.raises(SpiderError, match="not both"):
        prepare_spider(spider_source, tmp_path / "x", db_ids=["pets_1"], preset="spider10")
    with pytest.raises(FileNotFoundError, match="Spider directory not found"):
        prepare_spider(tmp_path / "nowhere", tmp_path / "x", preset="spider10")
    assert not (tmp_path / "x").exists()


# ---- a tiny Spider-layout directory: failing and slow gold SQL --------------------------------------


def _tiny_spider(root: Path, questions: list[tuple[str, str]], dev: list[tuple[str, str]] = ()) -> Path:
    db = root / "database" / "shop" / "shop.sqlite"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL);"
        "INSERT INTO item VALUES (1, 'pen', 1.5), (2, 'cup', 4.0), (3, 'hat', 12.0);"
    )
    conn.commit()
    conn.close()
    (root / "tables.json").write_text(json.dumps([{"db_id": "shop", "table_names_original": ["item"]}]))
    as_items = lambda qs: [{"db_id": "shop", "question": q, "query": s} for q, s in qs]  # noqa: E731
    (root / "train_spider.json").write_text(json.dumps(as_items(questions)))
    (root / "dev.json").write_text(json.dumps(as_items(dev)))
    return root


def test_failing_and_slow_gold_sql_are_dropped_and_counted(tmp_path):
    good = [(f"How many items cost more than {i}?", f"SELECT count(*) FROM item WHERE price > {i}") for i in range(10)]
    src = _tiny_spider(tmp_path / "src", good + [
        ("Broken", "SELECT nope FROM item"),
        ("Forever", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"),
    ], dev=[("Names?", "SELECT name FROM item ORDER BY price")])
    before = _digest(src / "database" / "shop" / "shop.sqlite")
    info = prepare_spider(src, tmp_path / "out", db_ids=["shop"], timeout_s=0.3)
    assert info.meta["dropped_reasons"] == {"sql_error": 1, "timeout": 1}
    assert info.meta["dropped"] == 2
    assert sum(info.counts.values()) == 11
    qs = {q.question_text: q for s in info.splits for q in load_questions(info.questions_path(s))}
    assert qs["Names?"].answer_type == "list" and qs["Names?"].gold_answer == ["pen", "cup", "hat"]
    assert qs["How many items cost more than 0?"].gold_answer == 3
    assert qs["Names?"].question_id == "spider-dev-0"
    assert _digest(src / "database" / "shop" / "shop.sqlite") == before


def test_missing_files_and_databases(tmp_path):
    src = _tiny_spider(tmp_path / "src", [("q", "SELECT 1")])
    (src / "dev.json").unlink()
    with pytest.raises(SpiderSourceNotFound, match="missing dev.json"):
        prepare_spider(src, tmp_path / "out", db_ids=["shop"])
    src2 = _tiny_spider(tmp_path / "src2", [("q", "SELECT 1")])
    (src2 / "database" / "shop" / "shop.sqlite").unlink()
    with pytest.raises(SpiderSourceNotFound, match="database file"):
        prepare_spider(src2, tmp_path / "out", db_ids=["shop"])
    assert not (tmp_path / "out").exists()


def test_default_spider_dir_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("SQLENV_SPIDER_DIR", str(tmp_path / "elsewhere"))
    assert default_spider_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("SQLENV_SPIDER_DIR")
    # Without it: shared/spider beside this checkout (the tests run from a checkout with a pyproject.toml).
    repo = Path(__file__).resolve().parent.parent
    assert default_spider_dir() == repo.parent / "shared" / "spider"
