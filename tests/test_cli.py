"""`python -m sqlenv …` run as a subprocess: data, play (piped stdin), eval, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A data root holding the built-in dataset (built once, by the CLI itself)."""
    root = tmp_path_factory.mktemp("cli_data")
    res = _run(["data", "build-builtin"], root)
    assert res.returncode == 0, res.stderr
    assert (root / "builtin" / "dataset.json").exists()
    return root


def _run(args, data_root, stdin="", cwd=None):
    env = {**os.environ, "SQLENV_DATA_DIR": str(data_root), "PYTHONPATH": str(REPO)}
    env.pop("SQLENV_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "sqlenv", *args], input=stdin, capture_output=True, text=True, env=env,
        cwd=cwd or REPO, timeout=300,
    )


def _assert_one_line_error(res, *needles):
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr and lines[0].startswith("sqlenv")
    for needle in needles:
        assert needle in lines[0], lines[0]


def _questions(data_dir, split="eval"):
    return json.loads((data_dir / "builtin" / f"questions_{split}.json").read_text())


# --- eval ------------------------------------------------------------------------------------------


def test_eval_json_is_one_object(data_dir):
    res = _run(["eval", "--dataset", "builtin", "--split", "eval", "--policy", "oracle", "--episodes", "6",
                "--seed", "0", "--json"], data_dir)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)  # the whole stdout is exactly one JSON object
    assert isinstance(data, dict)
    assert data["n_episodes"] == 6 and data["success_rate"] == 1.0
    assert 1.0 <= data["avg_reward"] <= 1.4 and data["avg_steps"] >= 2
    assert data["policy"] == "oracle" and data["dataset"] == "builtin" and data["split"] == "eval"


def test_eval_table_and_transcripts_file(data_dir, tmp_path):
    out = tmp_path / "t.jsonl"
    res = _run(["eval", "--dataset", "builtin", "--split", "eval", "--policy", "random", "--episodes", "5",
                "--seed", "3", "--transcripts", str(out)], data_dir)
    assert res.returncode == 0, res.stderr
    assert "success rate" in res.stdout and "avg reward" in res.stdout and "policy random" in res.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 5 and [ep["seed"] for ep in lines] == [3, 4, 5, 6, 7]
    assert all(ep["policy"] == "random" for ep in lines)


def test_eval_on_a_dataset_path(data_dir, tmp_path):
    # A path works wherever a name does, from any working directory.
    res = _run(["eval", "--dataset", str(data_dir / "builtin"), "--split", "eval_unseen_db", "--policy", "oracle",
                "--episodes", "3", "--json"], tmp_path / "elsewhere", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["success_rate"] == 1.0


def test_eval_all_questions_and_saved_evaluation(data_dir, tmp_path):
    from sqlenv.evaluation.saved import load_evaluation

    out = tmp_path / "evaluations" / "oracle-eval"
    res = _run(["eval", "--dataset", "builtin", "--split", "eval", "--policy", "oracle", "--episodes", "all",
                "--out", str(out), "--json"], data_dir)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    questions = _questions(data_dir)
    assert data["n_episodes"] == len(questions) and data["question_order"] == "all"
    assert data["success_rate"] == data["execution_accuracy"] == 1.0
    assert sum(c["n"] for c in data["breakdown"]["hardness"].values()) == len(questions)
    saved = load_evaluation(out)
    assert [ep["question_id"] for ep in saved.episodes] == [q["question_id"] for q in questions]
    assert saved.meta["summary"] == {k: v for k, v in data.items() if k not in ("dataset", "split", "step_budget",
                                                                                 "question_order")}
    assert (saved.meta["dataset"], saved.meta["split"], saved.meta["policy"]) == ("builtin", "eval", "oracle")
    # saving again replaces it; a folder that is not a saved evaluation is refused before playing
    res = _run(["eval", "--policy", "random", "--episodes", "3", "--seed", "4", "--out", str(out)], data_dir)
    assert res.returncode == 0, res.stderr
    assert "saved" in res.stdout and "execution acc" in res.stdout and "hardness" in res.stdout
    again = load_evaluation(out)
    assert again.meta["policy"] == "random" and [ep["seed"] for ep in again.episodes] == [4, 5, 6]
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    _assert_one_line_error(_run(["eval", "--out", str(tmp_path / "busy")], data_dir), "not a saved evaluation")
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "args, needles",
    [
        (["eval", "--dataset", "nope", "--split", "eval"], ["nope"]),
        # A Spider preset not prepared yet: the command that prepares it, not only "unknown".
        (["eval", "--dataset", "spider_dev"], ["spider_dev", "python -m sqlenv data prepare spider --preset spider_dev"]),
        (["play", "--dataset", "spider10"], ["python -m sqlenv data prepare spider --preset spider10"]),
        (["eval", "--dataset", "/no/such/dir", "--split", "eval"], ["/no/such/dir"]),
        (["eval", "--dataset", "builtin", "--split", "validation"], ["validation"]),
        (["eval", "--episodes", "abc"], ["--episodes"]),
        (["eval", "--episodes", "0"], ["--episodes"]),
        (["eval", "--episodes", "some"], ["--episodes"]),
        (["eval", "--policy", "genius"], ["--policy"]),
        (["eval", "--seed", "x"], ["--seed"]),
        (["eval", "--bogus"], ["--bogus"]),
        ([], []),
        (["dance"], ["dance"]),
        (["data"], []),
        (["data", "prepare", "wikisql"], ["wikisql"]),
        (["play", "--dataset", "nope"], ["nope"]),
        (["play", "--dataset", "builtin", "--split", "nope"], ["nope"]),
        (["play", "--dataset", "builtin", "--question-id", "no-such-question"], ["no-such-question"]),
        (["data", "prepare", "spider", "--source", "/no/such/spider", "--preset", "spider10"], ["/no/such/spider"]),
        (["data", "prepare", "spider", "--preset", "spider10", "--db-ids", "a"], []),
    ],
)
def test_bad_input_is_one_line_exit_2(data_dir, args, needles):
    _assert_one_line_error(_run(args, data_dir), *needles)


