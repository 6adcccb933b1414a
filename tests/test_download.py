"""download_spider against a real HTTP server on 127.0.0.1 serving zips built here from tiny SQLite files."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import sqlite3
import threading
import zipfile
from pathlib import Path

import pytest

from sqlenv.data.datasets import load_questions
from sqlenv.data.spider import SpiderArchiveError, SpiderError, download_spider, prepare_spider


class _Server:
    """Serves `files` (name → bytes) and counts the requests."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.requests += 1
                body = outer.files.get(self.path.lstrip("/"))
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def _sqlite_bytes(tmp_path: Path, name: str, rows: list[tuple]) -> bytes:
    path = tmp_path / f"{name}.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT, age INTEGER)")
    conn.executemany("INSERT INTO singer VALUES (?, ?, ?)", rows)
    conn.commit()
    conn.close()
    return path.read_bytes()


def _spider_zip(tmp_path: Path, prefix: str = "spider_data/", drop: tuple[str, ...] = (), extra: dict | None = None) -> bytes:
    dbs = {
        "choir": _sqlite_bytes(tmp_path, "choir", [(1, "Ana", 31), (2, "Ben", 45), (3, "Carla", 27)]),
        "band": _sqlite_bytes(tmp_path, "band", [(1, "Dee", 22), (2, "Eli", 38)]),
    }
    questions = [
        {"db_id": db, "question": f"How many singers are older than {age}?", "query": f"SELECT count(*) FROM singer WHERE age > {age}"}
        for db in dbs for age in (20, 25, 30, 35, 40)
    ]
    files = {
        "tables.json": json.dumps([{"db_id": db, "table_names_original": ["singer"]} for db in dbs]).encode(),
        "train_spider.json": json.dumps(questions[:7]).encode(),
        "dev.json": json.dumps(questions[7:]).encode(),
        "README.txt": b"not needed",
        **{f"database/{db}/{db}.sqlite": data for db, data in dbs.items()},
        "database/choir/schema.sql": b"CREATE TABLE singer (...);",
    }
    files.update(extra or {})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            if name not in drop:
                zf.writestr(prefix + name, data)
    return buf.getvalue()


def test_download_extracts_what_prepare_needs(server, tmp_path):
    archive = _spider_zip(tmp_path)
    server.files["spider.zip"] = archive
    out = download_spider(server.url("spider.zip"), tmp_path / "data" / "spider",
                          sha256=hashlib.sha256(archive).hexdigest())
    assert out == tmp_path / "data" / "spider"
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert got == ["database/band/band.sqlite", "database/choir/choir.sqlite", "dev.json", "tables.json", "train_spider.json"]
    assert [p.name for p in out.parent.iterdir()] == ["spider"]  # no temp files left
    # the extracted directory is a valid Spider source
    info = prepare_spider(out, tmp_path / "data" / "tiny", db_ids="all")
    questions = [q for s in info.splits for q in load_questions(info.questions_path(s))]
    assert len(questions) == 10 and info.meta["dropped"] == 0
    assert {q.gold_answer for q in questions if q.gold_sql.endswith("> 40")} == {1, 0}
    # already there: returned without downloading again
    before = server.requests
    assert download_spider(server.url("spider.zip"), out) == out
    assert server.requests == before


def test_archive_without_top_folder_and_overwrite(server, tmp_path):
    server.files["flat.zip"] = _spider_zip(tmp_path, prefix="")
    out = download_spider(server.url("flat.zip"), tmp_path / "spider")
    assert (out / "database" / "choir" / "choir.sqlite").is_file()
    (out / "tables.json").write_text("[]")
    download_spider(server.url("flat.zip"), out, overwrite=True)
    assert json.loads((out / "tables.json").read_text()) != []


@pytest.mark.parametrize(
    "body,message",
    [
        (b"<!DOCTYPE html><html>Google Drive - virus scan warning</html>", "not a zip archive .*HTML"),
        ("missing_dev", "not a Spider 1.0 zip"),
        ("truncated", "not a zip archive|corrupt"),
        ("corrupt_member", "corrupt zip"),
        ("bad_json", "tables.json in the archive is not valid JSON"),
        ("traversal", "unsafe path"),
    ],
)
def test_bad_archives_give_clear_errors_and_leave_nothing(server, tmp_path, body, message):
    if body == "missing_dev":
        body = _spider_zip(tmp_path, drop=("dev.json",))
    elif body == "truncated":
        body = _spider_zip(tmp_path)[:-200]
    elif body == "corrupt_member":
        good = bytearray(_spider_zip(tmp_path))
        start = good.find(b"spider_data/tables.json") + len("spider_data/tables.json")
        good[start + 5:start + 25] = b"\x00" * 20  # damage the first member's compressed data
        body = bytes(good)
    elif body == "bad_json":
        body = _spider_zip(tmp_path, extra={"tables.json": b"{not json"})
    elif body == "traversal":
        body = _spider_zip(tmp_path, extra={"database/../../../evil/evil.sqlite": b"x"})
    server.files["bad.zip"] = body
    out = tmp_path / "out" / "spider"
    with pytest.raises(SpiderArchiveError, match=message) as err:
        download_spider(server.url("bad.zip"), out)
    assert "\n" not in str(err.value)
    assert not out.exists()
    assert list(out.parent.iterdir()) == []


def test_checksum_mismatch_and_http_errors(server, tmp_path):
    server.files["spider.zip"] = _spider_zip(tmp_path)
    with pytest.raises(SpiderArchiveError, match="checksum mismatch"):
        download_spider(server.url("spider.zip"), tmp_path / "a", sha256="0" * 64)
    with pytest.raises(SpiderError, match="download failed .*404"):
        download_spider(server.url("missing.zip"), tmp_path / "b")
    with pytest.raises(SpiderError, match="download failed"):
        download_spider("http://127.0.0.1:9/spider.zip", tmp_path / "c", timeout_s=5)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_refuses_to_replace_an_unrelated_directory(server, tmp_path):
    server.files["spider.zip"] = _spider_zip(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SpiderError, match="not a Spider directory"):
        download_spider(server.url("spider.zip"), mine)
    assert (mine / "notes.txt").read_text() == "keep me"
