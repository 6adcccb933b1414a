"""The run cache parses only what a run appended since its last read, and still reads every line right:
torn last lines, corrupt lines, files replaced or cut short."""

from __future__ import annotations

import json
import os
import time

from dashboard.core.run_data import RunCache
from training.run.directory import RunDir, now_iso, read_jsonl


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

    from training.run.directory import InvalidRunName, resolve_run
    from training.run.listing import list_runs

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


# --------------------------------------------------------------------- success labels and resume (issue 27)
def finished_run(root, run_id, status="completed", comparison=True):
    """A run as training writes it: periodic evals on both splits (SFT, then GRPO), then the final comparison."""
    run = RunDir.create(root, run_id)
    run.write_config({"model": "builtin:tiny", "dataset": "builtin", "eval_split": "eval", "eval_episodes": 32,
                      "comparison_episodes": 200})
    run.write_status(status, step=40, total_steps=40)
    for phase, step, rate in (("sft", 5000, 0.0), ("grpo", 40, 0.75)):
        for split in ("train", "eval"):
            run.append("evals", {"phase": phase, "step": step, "split": split, "success_rate": rate,
                                 "execution_accuracy": 0.8, "n_episodes": 32, "time": 1.0})
    if comparison:
        run.append("comparison", {"kind": "summary", "split": "eval", "n_episodes": 200, "seed": 0,
                                  "trained": {"success_rate": 0.74, "execution_accuracy": 0.85, "n_episodes": 200},
                                  "random": {"success_rate": 0.0, "n_episodes": 200}})
    return run


def test_the_runs_table_and_the_detail_say_what_each_success_measured(tmp_path):
    """The table's 74% (the trained model on the comparison's 200 questions) and the detail's 75% (the last periodic
    eval, 32 questions) used to be bare "final success" and "eval success"; both now say what was measured, in the
    same words in the table and the detail."""
    from dashboard.runs.detail import detail_header
    from dashboard.runs.table import runs_table

    finished_run(tmp_path, "done")
    finished_run(tmp_path, "cut-short", status="stopped", comparison=False)
    RunDir.create(tmp_path, "fresh").write_status("running", step=0, total_steps=40)
    cache = RunCache(tmp_path)
    table = runs_table(cache.list(), cache).set_index("run")
    final = "trained model · final comparison · 200 eval questions"
    last_eval = "model at GRPO step 40 · periodic eval · 32 eval questions"
    assert list(table.loc["done", ["success", "EX", "measured on"]]) == ["74%", "85%", final]
    assert list(table.loc["cut-short", ["success", "EX", "measured on"]]) == ["75%", "80%", last_eval]
    assert list(table.loc["fresh", ["success", "EX", "measured on"]]) == ["–", "–", "not measured yet"]

    detail = detail_header(cache.snapshot("done"))
    assert f"<b>success 74% · EX 85%</b> — {final}" in detail
    assert f"<b>success 75% · EX 80%</b> — {last_eval}" in detail
    stopped = detail_header(cache.snapshot("cut-short"))
    assert last_eval in stopped and "final comparison" not in stopped
    assert "not measured yet" in detail_header(cache.snapshot("fresh"))


def test_measures_follow_appended_lines(tmp_path):
    run = finished_run(tmp_path, "r", status="running", comparison=False)
    cache = RunCache(tmp_path)
    final, last = cache.measures("r")
    assert final == last and final.how == "periodic eval"
    run.append("comparison", {"kind": "summary", "split": "eval", "n_episodes": 5,
                              "trained": {"success_rate": 0.4, "n_episodes": 5}})
    time.sleep(0.002)
    final, last = cache.measures("r")
    assert (final.label, final.success, final.execution) == ("trained model · final comparison · 5 eval questions",
                                                              0.4, None)
    assert last.success == 0.75


def test_resume_is_offered_for_stopped_failed_and_interrupted_runs_only(tmp_path):
    import socket

    from dashboard.runs.resume import resumable

    for status in ("completed", "stopped", "failed", "running", "queued"):
        finished_run(tmp_path, status, status=status)
    # A run whose writer died reads "interrupted" (training.run.directory.live_status): resumable.
    finished_run(tmp_path, "dead", status="running").write_status(pid=2 ** 22 + 17, host=socket.gethostname())
    no_config = RunDir.create(tmp_path, "no-config")
    no_config.write_status("failed")
    cache = RunCache(tmp_path)
    offered = {name: resumable(cache.snapshot(name)) for name in
               ("completed", "stopped", "failed", "running", "queued", "dead", "no-config")}
    assert offered == {"completed": False, "stopped": True, "failed": True, "running": False, "queued": False,
                       "dead": True, "no-config": False}
    assert cache.snapshot("dead").state == "interrupted"