def test_help_works(data_dir):
    res = _run(["eval", "--help"], data_dir)
    assert res.returncode == 0 and "--policy" in res.stdout


# --- play ------------------------------------------------------------------------------------------


def test_play_with_piped_input_solves_a_question(data_dir):
    from sqlenv.scoring.verifier import format_answer

    q = _questions(data_dir)[0]
    answer = format_answer(q["gold_answer"], q["answer_type"])
    if "\n" in answer:  # table answers span lines; the terminal takes one line, so pick a one-line question
        q = next(x for x in _questions(data_dir) if "\n" not in format_answer(x["gold_answer"], x["answer_type"]))
        answer = format_answer(q["gold_answer"], q["answer_type"])
    table = q["tables_involved"][0]
    stdin = f"help\nDESCRIBE {table}\nQUERY {q['gold_sql']}\nANSWER {answer}\n"
    res = _run(["play", "--dataset", "builtin", "--split", "eval", "--question-id", q["question_id"]], data_dir, stdin)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert q["question_text"] in out
    assert "DESCRIBE" in out and "QUERY" in out  # the help text
    assert "reward" in out and "operational" in out and "progress" in out and "terminal" in out
    assert "budget left 14" in out and "budget left 12" in out
    assert "outcome: correct" in out
    assert q["gold_sql"] in out and "gold answer" in out


def test_play_table_answer_on_one_line(data_dir):
    from sqlenv.scoring.verifier import format_answer

    q = next(x for x in _questions(data_dir) if "\n" in format_answer(x["gold_answer"], x["answer_type"]))
    typed = format_answer(q["gold_answer"], q["answer_type"]).replace("\n", "\\n")  # rows joined by a typed \n
    res = _run(["play", "--split", "eval", "--question-id", q["question_id"]], data_dir, f"ANSWER {typed}\n")
    assert res.returncode == 0, res.stderr
    assert "outcome: correct" in res.stdout


def test_play_wrong_answer_quit_and_end_of_input(data_dir):
    q = _questions(data_dir)[1]
    res = _run(["play", "--question-id", q["question_id"], "--split", "eval"], data_dir, "DESCRIBE no_such_table\nANSWER 123456789\n")
    assert res.returncode == 0, res.stderr
    assert "error:" in res.stdout and "outcome: wrong_answer" in res.stdout and q["gold_sql"] in res.stdout

    res = _run(["play", "--question-id", q["question_id"], "--split", "eval"], data_dir, "quit\n")
    assert res.returncode == 0 and "outcome: unfinished" in res.stdout and q["gold_sql"] in res.stdout

    res = _run(["play", "--seed", "4"], data_dir, "FROB x\n")  # unknown action: an error observation, a step used
    assert res.returncode == 0 and "error:" in res.stdout and "end of input" in res.stdout


# --- data ------------------------------------------------------------------------------------------


def test_data_list(data_dir):
    res = _run(["data", "list"], data_dir)
    assert res.returncode == 0, res.stderr
    assert "builtin" in res.stdout and "eval_unseen_db" in res.stdout


