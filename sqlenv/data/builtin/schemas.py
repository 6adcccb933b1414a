"""The built-in databases: their schemas (with the roles question templates need) and seeded row generators.

Each table declares the role of its columns: `name` (a unique label questions can quote: "artist Nova Reed"),
`cat` (a categorical column with a handful of values: "with genre Jazz"), `num` (a number to filter, order
and aggregate), `fk` (a foreign key) or `pk`. Relations (`Rel`) name the foreign keys with a verb phrase
("albums *by* artist X"), `Path2` a two-hop chain ("tracks *by* artist X").
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from sqlenv.data.builtin import pools

Gen = Callable[[random.Random, int], Any]


@dataclass
class Col:
    name: str
    sqltype: str  # INTEGER, REAL, TEXT
    role: str  # pk, name, cat, num, fk, other
    gen: Gen | None = None
    ref: str | None = None  # fk: the parent table
    label: str | None = None  # how questions call it (default: the name with spaces)

    @property
    def words(self) -> str:
        return self.label or self.name.replace("_", " ")


@dataclass
class Table:
    name: str
    noun: str
    plural: str
    rows: int
    cols: list[Col]

    def col(self, role: str) -> list[Col]:
        return [c for c in self.cols if c.role == role]

    @property
    def pk(self) -> Col | None:
        found = self.col("pk")
        return found[0] if found else None

    @property
    def name_col(self) -> Col | None:
        found = self.col("name")
        return found[0] if found else None


@dataclass
class Rel:
    child: str
    fk: str
    parent: str
    verb: str  # "{child plural} {verb} {parent noun} X"


@dataclass
class Path2:
    child: str
    fk: str
    mid: str
    mid_fk: str
    parent: str
    verb: str


@dataclass
class Database:
    name: str
    tables: list[Table]
    rels: list[Rel] = field(default_factory=list)
    paths: list[Path2] = field(default_factory=list)

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)


# ---- value generators -------------------------------------------------------------------------------


def unique(make: Callable[[random.Random], Any]) -> Gen:
    """Draw from `make` until a value not used before in this column comes out."""
    seen: set[Any] = set()

    def gen(rng: random.Random, i: int) -> Any:
        for _ in range(10_000):
            value = make(rng)
            if value not in seen:
                seen.add(value)
                return value
        raise RuntimeError("value pool exhausted")

    return gen


def person(rng: random.Random) -> str:
    return f"{rng.choice(pools.FIRST_NAMES)} {rng.choice(pools.LAST_NAMES)}"


def title(rng: random.Random) -> str:
    return f"{rng.choice(pools.ADJECTIVES)} {rng.choice(pools.NOUNS)}"


def band(rng: random.Random) -> str:
    return f"The {rng.choice(pools.ADJECTIVES)} {rng.choice(pools.BAND_WORDS)}"


def skewed(values: list[Any], k: int | None = None) -> Gen:
    """Categorical values with uneven frequencies (so group counts differ), from a per-build subset."""
    state: dict[str, Any] = {}

    def gen(rng: random.Random, i: int) -> Any:
        if "values" not in state:
            chosen = rng.sample(values, k) if k else list(values)
            state["values"] = chosen
            state["weights"] = [rng.uniform(0.5, 3.0) for _ in chosen]
        return rng.choices(state["values"], state["weights"])[0]

    return gen


def integer(lo: int, hi: int) -> Gen:
    return lambda rng, i: rng.randint(lo, hi)


def real(lo: float, hi: float, digits: int = 2) -> Gen:
    return lambda rng, i: round(rng.uniform(lo, hi), digits)


def pooled(values: list[Any]) -> Gen:
    """Unique values taken in a shuffled order from a fixed pool."""
    state: dict[str, list[Any]] = {}

    def gen(rng: random.Random, i: int) -> Any:
        if "order" not in state:
            state["order"] = rng.sample(values, len(values))
        return state["order"][i]

    return gen


def _pk(name: str) -> Col:
    return Col(name, "INTEGER", "pk")


def _fk(name: str, parent: str) -> Col:
    return Col(name, "INTEGER", "fk", ref=parent)


# ---- the databases ----------------------------------------------------------------------------------


def databases() -> tuple[list[Database], dict[str, Any]]:
    """Fresh specs and lookup tables (generators hold per-build state, so call this once per build)."""
    airport_codes = [a[0] for a in pools.AIRPORTS]
    airport_city = {a[0]: a[1] for a in pools.AIRPORTS}
    airport_country = {a[0]: a[2] for a in pools.AIRPORTS}
    return [
        Database(
            "music",
            [
                Table("artist", "artist", "artists", 24, [
                    _pk("artist_id"),
                    Col("name", "TEXT", "name", unique(lambda r: band(r) if r.random() < 0.4 else person(r))),
                    Col("country", "TEXT", "cat", skewed(pools.COUNTRIES, 6)),
                    Col("genre", "TEXT", "cat", skewed(pools.MUSIC_GENRES)),
                    Col("debut_year", "INTEGER", "num", integer(1965, 2020)),
                ]),
                Table("album", "album", "albums", 70, [
                    _pk("album_id"),
                    Col("title", "TEXT", "name", unique(title)),
                    _fk("artist_id", "artist"),
                    Col("release_year", "INTEGER", "num", integer(1970, 2024)),
                    Col("sales", "INTEGER", "num", integer(5, 900), label="sales"),
                ]),
                Table("track", "track", "tracks", 200, [
                    _pk("track_id"),
                    Col("title", "TEXT", "name", unique(title)),
                    _fk("album_id", "album"),
                    Col("duration", "INTEGER", "num", integer(95, 480)),
                ]),
            ],
            rels=[Rel("album", "artist_id", "artist", "by"), Rel("track", "album_id", "album", "on")],
            paths=[Path2("track", "album_id", "album", "artist_id", "artist", "by")],
        ),
        Database(
            "university",
            [
                Table("department", "department", "departments", 8, [
                    _pk("department_id"),
                    Col("name", "TEXT", "name", pooled(pools.DEPARTMENTS)),
                    Col("building", "TEXT", "cat", skewed(pools.BUILDINGS)),
                    Col("budget", "INTEGER", "num", integer(100, 2000), label="budget"),
                ]),
                Table("student", "student", "students", 60, [
                    _pk("student_id"),
                    Col("name", "TEXT", "name", unique(person)),
                    _fk("department_id", "department"),
                    Col("city", "TEXT", "cat", skewed(pools.CITIES, 6)),
                    Col("age", "INTEGER", "num", integer(18, 31)),
                    Col("gpa", "REAL", "num", real(2.0, 4.0, 2), label="gpa"),
                ]),
                Table("course", "course", "courses", 30, [
                    _pk("course_id"),
                    Col("title", "TEXT", "name", pooled(pools.COURSE_TOPICS)),
                    _fk("department_id", "department"),
                    Col("credits", "INTEGER", "num", integer(2, 8)),
                ]),
                Table("enrollment", "enrollment", "enrollments", 160, [
                    _pk("enrollment_id"),
                    _fk("student_id", "student"),
                    _fk("course_id", "course"),
                    Col("grade", "INTEGER", "num", integer(40, 100)),
                ]),
            ],
            rels=[
                Rel("student", "department_id", "department", "in"),
                Rel("course", "department_id", "department", "offered by"),
                Rel("enrollment", "student_id", "student", "made by"),
                Rel("enrollment", "course_id", "course", "in"),
            ],
            paths=[Path2("enrollment", "course_id", "course", "department_id", "department", "in courses of")],
        ),
        Database(
            "hospital",
            [
                Table("doctor", "doctor", "doctors", 16, [
                    _pk("doctor_id"),
                    Col("name", "TEXT", "name", unique(person)),
                    Col("specialty", "TEXT", "cat", skewed(pools.SPECIALTIES)),
                    Col("experience_years", "INTEGER", "num", integer(1, 40), label="experience years"),
                ]),
                Table("patient", "patient", "patients", 60, [
                    _pk("patient_id"),
                    Col("name", "TEXT", "name", unique(person)),
                    Col("city", "TEXT", "cat", skewed(pools.CITIES, 5)),
                    Col("blood_type", "TEXT", "cat", skewed(pools.BLOOD_TYPES)),
                    Col("age", "INTEGER", "num", integer(1, 95)),
                ]),
                Table("appointment", "appointment", "appointments", 160, [
                    _pk("appointment_id"),
                    _fk("doctor_id", "doctor"),
                    _fk("patient_id", "patient"),
                    Col("status", "TEXT", "cat", skewed(pools.APPOINTMENT_STATUS)),
                    Col("fee", "INTEGER", "num", integer(40, 400)),
                ]),
            ],
            rels=[
                Rel("appointment", "doctor_id", "doctor", "with"),
                Rel("appointment", "patient_id", "patient", "for"),
            ],
        ),
        Database(
            "shop",
            [
                Table("customer", "customer", "customers", 40, [
                    _pk("customer_id"),
                    Col("name", "TEXT", "name", unique(person)),
                    Col("city", "TEXT", "cat", skewed(pools.CITIES, 6)),
                    Col("segment", "TEXT", "cat", skewed(pools.SEGMENTS)),
                ]),
                Table("product", "product", "products", 30, [
                    _pk("product_id"),
                    Col("name", "TEXT", "name", pooled(pools.PRODUCT_NAMES)),
                    Col("category", "TEXT", "cat", skewed(pools.PRODUCT_CATEGORIES)),
                    Col("price", "REAL", "num", real(3, 250, 2)),
                    Col("stock", "INTEGER", "num", integer(0, 500)),
                ]),
                Table("orders", "order", "orders", 200, [
                    _pk("order_id"),
                    _fk("customer_id", "customer"),
                    _fk("product_id", "product"),
                    Col("channel", "TEXT", "cat", skewed(pools.CHANNELS)),
                    Col("quantity", "INTEGER", "num", integer(1, 12)),
                ]),
            ],
            rels=[Rel("orders", "customer_id", "customer", "placed by"), Rel("orders", "product_id", "product", "for")],
        ),
        Database(
            "flights",
            [
                Table("airline", "airline", "airlines", 10, [
                    _pk("airline_id"),
                    Col("name", "TEXT", "name", pooled(pools.AIRLINES)),
                    Col("country", "TEXT", "cat", skewed(pools.COUNTRIES, 5)),
                    Col("founded", "INTEGER", "num", integer(1925, 2015), label="founded year"),
                ]),
                Table("airport", "airport", "airports", 16, [
                    _pk("airport_id"),
                    Col("code", "TEXT", "name", pooled(airport_codes)),
                    Col("city", "TEXT", "other"),  # filled from the code below
                    Col("country", "TEXT", "cat"),
                    Col("runways", "INTEGER", "num", integer(1, 6)),
                ]),
                Table("flight", "flight", "flights", 140, [
                    _pk("flight_id"),
                    Col("flight_number", "TEXT", "name", unique(lambda r: f"{r.choice('ABCDEFGHKLMNPRSTVZ')}{r.choice('ABEKLMNPSTUXY')}{r.randint(100, 999)}"),
                        label="flight number"),
                    _fk("airline_id", "airline"),
                    _fk("origin_id", "airport"),
                    _fk("destination_id", "airport"),
                    Col("distance", "INTEGER", "num", integer(200, 9000)),
                    Col("price", "INTEGER", "num", integer(39, 1200)),
                ]),
            ],
            rels=[
                Rel("flight", "airline_id", "airline", "operated by"),
                Rel("flight", "origin_id", "airport", "departing from"),
                Rel("flight", "destination_id", "airport", "arriving at"),
            ],
        ),
        Database(
            "library",
            [
                Table("author", "author", "authors", 22, [
                    _pk("author_id"),
                    Col("name", "TEXT", "name", unique(person)),
                    Col("nationality", "TEXT", "cat", skewed(pools.COUNTRIES, 6)),
                    Col("birth_year", "INTEGER", "num", integer(1900, 1995)),
                ]),
                Table("book", "book", "books", 70, [
                    _pk("book_id"),
                    Col("title", "TEXT", "name", unique(title)),
                    _fk("author_id", "author"),
                    Col("genre", "TEXT", "cat", skewed(pools.BOOK_GENRES)),
                    Col("pages", "INTEGER", "num", integer(80, 900)),
                    Col("year", "INTEGER", "num", integer(1930, 2024), label="publication year"),
                ]),
                Table("member", "member", "members", 30, [
                    _pk("member_id"),
                    Col("name", "TEXT", "name", unique(person)),
                    Col("city", "TEXT", "cat", skewed(pools.CITIES, 5)),
                    Col("age", "INTEGER", "num", integer(12, 85)),
                ]),
                Table("loan", "loan", "loans", 150, [
                    _pk("loan_id"),
                    _fk("book_id", "book"),
                    _fk("member_id", "member"),
                    Col("days", "INTEGER", "num", integer(1, 45)),
                ]),
            ],
            rels=[
                Rel("book", "author_id", "author", "written by"),
                Rel("loan", "book_id", "book", "of"),
                Rel("loan", "member_id", "member", "made by"),
            ],
            paths=[Path2("loan", "book_id", "book", "author_id", "author", "of books by")],
        ),
        Database(
            "football",
            [
                Table("team", "team", "teams", 12, [
                    _pk("team_id"),
                    Col("name", "TEXT", "name", unique(lambda r: f"{r.choice(pools.TEAM_CITIES)} {r.choice(pools.TEAM_MASCOTS)}")),
                    Col("league", "TEXT", "cat", skewed(["Premier", "Championship", "National"])),
                    Col("founded", "INTEGER", "num", integer(1880, 2005), label="founded year"),
                ]),
                Table("player", "player", "players", 130, [
                    _pk("player_id"),
                    Col("name", "TEXT", "name", unique(person)),
                    _fk("team_id", "team"),
                    Col("position", "TEXT", "cat", skewed(pools.POSITIONS)),
                    Col("age", "INTEGER", "num", integer(17, 38)),
                    Col("goals", "INTEGER", "num", integer(0, 40)),
                ]),
                Table("coach", "coach", "coaches", 14, [
                    _pk("coach_id"),
                    Col("name", "TEXT", "name", unique(person)),
                    _fk("team_id", "team"),
                    Col("nationality", "TEXT", "cat", skewed(pools.COUNTRIES, 5)),
                    Col("salary", "INTEGER", "num", integer(50, 900)),
                ]),
            ],
            rels=[Rel("player", "team_id", "team", "playing for"), Rel("coach", "team_id", "team", "working for")],
        ),
    ], {"airport_city": airport_city, "airport_country": airport_country}


# ---- building a database file -----------------------------------------------------------------------


def generate_rows(db: Database, rng: random.Random, extra: dict[str, Any]) -> dict[str, list[tuple]]:
    """Rows for every table, parents first. ~15% of each parent's rows are never referenced (so questions
    like "how many artists have no albums" have answers) and the rest are referenced unevenly."""
    rows: dict[str, list[tuple]] = {}
    for table in db.tables:
        fk_pools: dict[str, tuple[list[int], list[float]]] = {}
        for col in table.col("fk"):
            parent_ids = [r[0] for r in rows[col.ref]]
            used = rng.sample(parent_ids, max(1, round(len(parent_ids) * 0.85)))
            fk_pools[col.name] = (sorted(used), [rng.uniform(0.3, 3.0) for _ in used])
        out = []
        for i in range(table.rows):
            record: dict[str, Any] = {}
            for col in table.cols:
                if col.role == "pk":
                    record[col.name] = i + 1
                elif col.role == "fk":
                    ids, weights = fk_pools[col.name]
                    record[col.name] = rng.choices(ids, weights)[0]
                elif col.gen is not None:
                    record[col.name] = col.gen(rng, i)
                else:
                    record[col.name] = None
            if table.name == "airport":
                record["city"] = extra["airport_city"][record["code"]]
                record["country"] = extra["airport_country"][record["code"]]
            if table.name == "flight":
                while record["destination_id"] == record["origin_id"]:
                    record["destination_id"] = rng.randint(1, len(rows["airport"]))
            out.append(tuple(record[c.name] for c in table.cols))
        rows[table.name] = out
    return rows


def write_database(db: Database, rows: dict[str, list[tuple]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        for table in db.tables:
            defs = []
            for col in table.cols:
                line = f"{col.name} {col.sqltype}"
                if col.role == "pk":
                    line += " PRIMARY KEY"
                elif col.role == "name":
                    line += " NOT NULL"
                defs.append(line)
            for col in table.col("fk"):
                parent = db.table(col.ref)
                defs.append(f"FOREIGN KEY ({col.name}) REFERENCES {parent.name}({parent.pk.name})")
            conn.execute(f"CREATE TABLE {table.name} (\n  " + ",\n  ".join(defs) + "\n)")
            marks = ", ".join("?" for _ in table.cols)
            conn.executemany(f"INSERT INTO {table.name} VALUES ({marks})", rows[table.name])
        conn.commit()
    finally:
        conn.close()
