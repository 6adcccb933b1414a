"""`check_env(env)`: a gymnasium-style checker of the `sqlenv.protocol.Environment` interface.

It plays a few short episodes and raises `EnvCheckError` naming the first broken promise: the environment has
the protocol's members, reset returns a well-formed observation, a seed makes reset deterministic, reset's
`step_budget` and `episode_id` apply to that episode only, every action type works, bad actions become error
observations (never exceptions) and use a step, ANSWER terminates the episode and the budget truncates it
(`done` is always `terminated or truncated`), a step after the end changes nothing, and the transcript agrees.
It checks `SQLEnvironment` and `sqlenv.server.remote.RemoteSQLEnvironment` alike.

`build_toy_dataset(out_dir)` writes a two-database, ten-question prepared dataset to check against:

    questions_path, db_dir = build_toy_dataset(tmp_dir)
    check_env(SQLEnvironment(questions_path, db_dir))
"""

from __future__ import annotations

from typing import Any

from sqlenv.protocol import Environment
from sqlenv.transcript import validate_transcript
from sqlenv.types import ACTION_TYPES, SQLAction, SQLObservation


class EnvCheckError(AssertionError):
    """An environment breaks the SQLEnv contract."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise EnvCheckError(message)


def _check_observation(obs: Any, where: str) -> None:
    _require(isinstance(obs, SQLObservation), f"{where}: expected SQLObservation, got {type(obs).__name__}")
    for name, kind in (("question", str), ("schema_info", str), ("result", str), ("error", str),
                       ("step_count", int), ("budget_remaining", int), ("action_history", list),
                       ("done", bool), ("terminated", bool), ("truncated", bool), ("reward", float)):
        value = getattr(obs, name, None)
        if kind is float and isinstance(value, int):
            value = float(value)
        _require(isinstance(value, kind), f"{where}: observation.{name} should be {kind.__name__}, got {value!r}")
    _require(obs.budget_remaining >= 0, f"{where}: negative budget_remaining")
    _require(obs.done == (obs.terminated or obs.truncated) and not (obs.terminated and obs.truncated),
             f"{where}: done={obs.done} is not exactly one of terminated={obs.terminated}, truncated={obs.truncated}")
    obs.to_dict()  # must serialise


def _first_table(env: Any, obs: SQLObservation) -> str:
    tables = getattr(env, "tables", None)
    if tables:
        return tables[0]
    line = obs.schema_info.splitlines()[0] if obs.schema_info else ""
    return line.split(":", 1)[-1].split(",")[0].strip()


def check_env(env: Any, seed: int = 0) -> list[str]:
    """Check `env` against the `sqlenv.protocol.Environment` contract; raise `EnvCheckError` on the first failure.

    Returns the list of checks that passed (handy for printing). The env is left after a finished episode.
    """
    passed: list[str] = []

    # 0. the protocol's members are there (what adapters may use, and nothing else).
    if not isinstance(env, Environment):
        missing = [name for name in vars(Environment) if not name.startswith("_") and not hasattr(env, name)]
        raise EnvCheckError(f"{type(env).__name__} lacks members of sqlenv.protocol.Environment: {', '.join(missing)}")
    passed.append("has the Environment protocol's members")

    # 1. reset returns a fresh observation with the question and table names.
    obs = env.reset(seed=seed)
    _check_observation(obs, "reset()")
    _require(bool(obs.question), "reset(): empty question")
    _require(obs.step_count == 0 and not obs.done and obs.reward == 0.0, "reset(): not a fresh episode")
    _require(obs.budget_remaining > 0, "reset(): no step budget")
    default_budget = obs.budget_remaining
    table = _first_table(env, obs)
    _require(bool(table) and table in obs.schema_info, "reset(): schema_info does not list the tables")
    passed.append("reset returns a fresh observation")

    # 2. determinism: the same seed gives the same question and observation.
    again = env.reset(seed=seed)
    _require(again.question == obs.question and again.schema_info == obs.schema_info,
             "reset(seed=...) is not deterministic")
    passed.append("reset(seed) is deterministic")

    # 2b. reset's step_budget and episode_id apply to that episode only.
    named = env.reset(seed=seed, step_budget=2, episode_id="check-env-episode")
    _check_observation(named, "reset(step_budget=2, episode_id=...)")
    _require(named.budget_remaining == 2 and env.state.step_budget == 2, "reset(step_budget=2) did not set the budget")
    _require(env.state.episode_id == "check-env-episode", "reset(episode_id=...) did not name the episode")
    env.step(SQLAction("QUERY", "SELECT 1"))
    o = env.step(SQLAction("QUERY", "SELECT 2"))
    _require(o.done and o.truncated and not o.terminated, "the step budget of reset(step_budget=2) did not truncate")
    again = env.reset(seed=seed)
    _require(again.budget_remaining == default_budget and env.state.episode_id != "check-env-episode",
             "reset(step_budget=..., episode_id=...) leaked into the next episode")
    with_bad_budget = None
    try:
        with_bad_budget = env.reset(seed=seed, step_budget=0)
    except ValueError:
        pass
    _require(with_bad_budget is None, "reset(step_budget=0) should raise ValueError")
    obs = env.reset(seed=seed)
    passed.append("reset(step_budget, episode_id) apply to one episode")

    # 3. every action type runs and counts a step.
    budget = obs.budget_remaining
    actions = [SQLAction("DESCRIBE", table), SQLAction("sample", table),
               SQLAction("QUERY", f'SELECT count(*) FROM "{table}"')]
    for i, action in enumerate(actions, 1):
        o = env.step(action)
        _check_observation(o, f"step({action.action_type})")
        _require(o.error == "", f"step({action.action_type} {action.argument}) failed: {o.error}")
        _require(o.step_count == i and o.budget_remaining == budget - i, f"step({action.action_type}): step not counted")
        _require(bool(o.result), f"step({action.action_type}): empty result")
    described = env.last_observation.schema_info
    _require(len(described.splitlines()) > 1, "DESCRIBE did not add columns to schema_info")
    passed.append("DESCRIBE, SAMPLE, QUERY run and count steps")

    # 4. bad actions are error observations that use a step, never exceptions.
    bad = [SQLAction("FLY", "away"), SQLAction("QUERY", ""), SQLAction("QUERY", "DROP TABLE x"),
           SQLAction("QUERY", "SELECT 1; SELECT 2"), SQLAction("DESCRIBE", "no_such_table_xyz"),
           SQLAction("QUERY", "SELECT \x00"), SQLAction("QUERY", "x" * 100_000)]
    steps = env.last_observation.step_count
    for action in bad:
        try:
            o = env.step(action)
        except Exception as err:  # the promise is: never raises
            raise EnvCheckError(f"step({action.action_type} {action.argument[:30]!r}) raised {err!r}") from err
        _check_observation(o, f"bad step({action.action_type})")
        if o.done:
            break
        steps += 1
        _require(o.error != "", f"bad action {action.action_type} {action.argument[:30]!r} gave no error")
        _require(o.step_count == steps, "a bad action did not use a step")
    passed.append("bad actions give error observations and use a step")

    # 5. ANSWER ends the episode; a step afterwards is an error and changes nothing.
    if not env.last_observation.done:
        o = env.step(SQLAction("ANSWER", "42"))
        _check_observation(o, "step(ANSWER)")
        _require(o.done, "ANSWER did not end the episode")
        _require(o.terminated and not o.truncated, "ANSWER should terminate the episode, not truncate it")
    final = env.last_observation
    after = env.step(SQLAction("QUERY", "SELECT 1"))
    _require(after.error != "" and after.reward == 0.0, "a step after the end should be an error with reward 0")
    _require(after.step_count == final.step_count and env.last_observation is final,
             "a step after the end changed the episode")
    passed.append("ANSWER ends the episode; later steps change nothing")

    # 6. the budget ends an episode that never answers.
    obs = env.reset(seed=seed + 1)
    for _ in range(obs.budget_remaining):
        o = env.step(SQLAction("QUERY", "SELECT 1"))
    _require(o.done and o.budget_remaining == 0, "running out of budget did not end the episode")
    _require(o.truncated and not o.terminated, "running out of budget should truncate the episode, not terminate it")
    passed.append("the step budget truncates the episode")

    # 7. reward breakdown and transcript are exposed.
    breakdown = getattr(env, "reward_breakdown", None)
    _require(breakdown is not None and hasattr(breakdown, "to_dict"), "env.reward_breakdown missing")
    transcript = env.transcript()
    try:
        validate_transcript(transcript)
    except ValueError as err:
        raise EnvCheckError(f"transcript(): {err}") from None
    _require(transcript["outcome"] == "budget_exhausted", "transcript outcome should be budget_exhausted")
    _require(abs(transcript["total_reward"] - sum(s["reward"] for s in transcript["steps"])) < 1e-6,
             "transcript total_reward is not the sum of its step rewards")
    last = transcript["steps"][-1]
    _require(last.get("done") and last.get("truncated") and not last.get("terminated"),
             "the transcript's last step should record the truncation")
    passed.append("reward breakdown and transcript are consistent")
    _require(all(t in ACTION_TYPES for t in ("DESCRIBE", "SAMPLE", "QUERY", "ANSWER")), "action types changed")
    return passed


# ------------------------------------------------------------------------------------------ toy dataset

_TOY_SCHEMAS = {
    "music": """
        CREATE TABLE stadium (stadium_id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT, capacity INTEGER);
        CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT, age INTEGER,
                             net_worth REAL);
        CREATE TABLE concert (concert_id INTEGER PRIMARY KEY, title TEXT, year INTEGER,
                              stadium_id INTEGER REFERENCES stadium(stadium_id),
                              singer_id INTEGER REFERENCES singer(singer_id));
    """,
    "shop": """
        CREATE TABLE customers (customer_id INTEGER PRIMARY KEY, name TEXT, city TEXT);
        CREATE TABLE products (product_id INTEGER PRIMARY KEY, title TEXT, price REAL, category TEXT);
        CREATE TABLE orders (order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(customer_id),
                             product_id INTEGER REFERENCES products(product_id), quantity INTEGER);
    """,
}

# (question_id, database, question, gold SQL, answer_type, difficulty, tables_involved)
_TOY_QUESTIONS = [
    ("music_q1", "music", "How many singers are there?", "SELECT count(*) FROM singer", "integer", "easy",
     ["singer"]),
    ("music_q2", "music", "What is the average age of singers from France?",
     "SELECT avg(age) FROM singer WHERE country = 'France'", "float", "easy", ["singer"]),
    ("music_q3", "music", "Which stadium has the largest capacity?",
     "SELECT name FROM stadium ORDER BY capacity DESC LIMIT 1", "string", "medium", ["stadium"]),
    ("music_q4", "music", "List the names of singers older than 40.",
     "SELECT name FROM singer WHERE age > 40", "list", "easy", ["singer"]),
    ("music_q5", "music", "For each stadium, how many concerts were held there? Order by stadium name.",
     "SELECT T1.name, count(*) FROM stadium AS T1 JOIN concert AS T2 ON T1.stadium_id = T2.stadium_id "
     "GROUP BY T1.stadium_id ORDER BY T1.name", "table", "medium", ["stadium", "concert"]),
    ("music_q6", "music", "Which singers from Atlantis have performed?",
     "SELECT DISTINCT T1.name FROM singer AS T1 JOIN concert AS T2 ON T1.singer_id = T2.singer_id "
     "WHERE T1.country = 'Atlantis'", "list", "hard", ["singer", "concert"]),
    ("shop_q1", "shop", "How many orders were placed by customers from Lyon?",
     "SELECT count(*) FROM orders AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
     "WHERE T2.city = 'Lyon'", "integer", "medium", ["orders", "customers"]),
    ("shop_q2", "shop", "What is the total price of all products in the 'tools' category?",
     "SELECT sum(price) FROM products WHERE category = 'tools'", "float", "easy", ["products"]),
    ("shop_q3", "shop", "Show each category with its number of products.",
     "SELECT category, count(*) FROM products GROUP BY category", "table", "medium", ["products"]),
    ("shop_q4", "shop", "Which customers bought more than 20 items in total?",
     "SELECT T2.name FROM orders AS T1 JOIN customers AS T2 ON T1.customer_id = T2.customer_id "
     "GROUP BY T2.customer_id HAVING sum(T1.quantity) > 20", "list", "extra", ["orders", "customers"]),
]


def _toy_rows(db: str, rng) -> dict[str, list[tuple]]:
    first = ["Ada", "Bruno", "Chen", "Dana", "Emil", "Fatou", "Goran", "Hana", "Ivo", "Jana", "Kofi", "Lena"]
    last = ["Berg", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Horvat", "Ito", "Jensen", "Kowalski"]
    if db == "music":
        countries = ["France", "Japan", "Brazil", "Canada", "Kenya"]
        stadiums = [(i, f"{name} Arena", city, cap) for i, (name, city, cap) in enumerate(
            [("North", "Oslo", 52000), ("Harbor", "Lisbon", 31000), ("Summit", "Denver", 76125),
             ("Riverside", "Lyon", 18500), ("Central", "Osaka", 45000)], 1)]
        singers = [(i, f"{rng.choice(first)} {rng.choice(last)}", rng.choice(countries), rng.randint(19, 67),
                    round(rng.uniform(0.5, 90.0), 2)) for i in range(1, 31)]
        concerts = [(i, f"Tour {2000 + i % 20} #{i}", rng.randint(2001, 2023), rng.randint(1, 5),
                     rng.randint(1, 30)) for i in range(1, 61)]
        return {"stadium": stadiums, "singer": singers, "concert": concerts}
    cities = ["Lyon", "Porto", "Gdansk", "Leeds", "Turin"]
    categories = ["tools", "garden", "kitchen", "toys"]
    customers = [(i, f"{rng.choice(first)} {rng.choice(last)}", rng.choice(cities)) for i in range(1, 41)]
    products = [(i, f"{rng.choice(['Basic', 'Pro', 'Eco', 'Mini'])} {rng.choice(['drill', 'hose', 'pan', 'kite'])}"
                 f" {i}", round(rng.uniform(2.0, 250.0), 2), rng.choice(categories)) for i in range(1, 26)]
    orders = [(i, rng.randint(1, 40), rng.randint(1, 25), rng.randint(1, 9)) for i in range(1, 201)]
    return {"customers": customers, "products": products, "orders": orders}


def _shape(rows: list[tuple], answer_type: str) -> Any:
    if answer_type in ("integer", "float", "string"):
        return rows[0][0] if rows else None
    if answer_type == "list":
        return [r[0] for r in rows]
    return [list(r) for r in rows]


def build_toy_dataset(out_dir, seed: int = 0):
    """Write a tiny prepared dataset (2 databases, 10 questions over every answer type, one with an empty
    gold result) to `out_dir` and return `(questions_path, db_dir)`.

    Meant for checking environments and for tests: real SQLite files with foreign keys, gold answers
    computed by running the gold SQL, the same layout as a prepared dataset (plus `dataset.json`).
    """
    import json
    import random
    import sqlite3
    from pathlib import Path

    rng = random.Random(seed)
    out = Path(out_dir)
    db_dir = out / "databases"
    for db, schema in _TOY_SCHEMAS.items():
        path = db_dir / db / f"{db}.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        conn = sqlite3.connect(path)
        conn.executescript(schema)
        for table, rows in _toy_rows(db, rng).items():
            conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
        conn.commit()
        conn.close()
    questions = []
    for qid, db, text, sql, answer_type, difficulty, tables in _TOY_QUESTIONS:
        conn = sqlite3.connect(db_dir / db / f"{db}.sqlite")
        rows = conn.execute(sql).fetchall()
        conn.close()
        questions.append({"question_id": qid, "question_text": text, "database_name": db, "gold_sql": sql,
                          "gold_answer": _shape(rows, answer_type), "answer_type": answer_type,
                          "difficulty": difficulty, "tables_involved": tables, "split": "train"})
    questions_path = out / "questions_train.json"
    questions_path.write_text(json.dumps(questions, indent=1), encoding="utf-8")
    (out / "dataset.json").write_text(json.dumps(
        {"name": out.name, "source": "toy", "splits": ["train"], "counts": {"train": len(questions)},
         "dropped": 0}, indent=1), encoding="utf-8")
    return questions_path, db_dir
