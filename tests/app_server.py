"""The dashboard as a real server for API tests, and raw calls to its events (what any HTTP client can send).

`serve(env)` runs `python app.py` on a free 127.0.0.1 port with its own runs/ and data/ folders;
`call_event(...)` sends one event the way the page does (queue join + the event stream, or a direct POST for
events that skip the queue), by index, whatever the event's API visibility: a refused call must be refused by
the server, not by the client.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
from serverproc import end_process, free_port
from training_helpers import built_tiny_model

REPO_ROOT = Path(__file__).resolve().parent.parent


def copy_built_models(runs: Path) -> None:
    """Give an app's `runs` folder the tiny models built in the repository's `runs/models/` (deterministic from their
    seed: copied, not rebuilt by every app that trains), the default one built first, once for all test processes,
    when there is none. Whole models only: another worker's build in progress (a hidden temporary folder) is skipped."""
    cache = REPO_ROOT / "runs" / "models"
    built = [p for p in cache.iterdir() if not p.name.startswith(".") and (p / "config.json").is_file()] \
        if cache.is_dir() else []
    for model in built or [built_tiny_model()]:
        shutil.copytree(model, runs / "models" / model.name, dirs_exist_ok=True)


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"app did not answer at {url} within {timeout}s")


@contextlib.contextmanager
def serve(env: dict[str, str] | None = None, config: dict[str, Any] | None = None, log_name: str = "app"):
    """Yield {"url", "runs", "data", "root", "proc", "log"} for a dashboard on 127.0.0.1 (stopped afterwards).

    `env` is added to a copy of this process's environment with the owner settings cleared first, so a test
    says exactly which mode it runs in. `config` (a TrainConfig dict) fills the Train form."""
    root = Path(tempfile.mkdtemp(prefix=f"sqlenv-{log_name}-"))
    runs, data = root / "runs", root / "data"
    runs.mkdir()
    data.mkdir()
    copy_built_models(runs)
    port = free_port()
    args = [sys.executable, str(REPO_ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port)]
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
        args += ["--config", str(root / "config.json")]
    base = {k: v for k, v in os.environ.items()
            if k not in ("SQLENV_ADMIN_PASSWORD", "SQLENV_ADMIN_USERS", "SPACE_ID", "SPACE_AUTHOR_NAME", "SYSTEM",
                         "OAUTH_CLIENT_ID", "OAUTH_CLIENT_SECRET", "OAUTH_SCOPES", "OPENID_PROVIDER_URL")}
    full_env = dict(base, SQLENV_RUNS_DIR=str(runs), SQLENV_DATA_DIR=str(data), GRADIO_ANALYTICS_ENABLED="False",
                    PYTHONUNBUFFERED="1", **(env or {}))
    log_path = root / "app.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/"
        try:
            try:
                wait_http(url, proc)
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"{exc}; its log ends:\n{log_path.read_text()[-3000:]}") from None
            yield {"url": url, "runs": runs, "data": data, "root": root, "proc": proc, "log": log_path}
        finally:
            end_process(proc)
            shutil.rmtree(root, ignore_errors=True)


def app_config(url: str) -> dict[str, Any]:
    return httpx.get(url.rstrip("/") + "/config", timeout=30).json()


def default_inputs(config: dict[str, Any], dependency: dict[str, Any]) -> list[Any]:
    """The values a fresh page would send for `dependency`'s inputs (each component's initial value)."""
    props = {c["id"]: c.get("props", {}) for c in config["components"]}
    values = []
    for cid in dependency["inputs"]:
        p = props.get(cid, {})
        values.append(p.get("value", p.get("default_value")))
    return values


def call_event(url: str, fn_index: int, data: list[Any], *, queued: bool = True, session_hash: str | None = None,
               cookies: dict[str, str] | None = None, headers: Any = None, timeout: float = 60.0,
               source: str | None = None) -> dict[str, Any]:
    """Send event `fn_index` with `data` (and extra request `headers`: a dict, or (name, value) pairs for a header
    sent on several lines) from the address `source` (default: the system's choice; another 127.x.y.z address is
    another client on this machine); returns {"success": bool, "output": ..., "error": str | None}."""
    session_hash = session_hash or secrets.token_hex(6)
    body = {"data": data, "fn_index": fn_index, "session_hash": session_hash, "event_data": None,
            "trigger_id": None}
    base = url.rstrip("/") + "/gradio_api"
    transport = httpx.HTTPTransport(local_address=source) if source else None
    with httpx.Client(cookies=cookies, headers=headers, timeout=timeout, transport=transport) as http:
        if not queued:
            r = http.post(f"{base}/run/predict", json=body)
            payload = r.json()
            if r.status_code != 200:
                return {"success": False, "output": None, "error": payload.get("error") or str(payload)}
            return {"success": True, "output": payload.get("data"), "error": None}
        r = http.post(f"{base}/queue/join", json=body)
        if r.status_code != 200:
            return {"success": False, "output": None, "error": f"HTTP {r.status_code}: {r.text[:300]}"}
        event_id = r.json()["event_id"]
        with http.stream("GET", f"{base}/queue/data", params={"session_hash": session_hash}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("event_id") not in (None, event_id):
                    continue
                if msg.get("msg") == "process_completed":
                    output = msg.get("output") or {}
                    ok = bool(msg.get("success"))
                    return {"success": ok, "output": output.get("data"), "error": None if ok else output.get("error")}
    return {"success": False, "output": None, "error": "the event stream ended without a result"}
