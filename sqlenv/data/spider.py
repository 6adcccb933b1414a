"""Spider 1.0 support: prepare a dataset from a Spider directory, and download the official archive.

A Spider directory has the official layout::

    <source>/database/<db_id>/<db_id>.sqlite
    <source>/train_spider.json   <source>/dev.json   <source>/tables.json

`prepare_spider` turns (a subset of) it into a prepared dataset directory (see `sqlenv.data.datasets`) with
splits `train` and `eval`: Spider's train and dev questions about the chosen databases are pooled and
re-split ~70/30, stratified by database and hardness, so both splits cover every database (`spider10`,
`all`, a list of ids). The `spider_dev` preset keeps Spider's own split instead: `train` is
`train_spider.json` (140 databases), `eval` is every `dev.json` question (1,034 on 20 databases that no
training question touches), the protocol published Spider results use. Gold answers
come from running the gold SQL read-only under a time limit; questions whose SQL fails are dropped and
counted in `dataset.json`.

Spider is licensed CC BY-SA 4.0 (Yu et al., EMNLP 2018). Data derived from it stays under the gitignored
`data/` folder and is never committed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sqlite3
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections import Counter, defaultdict
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Sequence

import sqlglot
from sqlglot import exp

from sqlenv.data.dataset_dir import DatasetInfo, swap_into_place
from sqlenv.data.difficulty import HardnessError, spider_hardness
from sqlenv.types import Question

#: The official Spider 1.0 archive (`spider_data.zip`, linked from https://yale-lily.github.io/spider).
OFFICIAL_URL = "https://drive.usercontent.google.com/download?id=1403EGqzIDoHMdQF4c9Bkyl7dZLZ5Wt6J&export=download&confirm=t"

#: Ten small Spider databases (676 train+dev questions) — a quick, varied benchmark.
SPIDER10 = (
    "student_assessment", "concert_singer", "world_1", "car_1", "employee_hire_evaluation",
    "pets_1", "cre_Doc_Template_Mgt", "dog_kennels", "flight_2", "poker_player",
)
#: Spider's own split (see the module docstring): its databases are those of train_spider.json and dev.json.
SPIDER_DEV = "spider_dev"
#: Named selections: a tuple of database ids (re-split ~70/30), or None for `spider_dev`'s own split.
PRESETS: dict[str, tuple[str, ...] | None] = {"spider10": SPIDER10, SPIDER_DEV: None}

QUESTION_FILES = ("train_spider.json", "dev.json")
REQUIRED_FILES = ("tables.json", "train_spider.json", "dev.json")
#: Share of each (database, hardness) stratum that goes to `eval`.
EVAL_FRACTION = 0.3
#: Gold queries slower than this are dropped (they would also time out in the environment's sandbox).
GOLD_TIMEOUT_S = 5.0
#: Gold results with more rows than this are dropped (the environment scores at most 10k rows).
MAX_GOLD_ROWS = 10_000


class SpiderError(ValueError):
    """A bad argument or a Spider directory/archive that cannot be used. Messages are one line."""


class SpiderSourceNotFound(SpiderError, FileNotFoundError):
    """The Spider directory, or a file it must hold, does not exist."""


class SpiderArchiveError(SpiderError):
    """A downloaded archive that is not a complete Spider zip."""


SPIDER_DIR_ENV = "SQLENV_SPIDER_DIR"


def default_spider_dir() -> Path:
    """Where the local Spider copy is: `$SQLENV_SPIDER_DIR`, else `shared/spider` beside the repository this
    package was loaded from (`../shared/spider` from its root), else `../shared/spider` from the working
    directory (an installed package has no repository beside it)."""
    if os.environ.get(SPIDER_DIR_ENV):
        return Path(os.environ[SPIDER_DIR_ENV])
    repo = Path(__file__).resolve().parents[2]
    base = repo.parent if (repo / "pyproject.toml").is_file() else Path("..")
    return base / "shared" / "spider"


# ---- prepare ----------------------------------------------------------------------------------------


def _check_source(source: Path) -> None:
    if not source.is_dir():
        raise SpiderSourceNotFound(f"Spider directory not found: {source} (set SQLENV_SPIDER_DIR or pass --source)")
    missing = [f for f in REQUIRED_FILES if not (source / f).is_file()]
    if not (source / "database").is_dir():
        missing.append("database/")
    if missing:
        raise SpiderSourceNotFound(f"{source} is not a Spider 1.0 directory: missing {', '.join(missing)}")


def _db_path(source: Path, db_id: str) -> Path:
    return source / "database" / db_id / f"{db_id}.sqlite"


def _select_databases(source: Path, db_ids: str | Sequence[str] | None, preset: str | None) -> tuple[list[str], bool]:
    """The chosen db ids, and whether missing database files may be skipped (`all` and `spider_dev`: a copy of
    Spider may lack a few large databases; their questions are then dropped and counted)."""
    if preset is not None and db_ids is not None:
        raise SpiderError("give either db_ids or preset, not both")
    if preset is not None:
        if preset not in PRESETS:
            raise SpiderError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
        if preset == SPIDER_DEV:
            ids = {item["db_id"] for f in QUESTION_FILES for item in json.loads((source / f).read_text())}
            return sorted(ids), True
        return list(PRESETS[preset]), False
    if db_ids is None:
        raise SpiderError("choose the databases: db_ids=[...] or 'all', or preset='spider10'")
    known = [t["db_id"] for t in json.loads((source / "tables.json").read_text())]
    if isinstance(db_ids, str):
        if db_ids == "all":
            return sorted(known), True
        db_ids = [d for d in db_ids.split(",") if d.strip()]
    chosen = [d.strip() for d in db_ids]
    if not chosen:
        raise SpiderError("db_ids is empty")
    unknown = [d for d in chosen if d not in known]
    if unknown:
        raise SpiderError(f"unknown Spider database(s): {', '.join(unknown)} (see tables.json for the {len(known)} ids)")
    missing = [d for d in chosen if not _db_path(source, d).is_file()]
    if missing:
        raise SpiderSourceNotFound(f"database file(s) missing under {source / 'database'}: {', '.join(missing)}")
    return list(dict.fromkeys(chosen)), False


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _open_ro(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only = 1")
    conn.text_factory = _lenient_text
    return conn


def run_gold(conn: sqlite3.Connection, sql: str, timeout_s: float = GOLD_TIMEOUT_S) -> tuple[list[tuple], int]:
    """Run one gold query with a time limit; return (rows, number of columns). Raises sqlite3.Error."""
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
    try:
        cur = conn.execute(sql)
        rows = cur.fetchmany(MAX_GOLD_ROWS + 1)
        return rows, len(cur.description or ())
    finally:
        conn.set_progress_handler(None, 0)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def infer_answer(rows: list[tuple], ncols: int) -> tuple[Any, str]:
    """(gold_answer, answer_type) from a result's shape: one cell → integer/float/string, one column →
    list, otherwise table. An empty result is an empty list."""
    if not rows:
        return [], "list"
    if len(rows) == 1 and ncols == 1:
        v = _plain(rows[0][0])
        if isinstance(v, bool) or isinstance(v, int):
            return int(v), "integer"
        if isinstance(v, float):
            return v, "float"
        return v if v is None else str(v), "string"
    if ncols == 1:
        return [_plain(r[0]) for r in rows], "list"
    return [[_plain(v) for v in r] for r in rows], "table"


def _tables_involved(sql: str, table_names: Iterable[str]) -> list[str]:
    by_lower = {t.lower(): t for t in table_names}
    found: list[str] = []
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except sqlglot.errors.ParseError:
        return found
    for t in tree.find_all(exp.Table):
        name = by_lower.get(t.name.lower())
        if name and name not in found:
            found.append(name)
    return found


def _stratified_eval(items: list[dict], fraction: float, rng: random.Random) -> set[str]:
    """Question ids for `eval`: `round(fraction * n)` in all, spread over (database, hardness) strata in
    proportion to their size (largest remainders get the leftover places)."""
    strata: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for item in items:
        strata[(item["database_name"], item["difficulty"])].append(item)
    keys = sorted(strata)
    target = round(fraction * len(items))
    quota = {k: int(fraction * len(strata[k])) for k in keys}
    tiebreak = {k: rng.random() for k in keys}
    leftover = target - sum(quota.values())
    for k in sorted(keys, key=lambda k: (-(fraction * len(strata[k]) - quota[k]), tiebreak[k]))[:leftover]:
        quota[k] += 1
    held: set[str] = set()
    for k in keys:
        members = sorted(strata[k], key=lambda q: q["question_id"])
        for item in rng.sample(members, quota[k]):
            held.add(item["question_id"])
    return held


def prepare_spider(
    source: str | Path,
    out: str | Path,
    db_ids: str | Sequence[str] | None = None,
    preset: str | None = None,
    seed: int = 0,
    *,
    eval_fraction: float = EVAL_FRACTION,
    timeout_s: float = GOLD_TIMEOUT_S,
    name: str | None = None,
) -> DatasetInfo:
    """Prepare a dataset directory at `out` from the Spider 1.0 directory `source`.

    Args:
        source: a Spider directory in the official layout (e.g. `$SQLENV_SPIDER_DIR`).
        out: the dataset directory to write (replaced if present; built in a temp dir, then renamed).
        db_ids: database ids to include — a list, a comma-separated string, or `"all"` (database files
            absent from `source` are then skipped and counted).
        preset: instead of db_ids, a named selection: `"spider10"` (10 small databases, 676 questions), or
            `"spider_dev"` (Spider's own split: train_spider.json for `train`, all of dev.json for `eval`).
        seed: drives the train/eval re-split. Same seed, same split.
        eval_fraction: share of each (database, hardness) stratum held out as `eval` (default 0.3; not used by
            `spider_dev`, whose split is Spider's).
        timeout_s: time limit per gold query (default 5 s, the sandbox's default).
        name: dataset name in `dataset.json` (default: the preset, else `out`'s folder name).

    Returns:
        The prepared dataset's `DatasetInfo` (splits `train` and `eval`).
    """
    started = time.perf_counter()
    source, out = Path(source).expanduser(), Path(out).expanduser()
    _check_source(source)
    if not 0.0 < eval_fraction < 1.0:
        raise SpiderError(f"eval_fraction must be between 0 and 1, got {eval_fraction}")
    chosen, skip_missing = _select_databases(source, db_ids, preset)
    dropped: Counter[str] = Counter()
    if skip_missing:
        present = [d for d in chosen if _db_path(source, d).is_file()]
        skipped_dbs = sorted(set(chosen) - set(present))
        chosen = present
    else:
        skipped_dbs = []
    wanted = set(chosen)

    tables = {t["db_id"]: t.get("table_names_original", []) for t in json.loads((source / "tables.json").read_text())}
    raw: list[tuple[str, int, dict]] = []
    for fname in QUESTION_FILES:
        for idx, item in enumerate(json.loads((source / fname).read_text())):
            if item["db_id"] in wanted:
                raw.append((fname.split("_")[0].split(".")[0], idx, item))
            elif item["db_id"] in skipped_dbs:
                dropped["missing_database"] += 1

    items: list[dict] = []
    conns: dict[str, sqlite3.Connection] = {}
    try:
        for origin, idx, item in raw:
            db_id, sql = item["db_id"], item["query"].strip()
            conn = conns.get(db_id) or conns.setdefault(db_id, _open_ro(_db_path(source, db_id)))
            try:
                difficulty = spider_hardness(sql)
            except HardnessError:
                dropped["unparseable_sql"] += 1
                continue
            try:
                rows, ncols = run_gold(conn, sql, timeout_s)
            except sqlite3.Error as err:
                dropped["timeout" if "interrupt" in str(err).lower() else "sql_error"] += 1
                continue
            if len(rows) > MAX_GOLD_ROWS:
                dropped["too_many_rows"] += 1
                continue
            gold, answer_type = infer_answer(rows, ncols)
            items.append({
                "question_id": f"spider-{origin}-{idx}",
                "question_text": " ".join(item["question"].split()),
                "database_name": db_id,
                "gold_sql": sql,
                "gold_answer": gold,
                "answer_type": answer_type,
                "difficulty": difficulty,
                "tables_involved": _tables_involved(sql, tables.get(db_id, [])),
                "split": "",
            })
    finally:
        for conn in conns.values():
            conn.close()
    if not items:
        raise SpiderError(f"no usable questions for databases: {', '.join(chosen) or '(none)'}")

    if preset == SPIDER_DEV:  # Spider's own split: dev.json is the eval split, whole
        held = {item["question_id"] for item in items if item["question_id"].startswith("spider-dev-")}
    else:
        held = _stratified_eval(items, eval_fraction, random.Random(f"sqlenv-spider-split-{seed}"))
    splits: dict[str, list[dict]] = {"train": [], "eval": []}
    for item in items:
        item["split"] = "eval" if item["question_id"] in held else "train"
        splits[item["split"]].append(item)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-prepare-", dir=out.parent))
    try:
        used_dbs = sorted({i["database_name"] for i in items})
        for db_id in used_dbs:
            target = tmp / "databases" / db_id / f"{db_id}.sqlite"
            target.parent.mkdir(parents=True)
            shutil.copyfile(_db_path(source, db_id), target)
        fields = list(Question.__dataclass_fields__)
        for split, recs in splits.items():
            (tmp / f"questions_{split}.json").write_text(
                json.dumps([{k: r[k] for k in fields} for r in recs], indent=1, ensure_ascii=False))
        meta = {
            "name": name or preset or out.name,
            "source": "spider",
            "splits": list(splits),
            "counts": {s: len(r) for s, r in splits.items()},
            "dropped": sum(dropped.values()),
            "dropped_reasons": dict(sorted(dropped.items())),
            "preset": preset,
            "seed": seed,
            "eval_fraction": None if preset == SPIDER_DEV else eval_fraction,
            "split_protocol": "spider" if preset == SPIDER_DEV else "stratified",
            # Spider's dev protocol scores every eval question once: `python -m sqlenv eval` then does by default.
            "eval_episodes": "all" if preset == SPIDER_DEV else None,
            "databases": used_dbs,
            "skipped_databases": skipped_dbs,
            "summary": {
                s: {
                    "difficulty": dict(sorted(Counter(r["difficulty"] for r in recs).items())),
                    "answer_type": dict(sorted(Counter(r["answer_type"] for r in recs).items())),
                }
                for s, recs in splits.items()
            },
            "license": "Spider 1.0, CC BY-SA 4.0 (Yu et al., EMNLP 2018); do not commit",
            "build_seconds": round(time.perf_counter() - started, 3),
        }
        (tmp / "dataset.json").write_text(json.dumps(meta, indent=1))
        os.chmod(tmp, 0o755)
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return DatasetInfo.from_dir(out)


# ---- download ---------------------------------------------------------------------------------------


def _spider_root_in(names: list[str]) -> str:
    """The folder prefix inside the archive that holds tables.json, train_spider.json and dev.json."""
    candidates = sorted(
        (str(PurePosixPath(n).parent) for n in names if PurePosixPath(n).name == "tables.json"),
        key=lambda p: (p.count("/"), p),
    )
    present = set(names)
    for parent in candidates:
        prefix = "" if parent == "." else parent + "/"
        if all(prefix + f in present for f in REQUIRED_FILES) and any(
            n.startswith(prefix + "database/") and n.endswith(".sqlite") for n in names
        ):
            return prefix
    raise SpiderArchiveError(
        "archive is not a Spider 1.0 zip: no folder holding tables.json, train_spider.json, dev.json and database/*.sqlite"
    )


def _fetch(url: str, dest: Path, timeout_s: float) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "sqlenv"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp, open(dest, "wb") as fh:
            shutil.copyfileobj(resp, fh, length=1 << 20)
    except urllib.error.HTTPError as err:
        raise SpiderError(f"download failed from {url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise SpiderError(f"download failed from {url}: {reason}") from None


def download_spider(
    url: str = OFFICIAL_URL,
    out: str | Path = "data/spider_source",
    *,
    sha256: str | None = None,
    overwrite: bool = False,
    timeout_s: float = 60.0,
) -> Path:
    """Download the Spider 1.0 zip from `url`, check it, and extract what `prepare_spider` needs to `out`.

    Args:
        url: archive URL (the official one by default; any http(s) or file URL serving the same zip works).
        out: the Spider directory to create: `database/<db>/<db>.sqlite`, `train_spider.json`, `dev.json`,
            `tables.json` (plus `train_others.json` when present). Under the gitignored `data/` by default.
        sha256: optional expected checksum of the zip; a mismatch is an error.
        overwrite: replace an existing complete Spider directory at `out` (default: return it untouched).
        timeout_s: network timeout per read.

    Returns:
        `out`, ready to pass to `prepare_spider` as its source.
    """
    out = Path(out).expanduser()
    if out.exists():
        if all((out / f).is_file() for f in REQUIRED_FILES) and (out / "database").is_dir():
            if not overwrite:
                return out
        elif not out.is_dir() or any(out.iterdir()):
            raise SpiderError(f"{out} exists and is not a Spider directory; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-download-", dir=out.parent))
    try:
        archive = work / "spider.zip"
        _fetch(url, archive, timeout_s)
        if sha256:
            digest = hashlib.sha256()
            with open(archive, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
            if digest.hexdigest().lower() != sha256.lower():
                raise SpiderArchiveError(f"checksum mismatch: expected sha256 {sha256}, got {digest.hexdigest()}")
        if not zipfile.is_zipfile(archive):
            head = archive.read_bytes()[:64]
            hint = " (got an HTML page; the host may need a confirmation step)" if b"<" in head[:16] else ""
            raise SpiderArchiveError(f"downloaded file is not a zip archive ({archive.stat().st_size} bytes){hint}")
        extracted = work / "extracted"
        try:
            with zipfile.ZipFile(archive) as zf:
                names = zf.namelist()
                prefix = _spider_root_in(names)
                wanted = [
                    n for n in names
                    if n.startswith(prefix)
                    and (
                        n[len(prefix):] in REQUIRED_FILES + ("train_others.json",)
                        or (n[len(prefix):].startswith("database/") and n.endswith(".sqlite"))
                    )
                ]
                for name in wanted:
                    rel = PurePosixPath(name[len(prefix):])
                    if rel.is_absolute() or ".." in rel.parts:
                        raise SpiderArchiveError(f"unsafe path in archive: {name}")
                    info = zf.getinfo(name)
                    target = extracted.joinpath(*rel.parts)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, open(target, "wb") as dst:  # CRC is checked as it is read
                        shutil.copyfileobj(src, dst, length=1 << 20)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as err:
            raise SpiderArchiveError(f"corrupt zip archive: {err}") from None
        for f in REQUIRED_FILES:
            try:
                json.loads((extracted / f).read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
                raise SpiderArchiveError(f"{f} in the archive is not valid JSON: {str(err).splitlines()[0]}") from None
        if out.exists():
            os.replace(out, work / "old")
        os.replace(extracted, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out
