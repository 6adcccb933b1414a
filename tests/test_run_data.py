"""The run cache parses only what a run appended since its last read, and still reads every line right:
torn last lines, corrupt lines, files replaced or cut short."""

from __future__ import annotations

import os
import time

from dashboard.run_data import RunCache
from training.run_dir import RunDir, now_iso, read_jsonl


def append_raw(run: RunDir, text: str) -> None:
    with open(run.file("metrics.jsonl"), "a") as f:
        f.write(text)
    time.sleep(0.002)  # a new mtime for the cache's change check


def test_appended_lines_are_parsed_once_and_match_a_full_read(tmp_path):
    run = RunDir.create(tmp_path, "r1")
    run.write_status("running", started_at=now_iso())
    cache = RunCache(tmp_path)
    for step in range(1, 4):
        run.append("metrics", {"step": step, "reward": step / 10})
    first = cache.snapshot("r1").metrics
    assert [m["step"] for m in first] == [1, 2, 3]
    # Bytes already parsed are not parsed again: blank out the first line in place (same size, same file)
    # and the cache still has it, where a full re-read would have lost it.
    with open(run.file("metrics.jsonl"), "r+b") as f:
        line = f.readline()
        f.seek(0)
        f.write(b" " * (len(line) - 1))

    append_raw(run, '{"step": 4, "reward": 0.4}\nnot json\n{"step": 5, "rew')  # a corrupt and a torn line
    second = cache.snapshot("r1").metrics
    assert [m["step"] for m in second] == [1, 2, 3, 4]
    assert [m["step"] for m in first] == [1, 2, 3]  # a snapshot handed out never changes
    append_raw(run, 'ard": 0.5}\n')
    third = cache.snapshot("r1").metrics
    assert [m["step"] for m in third] == [1, 2, 3, 4, 5]
    assert third[1:] == read_jsonl(run.file("metrics.jsonl"))  # what a full read sees, but the blanked line


def test_a_replaced_or_shortened_file_is_read_again_from_its_start(tmp_path):
    run = RunDir.create(tmp_path, "r1")
    run.write_status("running", started_at=now_iso())
    cache = RunCache(tmp_path)
    for step in range(1, 6):
        run.append("metrics", {"step": step})
    assert len(cache.snapshot("r1").metrics) == 5
    replacement = run.file("metrics.jsonl.new")
    replacement.write_text('{"step": 10}\n{"step": 11}\n')
    os.replace(replacement, run.file("metrics.jsonl"))  # another inode
    time.sleep(0.002)
    assert [m["step"] for m in cache.snapshot("r1").metrics] == [10, 11]
    run.file("metrics.jsonl").write_text('{"step": 20}\n')  # same inode, shorter
    time.sleep(0.002)
    assert [m["step"] for m in cache.snapshot("r1").metrics] == [20]
    run.file("metrics.jsonl").unlink()
    assert cache.snapshot("r1").metrics == []


def test_the_runs_listing_never_leaves_the_runs_folder(tmp_path):
    """A symlinked run directory leading out of runs/ used to be listed with its config.json (issue 20, finding
    8), though opening it was refused. Every reader goes through one check (`resolve_run`)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    from training.run_dir import InvalidRunName, list_runs, resolve_run

    runs, outside = tmp_path / "runs", tmp_path / "elsewhere"
    inside = RunDir.create(runs, "run-inside")
    inside.write_config({"model": "builtin:tiny"})
    inside.write_status("completed")
    secret = RunDir.create(outside, "run-secret")
    secret.write_config({"model": "SECRET"})
    secret.write_status("completed")
    (runs / "run-escape").symlink_to(secret.path, target_is_directory=True)
    assert [r["run_id"] for r in list_runs(runs)] == ["run-inside"]
    assert [r["run_id"] for r in RunCache(runs).list()] == ["run-inside"]
    with pytest.raises(InvalidRunName):
        resolve_run("run-escape", runs)
    repo = Path(__file__).resolve().parent.parent
    listed = subprocess.run([sys.executable, "-m", "training.runs", "list", "--runs-dir", str(runs), "--json"],
                            cwd=repo, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["run_id"] for line in listed.stdout.splitlines()] == ["run-inside"]
    assert "SECRET" not in listed.stdout


def test_the_run_cache_redacts_secret_named_config_values(tmp_path):
    """A run's config.json is shown to anyone (Runs tab, Compare, Train): a value named like a credential that
    got into one (a run saved before TrainConfig refused them, or a file written by hand) is never shown."""
    run = RunDir.create(tmp_path, "r1")
    written = {"model": "builtin:tiny", "grpo": {"hub_token": "hf_SECRET", "loss_type": "dr_grpo",
                                                 "model_init_kwargs": {"token": "hf_SECRET", "dtype": "bf16"}},
               "sft": {"args": {"apiKey": "k", "eos_token": "<eos>", "max_length": 512}}}
    run.write_config(written)
    run.write_status("completed", step=1, total_steps=1)
    shown = RunCache(tmp_path).snapshot("r1").config
    REDACTED = "<redacted>"
    assert shown == {"model": "builtin:tiny", "grpo": {"hub_token": REDACTED, "loss_type": "dr_grpo",
                                                       "model_init_kwargs": {"token": REDACTED, "dtype": "bf16"}},
                     "sft": {"args": {"apiKey": REDACTED, "eos_token": "<eos>", "max_length": 512}}}
    assert run.read_config() == written  # the file itself is the run's: resume reads what was written