# ------------------------------------------------------------------------------ issue 43, finding 11
def test_a_malformed_or_huge_run_is_listed_as_unreadable_and_the_others_still_show(tmp_path):
    """A config.json nested 1,000,000 deep raised RecursionError (no ValueError) in the listing, and the Runs and
    Compare lists came back empty for everyone; a 50 MB config was read and sent whole. Every run file is now read
    with bounds (`sqlenv.json_files`): such a run is listed as corrupt, saying why, and the others as usual."""
    from dashboard.compare.added_columns import source_choices
    from dashboard.runs.table import runs_table
    from sqlenv.evaluation.saved import EVALUATIONS_FOLDER, load_evaluation
    from sqlenv.json_files import MAX_JSON_DEPTH
    from training.run.directory import MAX_JSON_BYTES, MAX_RECORD_BYTES
    from training.run.listing import list_runs

    good = finished_run(tmp_path, "good")
    bad_configs = {
        "deep-million": "[" * 1_000_000 + "]" * 1_000_000,  # over the size bound: never parsed
        "deep-parser": '{"a":' * 20_000 + "1" + "}" * 20_000,  # within it: Python's parser's RecursionError
        "deep-walk": "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),  # parses: deeper than the bound
        "huge": json.dumps({"model": "builtin:tiny", "pad": "x" * MAX_JSON_BYTES}),  # (the API test: 50 MB)
        "not-an-object": "[1, 2]",
    }
    for name, text in bad_configs.items():
        run = finished_run(tmp_path, name)
        run.file("config.json").write_text(text)
    # Records of the good run around the bad kinds of line: each bad line is skipped, the next one read.
    with open(good.file("metrics.jsonl"), "w") as f:
        f.write('{"step": 1}\n' + "[" * 10_000 + "]" * 10_000 + '\n[1]\n{"pad": "' + "x" * (MAX_RECORD_BYTES + 10)
                + '"}\n{"step": 2}\n')

    rows = {r["run_id"]: r for r in list_runs(tmp_path)}
    assert set(rows) == {"good", *bad_configs}
    assert rows["good"]["status"] == "completed" and rows["good"]["final_success"] == 0.74
    for name in bad_configs:
        assert rows[name]["status"] == "corrupt" and "config.json unreadable" in rows[name]["error"], rows[name]
    assert f"larger than {MAX_JSON_BYTES:,} bytes" in rows["huge"]["error"] and "deeper" in rows["deep-parser"]["error"]

    cache = RunCache(tmp_path)
    table = runs_table(cache.list(), cache).set_index("run")
    assert table.loc["good", "success"] == "74%" and len(table) == len(bad_configs) + 1
    assert [m["step"] for m in cache.snapshot("good").metrics] == [1, 2]
    for name in bad_configs:
        snap = cache.snapshot(name)
        assert snap.config is None and "unreadable" in snap.config_error and snap.summary is not None
    choices = [value for _, value in source_choices(cache)]
    assert "run:good" in choices and "run:deep-parser" in choices  # Compare lists every run with a comparison

    # A saved evaluation (Compare's other columns) is read with the same bounds.
    for name, text in (("ok", '{"format": "sqlenv-evaluation/1", "name": "ok"}'),
                       ("deep", '{"name":' * 50_000 + "1" + "}" * 50_000)):
        folder = tmp_path / EVALUATIONS_FOLDER / name
        folder.mkdir(parents=True)
        (folder / "evaluation.json").write_text(text)
        (folder / "episodes.jsonl").write_text('{"question_id": "q1"}\n' + "[" * 10_000 + "]" * 10_000 + "\n")
    assert [value for _, value in source_choices(cache)][0] == "eval:ok"
    assert [e["question_id"] for e in load_evaluation(tmp_path / EVALUATIONS_FOLDER / "ok").episodes] == ["q1"]


# ------------------------------------------------------------------------------ issue 49, finding 6
def write_metrics(path, first: int, last: int) -> None:
    """Metrics lines of steps first..last (~120 bytes each), written fast (one format, no json.dumps a line)."""
    with open(path, "a") as f:
        f.writelines(f'{{"grad_norm": {i % 97 / 31:.4f}, "reward": {i % 13 / 13:.4f}, "reward_std": 0.1, '
                     f'"phase": "grpo", "step": {i}, "time": {1_700_000_000 + i}}}\n' for i in range(first, last + 1))


