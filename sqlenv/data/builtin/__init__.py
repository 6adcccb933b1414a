"""The built-in dataset: seven small SQLite databases and ~5,000 questions, generated from a seed.

Nothing is downloaded. `build_builtin(out_dir, seed)` writes a prepared dataset directory (see
`sqlenv.data.dataset_dir`) with splits:

* `train` — most question instances of six databases;
* `eval` — held-out instances of the same templates and databases (other parameter values, so other text);
* `eval_unseen_db` — every question about one database (`football`) that training never sees.

Gold answers come from running the gold SQL; difficulty is Spider's hardness of the gold SQL.
`ensure_builtin(dir)` builds on first use (under a file lock, into a temp dir renamed into place) and
rebuilds when the stamp in `dataset.json` (builder version, seed) is stale.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sqlite3
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp

from sqlenv.data.dataset_dir import DatasetInfo, swap_into_place
from sqlenv.data.difficulty import spider_hardness
from sqlenv.types import Question

#: Bump when generation changes so stale builds under data/builtin are rebuilt.
BUILTIN_VERSION = 7
UNSEEN_DB = "football"
#: Share of each template group's instances held out for `eval`.
EVAL_FRACTION = 0.25
#: Answers longer than this (list items / table rows) are dropped: short answers are what a small model
#: can copy, and what a person can check.
MAX_ANSWER_ROWS = 8
#: Paraphrases one SQL shape's instances rotate through (shapes with ≤3 instances use one).
PARAPHRASES_PER_SHAPE = 2

__all__ = ["build_builtin", "ensure_builtin", "BUILTIN_VERSION", "UNSEEN_DB"]


def _answer(rows: list[tuple], ncols: int) -> tuple[Any, str] | None:
    """(gold_answer, answer_type) inferred from the result shape, or None when it is empty/NULL."""
    if not rows:
        return None
    if any(v is None for r in rows for v in r):
        return None
    if len(rows) == 1 and ncols == 1:
        v = rows[0][0]
        if isinstance(v, bool) or isinstance(v, int):
            return int(v), "integer"
        if isinstance(v, float):
            return v, "float"
        return str(v), "string"
    if ncols == 1:
        return [r[0] for r in rows], "list"
    return [list(r) for r in rows], "table"


def sql_shape(sql: str) -> str:
    """The SQL with its string and number literals replaced by `?` (one shape per template use)."""
    return re.sub(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b", "?", sql)


def _tables(sql: str) -> list[str]:
    seen: list[str] = []
    for t in sqlglot.parse_one(sql, read="sqlite").find_all(exp.Table):
        if t.name not in seen:
            seen.append(t.name)
    return seen


def build_builtin(out_dir: Path | str, seed: int = 0) -> DatasetInfo:
    """Generate the built-in dataset into `out_dir` (replaced if present) and return its `DatasetInfo`.

    Args:
        out_dir: target directory, e.g. `data/builtin`. Built in a sibling temp dir, then renamed in.
        seed: drives every random choice (rows, parameters, paraphrases, splits). Same seed, same bytes
            of questions and same database contents.
    """
    from sqlenv.data.builtin.schemas import databases, generate_rows, write_database
    from sqlenv.data.builtin.templates import Ctx, candidates

    started = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-build-", dir=out_dir.parent))
    try:
        dbs, extra = databases()
        splits: dict[str, list[dict]] = {"train": [], "eval": [], "eval_unseen_db": []}
        dropped: Counter[str] = Counter()
        for db in dbs:
            rng = random.Random(f"sqlenv-builtin-{seed}-{db.name}")
            rows = generate_rows(db, rng, extra)
            db_path = tmp / "databases" / db.name / f"{db.name}.sqlite"
            write_database(db, rows, db_path)
            conn = sqlite3.connect(db_path)
            try:
                cands = candidates(Ctx(db, conn, rng))
                valid: list[tuple[Any, Any, str]] = []
                for cand in cands:
                    try:
                        cur = conn.execute(cand.sql)
                        result = cur.fetchall()
                        ncols = len(cur.description)
                        if cand.tie_sql:
                            keys = [r[0] for r in conn.execute(cand.tie_sql).fetchall()]
                            if len(keys) > cand.limit and keys[cand.limit - 1] == keys[cand.limit]:
                                dropped["tie"] += 1
                                continue
                    except sqlite3.Error:
                        dropped["sql_error"] += 1
                        continue
                    ans = _answer(result, ncols)
                    if ans is None:
                        dropped["empty_result"] += 1
                        continue
                    if len(result) > MAX_ANSWER_ROWS:
                        dropped["long_result"] += 1
                        continue
                    valid.append((cand, *ans))
            finally:
                conn.close()

            # Instances of one SQL shape (one template on the same tables and columns; only the literal
            # values differ) share a small set of paraphrases, so a held-out instance is phrased like some
            # training instance of its shape; across shapes every paraphrase of a template is used.
            shapes: dict[str, list[int]] = defaultdict(list)
            for i, (cand, _, _) in enumerate(valid):
                shapes[f"{cand.template}|{sql_shape(cand.sql)}"].append(i)
            phrasing: dict[int, int] = {}
            for members in shapes.values():
                texts = valid[members[0]][0].texts
                k = min(PARAPHRASES_PER_SHAPE if len(members) > 3 else 1, len(texts))
                chosen = rng.sample(range(len(texts)), k)
                for j, i in enumerate(members):
                    phrasing[i] = chosen[j % k]
            # Hardness and tables depend on the shape only: parse each shape once (parsing is the slow part).
            parsed = {shape: (spider_hardness(valid[m[0]][0].sql), _tables(valid[m[0]][0].sql)) for shape, m in shapes.items()}
            records: list[dict] = []
            seen_text: set[str] = set()
            for i, (cand, gold, atype) in enumerate(valid):
                text = cand.texts[phrasing[i]]
                if text in seen_text:
                    dropped["duplicate_text"] += 1
                    continue
                seen_text.add(text)
                records.append({
                    "question_id": f"builtin-{db.name}-{len(records)}",
                    "question_text": text,
                    "database_name": db.name,
                    "gold_sql": cand.sql,
                    "gold_answer": gold,
                    "answer_type": atype,
                    "difficulty": parsed[f"{cand.template}|{sql_shape(cand.sql)}"][0],
                    "tables_involved": list(parsed[f"{cand.template}|{sql_shape(cand.sql)}"][1]),
                    "template": cand.template,
                    "_phrasing": phrasing[i],
                })
            if db.name == UNSEEN_DB:
                splits["eval_unseen_db"].extend(records)
                continue
            # Hold out a share of each shape's instances (other literal values → other text), keeping in
            # train at least one instance of the shape with the held-out instance's phrasing.
            groups: dict[str, list[dict]] = defaultdict(list)
            for rec in records:
                groups[f"{rec['template']}|{sql_shape(rec['gold_sql'])}"].append(rec)
            held: set[str] = set()
            for shape in sorted(groups):
                members = groups[shape]
                n_eval = min(int(len(members) * EVAL_FRACTION + rng.random()), len(members) - 1)
                left = Counter(rec["_phrasing"] for rec in members)
                for rec in rng.sample(members, len(members)):
                    if n_eval <= 0:
                        break
                    if left[rec["_phrasing"]] > 1:
                        left[rec["_phrasing"]] -= 1
                        held.add(rec["question_id"])
                        n_eval -= 1
            for rec in records:
                splits["eval" if rec["question_id"] in held else "train"].append(rec)
        fields = list(Question.__dataclass_fields__)
        summary: dict[str, Any] = {}
        for split, recs in splits.items():
            ordered = []
            for rec in recs:
                rec["split"] = split
                ordered.append({k: rec[k] for k in fields} | {"template": rec["template"]})
            (tmp / f"questions_{split}.json").write_text(json.dumps(ordered, indent=1, ensure_ascii=False))
            summary[split] = {
                "difficulty": dict(sorted(Counter(r["difficulty"] for r in recs).items())),
                "answer_type": dict(sorted(Counter(r["answer_type"] for r in recs).items())),
                "databases": dict(sorted(Counter(r["database_name"] for r in recs).items())),
            }
        meta = {
            "name": "builtin",
            "source": "builtin",
            "builder_version": BUILTIN_VERSION,
            "seed": seed,
            "splits": list(splits),
            "counts": {s: len(r) for s, r in splits.items()},
            "dropped": sum(dropped.values()),
            "dropped_reasons": dict(sorted(dropped.items())),
            "databases": [db.name for db in dbs],
            "unseen_database": UNSEEN_DB,
            "summary": summary,
            "build_seconds": round(time.perf_counter() - started, 3),
        }
        (tmp / "dataset.json").write_text(json.dumps(meta, indent=1))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the dataset is meant to be shared
        swap_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return DatasetInfo.from_dir(out_dir)


def _is_current(root: Path, seed: int | None) -> bool:
    try:
        meta = json.loads((root / "dataset.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (
        meta.get("builder_version") == BUILTIN_VERSION
        and (seed is None or meta.get("seed") == seed)
        and all((root / f"questions_{s}.json").exists() for s in meta.get("splits", []))
    )


def ensure_builtin(root: Path | str, seed: int | None = None) -> DatasetInfo:
    """Return the built-in dataset at `root`, building it first if it is missing or stale.

    Stale means built by another builder version, or (when `seed` is given) from another seed. With
    `seed=None` any seed's build is accepted (so `data build-builtin --seed 3` sticks); a new build uses 0.

    Two processes calling this at once is safe: they serialise on `<root>.lock` and the second finds the
    first one's build current.
    """
    root = Path(root)
    if _is_current(root, seed):
        return DatasetInfo.from_dir(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    lock_path = root.parent / f".{root.name}.lock"
    with open(lock_path, "a+") as lock:
        try:
            import fcntl

            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - non-POSIX: best effort
            pass
        if not _is_current(root, seed):
            build_builtin(root, seed=0 if seed is None else seed)
    return DatasetInfo.from_dir(root)