def test_data_prepare_spider_db_ids_then_eval(spider_source, tmp_path):
    out = tmp_path / "two"
    res = _run(["data", "prepare", "spider", "--source", str(spider_source), "--db-ids", "concert_singer,pets_1",
                "--out", str(out)], tmp_path)
    assert res.returncode == 0, res.stderr
    assert (out / "databases" / "pets_1" / "pets_1.sqlite").exists()
    res = _run(["eval", "--dataset", str(out), "--split", "eval", "--policy", "oracle", "--episodes", "5", "--json"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["success_rate"] == 1.0
    # Prepared under the data root, it resolves by name and is listed.
    res = _run(["data", "prepare", "spider", "--source", str(spider_source), "--db-ids", "pets_1",
                "--out", str(tmp_path / "data" / "pets")], tmp_path / "data")
    assert res.returncode == 0, res.stderr
    res = _run(["data", "list"], tmp_path / "data")
    assert "pets" in res.stdout
    res = _run(["eval", "--dataset", "pets", "--policy", "random", "--episodes", "3", "--json"], tmp_path / "data")
    assert res.returncode == 0 and json.loads(res.stdout)["n_episodes"] == 3


def test_data_prepare_unknown_db_id(spider_source, tmp_path):
    res = _run(["data", "prepare", "spider", "--source", str(spider_source), "--db-ids", "no_such_db",
                "--out", str(tmp_path / "x")], tmp_path)
    _assert_one_line_error(res, "no_such_db")


def test_data_download_bad_url_is_one_line(tmp_path):
    res = _run(["data", "download", "spider", "--url", "http://127.0.0.1:9/spider.zip", "--out", str(tmp_path / "s")], tmp_path)
    assert res.returncode != 0
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


# --- package surface -------------------------------------------------------------------------------


def test_package_exports_are_lazy_and_ml_free(tmp_path):
    code = (
        "import sys, sqlenv\n"
        "assert 'sqlenv.environment' not in sys.modules, 'import sqlenv must stay cheap'\n"
        "names = ['SQLEnvironment', 'SQLAction', 'SQLObservation', 'verify_answer', 'evaluate', 'EvaluationResult',\n"
        "         'RandomPolicy', 'OraclePolicy', 'RewardConfig', 'SandboxSettings', 'resolve_dataset']\n"
        "assert set(names) <= set(sqlenv.__all__) and set(names) <= set(dir(sqlenv))\n"
        "objs = [getattr(sqlenv, n) for n in names]\n"
        "import sqlenv.cli, sqlenv.evaluation.evaluate, sqlenv.evaluation.policies\n"
        "import sqlenv.data.spider, sqlenv.data.builtin\n"
        "for n in sqlenv.__all__: getattr(sqlenv, n)\n"
        "try:\n    sqlenv.nope\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit('no AttributeError')\n"
        "ml = sorted(m for m in ('torch', 'transformers', 'trl', 'gradio', 'pandas', 'numpy') if m in sys.modules)\n"
        "assert not ml, ml\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def _tiny_spider_zip(tmp_path) -> bytes:
    """A Spider-layout zip from two real (tiny) SQLite files built here."""
    import io
    import sqlite3
    import zipfile

    files = {}
    for db, rows in {"choir": [(1, "Ana", 31), (2, "Ben", 45), (3, "Cy", 27)], "band": [(1, "Dee", 22), (2, "Eli", 38)]}.items():
        path = tmp_path / f"{db}.sqlite"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT, age INTEGER)")
            conn.executemany("INSERT INTO singer VALUES (?, ?, ?)", rows)
        files[f"database/{db}/{db}.sqlite"] = path.read_bytes()
    questions = [{"db_id": db, "question": f"How many singers are older than {age}?",
                  "query": f"SELECT count(*) FROM singer WHERE age > {age}"} for db in ("choir", "band") for age in (20, 25, 30, 35, 40)]
    files["tables.json"] = json.dumps([{"db_id": db, "table_names_original": ["singer"]} for db in ("choir", "band")]).encode()
    files["train_spider.json"] = json.dumps(questions[:7]).encode()
    files["dev.json"] = json.dumps(questions[7:]).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr("spider_data/" + name, data)
    return buf.getvalue()


def test_data_download_then_prepare_then_eval(tmp_path):
    import functools
    import http.server
    import threading

    site = tmp_path / "site"
    site.mkdir()
    (site / "spider.zip").write_bytes(_tiny_spider_zip(tmp_path))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/spider.zip"
        res = _run(["data", "download", "spider", "--url", url, "--out", str(tmp_path / "spider")], tmp_path)
        assert res.returncode == 0, res.stderr
        assert (tmp_path / "spider" / "database" / "choir" / "choir.sqlite").is_file()
        res = _run(["data", "download", "spider", "--url", url.replace("spider.zip", "missing.zip"),
                    "--out", str(tmp_path / "other")], tmp_path)
        assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    finally:
        httpd.shutdown()
        httpd.server_close()
    res = _run(["data", "prepare", "spider", "--source", str(tmp_path / "spider"), "--db-ids", "all",
                "--out", str(tmp_path / "data" / "tiny")], tmp_path / "data")
    assert res.returncode == 0, res.stderr
    res = _run(["eval", "--dataset", "tiny", "--split", "train", "--policy", "oracle", "--episodes", "4", "--json"], tmp_path / "data")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["success_rate"] == 1.0


def test_eval_json_builds_builtin_on_first_use_and_stays_one_object(tmp_path):
    res = _run(["eval", "--policy", "random", "--episodes", "2", "--json"], tmp_path / "fresh")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["n_episodes"] == 2  # nothing else on stdout, even while building
    assert (tmp_path / "fresh" / "builtin" / "dataset.json").exists()