class CountingReader:
    """A binary file that counts the bytes read through it (what `RecordSample.update` costs)."""

    def __init__(self, f):
        self.f, self.read_bytes = f, 0

    def read(self, n=-1):
        data = self.f.read(n)
        self.read_bytes += len(data)
        return data

    def readline(self, n=-1):
        data = self.f.readline(n)
        self.read_bytes += len(data)
        return data

    def __getattr__(self, name):  # seek, tell, fileno
        return getattr(self.f, name)


def test_a_long_run_file_is_kept_as_a_bounded_spread_and_read_in_bounded_work(tmp_path):
    """A 58 MB metrics.jsonl of 400,000 lines was parsed and kept whole, and every chart drew every line: 6 s and a
    41.6 MB reply per Run detail view (issue 49, finding 6). The cache keeps the file's first HEAD records and its
    newest TAIL whole, and at most SPREAD records spread between; an update reads a bounded number of bytes, however
    long the file (a long stretch is sampled, not parsed), and its lines are estimated from the sample."""
    from dashboard.core.run_sample import HEAD, PARSE_BYTES, SPREAD, TAIL, RecordSample
    from dashboard.runs.detail import detail_header

    run = RunDir.create(tmp_path, "long")
    run.write_status("completed", started_at=now_iso())
    write_metrics(run.file("metrics.jsonl"), 1, 200_000)
    size = run.file("metrics.jsonl").stat().st_size
    assert size > 20_000_000
    sample = RecordSample()
    with open(run.file("metrics.jsonl"), "rb") as f:
        counting = CountingReader(f)
        assert sample.update(counting)
    assert counting.read_bytes < PARSE_BYTES + 2 * SPREAD * 200 < size / 10  # the tail, and a line per range
    steps = [r["step"] for r in sample.records]
    assert len(steps) <= HEAD + SPREAD + TAIL and steps == sorted(steps)
    assert steps[:HEAD] == list(range(1, HEAD + 1)) and steps[-TAIL:] == list(range(200_001 - TAIL, 200_001))
    gaps = [b - a for a, b in zip(steps[HEAD:], steps[HEAD + 1:-TAIL])]
    assert max(gaps) < 3 * 200_000 / SPREAD  # between them, spread evenly
    assert not sample.exact and abs(sample.lines - 200_000) < 2_000

    cache = RunCache(tmp_path)
    snap = cache.snapshot("long")
    assert len(snap.metrics) <= HEAD + SPREAD + TAIL and snap.metrics[-1]["step"] == 200_000
    assert "~" in detail_header(snap) and "spread over the run" in detail_header(snap)
    # A live run's appended lines are read as they come, and the kept records stay bounded.
    write_metrics(run.file("metrics.jsonl"), 200_001, 230_000)
    time.sleep(0.002)
    later = cache.snapshot("long")
    assert len(later.metrics) <= HEAD + SPREAD + TAIL + 1 and later.metrics[-1]["step"] == 230_000
    assert [r["step"] for r in later.metrics[:HEAD]] == list(range(1, HEAD + 1))
    assert [r["step"] for r in later.metrics[-3:]] == [229_998, 229_999, 230_000]
    assert [r["step"] for r in snap.metrics][-1] == 200_000  # a snapshot handed out never changes


def test_transcripts_are_listed_as_summaries_and_read_from_their_line(tmp_path):
    """A run kept every transcript in memory (each up to 4 MiB) for every page. A snapshot now lists summaries (a
    bounded number) and reads the transcript shown from its line, only at an offset it lists."""
    from dashboard.core.run_data import TRACES_SPREAD, TRACES_TAIL
    from dashboard.core.run_sample import HEAD

    run = RunDir.create(tmp_path, "traces")
    run.write_status("running", started_at=now_iso())
    for step in range(1, 1_001):
        run.append("transcripts", {"step": step, "time": 1.0,
                                   "transcript": {"question_id": f"q{step}", "outcome": "correct", "steps": [],
                                                  "pad": "x" * 2_000}})
    snap = RunCache(tmp_path).snapshot("traces")
    assert len(snap.transcripts) <= HEAD + TRACES_SPREAD + TRACES_TAIL and "pad" not in str(snap.transcripts)
    latest = snap.latest_transcript
    assert latest["step"] == 1_000 and latest["question_id"] == "q1000"
    assert snap.transcript(latest["offset"])["transcript"]["question_id"] == "q1000"
    first = snap.transcripts[0]
    assert snap.transcript(first["offset"])["step"] == first["step"] == 1
    for unlisted in (latest["offset"] + 1, -1, "0", None, True, 10**12):
        assert snap.transcript(unlisted) is None
