"""A training run started by the dashboard dies with the dashboard (issue 20, finding 4).

After `kill -9` of `app.py` its training child used to train on as an orphan no restarted dashboard could stop,
write `completed`, then hang at exit on a full pipe. A real parent process (a `TrainingRunner` training the tiny
model in its spawned child, as the app does) is killed here; the child must stop its run and exit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from training_helpers import small_train_config  # tests/, the root conftest's folder, is on sys.path

REPO = Path(__file__).resolve().parent.parent

# The parent loads no ML library, as the app's own process (`TrainingRunner` imports torch in the child only): the
# test builds the config (`small_train_config` makes sure the tiny model is built, which imports transformers and
# trl, ~9 CPU-seconds) and hands it over as JSON.
PARENT = """
import json, sys, time
from pathlib import Path
if __name__ == "__main__":
    sys.path[:0] = [sys.argv[2]]
    from dashboard.core.runner import TrainingRunner
    from training.config import TrainConfig
    runs = Path(sys.argv[1])
    runner = TrainingRunner(runs)
    run_id = runner.start(TrainConfig.from_dict(json.loads(Path(sys.argv[3]).read_text())))
    print(run_id, flush=True)
    time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _status(run: Path) -> dict:
    try:
        return json.loads((run / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def test_the_training_child_stops_when_the_dashboard_is_killed(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(small_train_config(tmp_path, max_steps=100_000).to_dict()))
    parent = subprocess.Popen([sys.executable, str(script), str(runs), str(REPO), str(config)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    child_pid = None
    try:
        run = runs / parent.stdout.readline().strip()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # the child is training: its pid is in the run's status
            status = _status(run)
            if status.get("status") == "running" and status.get("pid") and (run / "metrics.jsonl").exists():
                child_pid = int(status["pid"])
                break
            assert parent.poll() is None, parent.stdout.read()
            time.sleep(0.5)
        assert child_pid and child_pid != parent.pid, _status(run)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 150  # PARENT_GONE_GRACE_S plus a margin; a step of the tiny model is ~1 s
        while time.monotonic() < deadline and not _gone(child_pid):
            time.sleep(0.5)
        assert _gone(child_pid), "the training child outlived the dashboard"
        assert _status(run).get("status") == "stopped", _status(run)  # stopped cleanly: weights saved, resumable
    finally:
        if parent.poll() is None:
            parent.kill()
        if child_pid and not _gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)
