"""Checkpoints, resume and dead runs: a training subprocess killed with SIGKILL reads `interrupted` and `--resume`
finishes it with no duplicated metric steps; a run stopped during the SFT warm start resumes there; heartbeat and pid
rules of `live_status`; `python -m training.runs list`. Real tiny-model runs on CPU, kept to a few steps."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from training.config.legacy import LEGACY_SFT_KEYS

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _small(tmp_path, **overrides) -> dict:
    values = dict(
        max_steps=3, num_generations=2, per_device_train_batch_size=2, step_budget=2, max_completion_length=96,
        max_turn_tokens=16, sft={"enabled": True, "max_steps": 3, "episodes": 6, "batch_size": 2, "eval_every": 1},
        compare_base=False, plot_every=1, trace_every=0, eval_every=1, eval_episodes=1, comparison_episodes=2,
        save_steps=1, device="cpu", precision="fp32", cpu_threads=1, seed=0, output_dir=str(tmp_path / "run"),
    )
    values.update(overrides)
    return values


def _assert_no_duplicates(run) -> None:
    for kind in ("metrics", "evals"):
        keys = [(r.get("phase"), r["step"], r.get("split")) for r in run.read(kind)]
        assert not [k for k, n in Counter(keys).items() if n > 1], (kind, keys)


def _wait_for(predicate, timeout: float, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"training ended early: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


@pytest.mark.slow
def test_sigkill_reads_interrupted_and_resume_finishes_without_duplicates(tmp_path, capsys):
    """A training process killed with SIGKILL (a process of its own: the kill is what is tested) reads `interrupted`;
    `python -m training.train --resume` (its `main`, called here: a second interpreter would only import torch and
    TRL again, ~11 CPU-s each) finishes it with no duplicated step, and refuses the completed run with exit code 2."""
    from training.cli import main as train_main
    from training.run.directory import RunDir, live_status

    config = tmp_path / "config.json"
    config.write_text(json.dumps(_small(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "training.train", "--config", str(config), "--quiet"], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run = RunDir(tmp_path / "run")
    try:
        first = run.path / "checkpoints" / "grpo" / "checkpoint-1" / "trainer_state.json"
        _wait_for(first.exists, timeout=300, proc=proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    written = run.read_status()
    assert written["status"] == "running" and written["pid"] == proc.pid  # what the dead process left behind
    seen = live_status(written)
    assert seen["status"] == "interrupted" and "resume" in seen["error"]
    listed = subprocess.run([sys.executable, "-m", "training.runs", "list", "--runs-dir", str(tmp_path), "--json"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    row = json.loads(listed.stdout.splitlines()[0])
    assert row["run_id"] == "run" and row["status"] == "interrupted" and row["resumable"] and row["checkpoint"]

    capsys.readouterr()
    resumed = train_main(["--resume", str(run.path)])
    printed = capsys.readouterr()
    assert resumed == 0, printed.err[-3000:]
    assert json.loads(printed.out.strip().splitlines()[-1])["status"] == "completed"
    status = run.read_status()
    assert status["status"] == "completed" and status["step"] == 3 and status["resumes"] == 1
    metrics = run.read("metrics")
    assert [m["step"] for m in metrics if m["phase"] == "grpo"] == [1, 2, 3]
    assert [m["step"] for m in metrics if m["phase"] == "sft"] == [1, 2, 3]  # a short warm start logs every step, once
    _assert_no_duplicates(run)
    assert {(e["phase"], e["step"]) for e in run.read("evals")} >= {("grpo", s) for s in (1, 2, 3)}
    assert [c["kind"] for c in run.read("comparison")].count("summary") == 1
    assert (run.final_dir / "config.json").exists() and (run.path / "warm_start" / "config.json").exists()
    assert not (run.path / "checkpoints").exists()  # removed once the run completed
    assert train_main(["--resume", str(run.path)]) == 2 and "completed" in capsys.readouterr().err


@pytest.mark.slow
def test_run_stopped_during_sft_resumes_there(tmp_path):
    from training.run.directory import RunDir
    from training.train import resume_training, run_training

    stop = threading.Event()

    def listener(event, payload):
        if event == "metrics" and payload.get("phase") == "sft" and payload["step"] == 1:
            stop.set()

    # sft.args: a SFTConfig field through the pass-through (a metrics line per SFT step).
    small = _small(tmp_path, max_steps=2)
    small["sft"]["args"] = {"logging_steps": 1}
    path = run_training(small, stop_event=stop,
                        listener=listener)
    run = RunDir(path)
    assert run.read_status()["status"] == "stopped"
    assert (run.path / "checkpoints" / "sft" / "checkpoint-1").is_dir()  # the stop saved one
    # The run recorded its plan (what the dashboard's phase list shows), the warm start with its size.
    plan = run.read_status()["phases"]
    assert [p["name"] for p in plan][:2] == ["loading model", "sft"] and "grpo" in [p["name"] for p in plan]
    assert {"name": "sft", "label": "warm start (SFT, 3 steps)"} in plan
    # Saved as runs before the `sft` section saved it (flat sft_* keys, only the settings that existed then; later
    # ones take their defaults): it still loads and resumes.
    saved = json.loads(run.file("config.json").read_text())
    flat = {**{k: v for k, v in saved.items() if k != "sft"}, "sft": saved["sft"]["enabled"],
            **{f"sft_{k}": v for k, v in saved["sft"].items() if f"sft_{k}" in LEGACY_SFT_KEYS}}
    run.file("config.json").write_text(json.dumps(flat))
    with pytest.warns(FutureWarning, match="sft_max_steps.*deprecated"):
        path = resume_training(path)
    status = run.read_status()
    assert status["status"] == "completed" and status["step"] == 2 and status["sft"]["steps"] == 3
    assert status["phases"] == plan  # resumed: the plan stays whole, the warm start in it
    metrics = run.read("metrics")
    assert [(m["phase"], m["step"]) for m in metrics] == [("sft", 1), ("sft", 2), ("sft", 3), ("grpo", 1), ("grpo", 2)]
    assert json.loads(run.file("sft_config.json").read_text())["logging_steps"] == 1
    _assert_no_duplicates(run)
    # SFT's eval at step 0 was not repeated on resume.
    assert [e["step"] for e in run.read("evals") if e["phase"] == "sft" and e["split"] == "eval"] == [0, 1, 2, 3]


def test_live_status_rules(tmp_path):
    from training.run.directory import HEARTBEAT_TIMEOUT, RunDir, live_status, this_host
    from training.run.listing import list_runs

    now = time.time()
    alive = {"status": "running", "pid": os.getpid(), "host": this_host(), "heartbeat_at": now}
    assert live_status(alive, now)["status"] == "running"
    assert live_status({**alive, "heartbeat_at": now - HEARTBEAT_TIMEOUT - 1}, now)["status"] == "interrupted"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert live_status({**alive, "pid": dead.pid}, now)["status"] == "interrupted"
    other_host = {**alive, "host": "elsewhere", "pid": dead.pid}
    assert live_status(other_host, now)["status"] == "running"  # another host: only its heartbeat tells
    for finished in ("completed", "failed", "stopped"):
        assert live_status({**alive, "status": finished, "pid": dead.pid}, now)["status"] == finished
    assert live_status({"status": "running"}, now)["status"] == "running"  # an old run without a pid
    run = RunDir.create(tmp_path, "dead")
    run.write_config({"model": "builtin:tiny", "dataset": "builtin"})
    run.write_status("running", step=2, total_steps=5, pid=dead.pid, host=this_host(), heartbeat_at=now)
    row = list_runs(tmp_path)[0]
    assert row["status"] == "interrupted" and row["resumable"] and not row["checkpoint"]
    assert run.read_status()["status"] == "running"  # readers never rewrite the file


def test_runs_cli_table_and_errors(tmp_path):
    from training.run.directory import RunDir

    run = RunDir.create(tmp_path, "done")
    run.write_config({"model": "builtin:tiny", "dataset": "builtin", "eval_split": "eval"})
    run.write_status("completed", step=4, total_steps=4)
    run.append("evals", {"step": 4, "phase": "grpo", "split": "eval", "success_rate": 0.25})
    run.append("comparison", {"kind": "summary", "trained": {"success_rate": 0.5}})  # a run from before EX
    out = subprocess.run([sys.executable, "-m", "training.runs", "list", "--runs-dir", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    header, line = out.stdout.splitlines()
    assert header.split()[:3] == ["run", "status", "steps"]
    # Success and EX come from one measurement, named in the dashboard's words (this one from before EX: "-").
    assert re.split(r"\s{2,}", line.strip()) == ["done", "completed", "4/4", "builtin:tiny", "builtin", "50%", "-",
                                                 "trained model · final comparison · eval questions"]
    run.append("comparison", {"kind": "summary", "trained": {"success_rate": 0.5, "execution_accuracy": 0.75}})
    out = subprocess.run([sys.executable, "-m", "training.runs", "list", "--runs-dir", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert re.split(r"\s{2,}", out.stdout.splitlines()[1].strip())[5:7] == ["50%", "75%"]
    for args in (["list", "--runs-dir", str(tmp_path / "missing")], ["lst"]):
        bad = subprocess.run([sys.executable, "-m", "training.runs", *args], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.mark.slow
def test_a_pretrained_models_zero_shot_eval_is_played_once_and_read_back_on_resume(tmp_path, tiny):
    """A model that is not built in (here the tiny model saved to a folder, standing for a pretrained one) and is
    warm-started gets a zero-shot eval before its warm start, kept in zero_shot.json; a run stopped in GRPO and
    resumed reads it back (not played again) and compares it beside random, base and trained."""
    from training.phases import ZERO_SHOT_FILE
    from training.run.directory import RunDir
    from training.train import resume_training, run_training

    model, tokenizer = tiny
    pretrained = tmp_path / "pretrained"
    model.save_pretrained(str(pretrained))
    tokenizer.save_pretrained(str(pretrained))
    stop = threading.Event()

    def listener(event, payload):
        if event == "metrics" and payload.get("phase") == "grpo" and payload["step"] == 1:
            stop.set()

    values = _small(tmp_path, model=str(pretrained), compare_base=True, comparison_episodes=3, zero_shot_episodes=2)
    path = run_training(values, stop_event=stop, listener=listener)
    run = RunDir(path)
    assert run.read_status()["status"] == "stopped"
    zero_shot = run.file(ZERO_SHOT_FILE)
    played = json.loads(zero_shot.read_text())["episodes"]
    assert len(played) == values["zero_shot_episodes"]  # the first 2 of the comparison's 3 questions
    before = zero_shot.stat().st_mtime_ns
    phases = []
    resume_training(path, listener=lambda event, payload: phases.append(payload.get("phase")))
    assert run.read_status()["status"] == "completed"
    assert "zero-shot eval" not in phases and zero_shot.stat().st_mtime_ns == before  # read back, not replayed
    summary = next(r for r in run.read("comparison") if r["kind"] == "summary")
    assert summary["zero_shot"]["n_episodes"] == values["zero_shot_episodes"]
    assert summary["trained"]["n_episodes"] == values["comparison_episodes"]
    assert summary["base_label"] == "SFT warm-start (before GRPO)"
    pairs = [r for r in run.read("comparison") if r["kind"] == "pair"]
    assert [p["zero_shot"]["question_id"] for p in pairs if "zero_shot" in p] == [e["question_id"] for e in played]
    assert [("zero_shot" in p) for p in pairs] == [True, True, False]


def test_a_short_warm_start_logs_every_step_and_each_phase_says_when_it_began(tmp_path):
    """A warm start of a few steps puts each step on the learning-signal chart (not one point every 50), and
    status.json says when the current phase began (the dashboard's remaining time counts its pace from there)."""
    from training.run.directory import RunDir
    from training.train import run_training

    seen = []

    def listener(event, payload):
        if event == "status" and payload.get("phase"):
            seen.append((payload["phase"], payload.get("phase_started_at")))

    small = _small(tmp_path, max_steps=1, eval_every=0, save_steps=0,
                   sft={"enabled": True, "max_steps": 3, "episodes": 6, "batch_size": 2, "eval_every": 0})
    run = RunDir(run_training(small, listener=listener))
    assert [m["step"] for m in run.read("metrics") if m["phase"] == "sft"] == [1, 2, 3]
    assert json.loads(run.file("sft_config.json").read_text())["logging_steps"] == 1
    begun = {}
    for phase, started in seen:
        assert started, phase
        begun.setdefault(phase, started)
    assert {"sft", "grpo"} <= set(begun) and begun["sft"] <= begun["grpo"]


# ------------------------------------------------------------------------- the sweep and the real-model bench
#: A tiny model's sweep at its smallest (`bench/learning/grpo_sweep.py --config configs/tiny_cpu.json`): 2 episodes
#: a step, a 2-step warm start, a panel of 4.
SWEEP_SETS = ["num_generations=2", "per_device_train_batch_size=2", "step_budget=2", "max_completion_length=96",
              "max_turn_tokens=16", "sft.max_steps=2", "sft.episodes=6", "sft.batch_size=2", "sft.eval_every=0",
              "kl_probe_episodes=0", "cpu_threads=1"]


def _bench(name: str):
    import importlib

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"bench.learning.{name}")


@pytest.mark.slow
def test_a_sweep_try_cut_short_resumes_from_its_run_directory(tmp_path, capsys):
    """A try stopped after its first GRPO step (the run's own stop; a killed one reads `interrupted` and takes the
    same path) resumes from its checkpoint when the sweep's command runs again, with no step played twice; a finished
    try is skipped; a try that completed but whose record was never written is read back, not run again."""
    from training.run.directory import RunDir, last_checkpoint

    sweep = _bench("grpo_sweep")
    argv = ["--config", "configs/tiny_cpu.json", "--out", str(tmp_path / "sweep"), "--steps", "3", "--validation", "4",
            "--tries", "lr1e-5"] + [arg for value in SWEEP_SETS for arg in ("--set", value)]
    args, base, [(name, settings)] = sweep.parse(argv)
    warm = sweep.warm_start(base, args.out / "warm_start")
    config = sweep.try_config(base, settings, warm=warm, steps=3, validation=4, eval_every=0, out=args.out, name=name)
    stop = threading.Event()

    def listener(event, payload):
        if event == "metrics" and payload.get("phase") == "grpo" and payload["step"] == 1:
            stop.set()

    cut = sweep.run_try(name, config, stop_event=stop, listener=listener)
    run = RunDir(Path(config.output_dir))
    assert cut["status"] == "stopped" and cut["sampled_success"] and len(cut["sampled_success"]) == 1
    assert last_checkpoint(run.path / "checkpoints" / "grpo").name == "checkpoint-1"
    capsys.readouterr()

    assert sweep.main(argv) == 0
    out = capsys.readouterr().out
    assert f"try {name}: resuming (stopped at step 1)" in out, out[:3000]
    status = run.read_status()
    assert status["status"] == "completed" and status["step"] == 3 and status["resumes"] == 1
    assert [m["step"] for m in run.read("metrics") if m["phase"] == "grpo"] == [1, 2, 3]
    _assert_no_duplicates(run)
    record = json.loads(out.strip().splitlines()[-1])["tries"][0]
    assert record["status"] == "completed" and record["resumes"] == 1 and record["error"] is None
    assert record["validation_n"] == 4 and set(record["validation_by_step"]) >= {"0", "3"}
    assert len(record["sampled_success"]) == 3 and record["gained"] - record["lost"] == record["net"]
    ledger = args.out / "sweep.jsonl"
    assert len(ledger.read_text().splitlines()) == 1

    assert sweep.main(argv) == 0  # finished: skipped
    assert f"try {name}: already in {ledger}" in capsys.readouterr().out
    assert len(ledger.read_text().splitlines()) == 1 and run.read_status()["resumes"] == 1

    ledger.unlink()  # the try completed, the process died before its record was written
    assert sweep.main(argv) == 0
    out = capsys.readouterr().out
    assert f"try {name}: reading (completed before its record was written)" in out
    again = json.loads(ledger.read_text())
    assert {k: again[k] for k in ("validation_by_step", "gained", "lost", "sampled_success")} == \
        {k: record[k] for k in ("validation_by_step", "gained", "lost", "sampled_success")}
    assert run.read_status()["resumes"] == 1  # not run again

    # Another config in the try's run directory (here another learning rate): started afresh, never resumed.
    assert sweep.config_differs(run.read_config(), config) == []
    other = sweep.try_config(base, {"learning_rate": 3e-6}, warm=warm, steps=3, validation=4, eval_every=0,
                             out=args.out, name=name)
    assert sweep.config_differs(run.read_config(), other) == ["learning_rate"]
    assert sweep.try_state(other)[0] == "start" and sweep.try_state(config) == ("read", "completed before its "
                                                                                 "record was written")


@pytest.mark.slow
def test_the_real_model_bench_run_again_resumes_its_run_and_reports_a_finished_one(tmp_path, capsys):
    """`bench/learning/real_model.py --out DIR`, cut short (its own `--minutes` stop) and run again as it was: the run
    in DIR resumes from its checkpoint (its figures counting both chunks); run once more, the completed run is
    reported, not trained again; another config for the same DIR is refused."""
    from training.run.directory import RunDir

    bench = _bench("real_model")
    out = tmp_path / "run"
    small = ["--config", "configs/tiny_cpu.json", "--episodes", "2", "--out", str(out)] + [
        arg for value in SWEEP_SETS + ["max_steps=2", "eval_every=0", "eval_episodes=0", "trace_every=0"]
        for arg in ("--set", value)]
    assert bench.main(small + ["--minutes", "0.001"]) == 0
    run = RunDir(out)
    assert run.read_status()["status"] == "stopped"
    assert "continue with: run the same command again" in capsys.readouterr().out

    assert bench.main(small) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any("reads stopped at step" in line and "resuming it from its last checkpoint" in line for line in lines)
    figures = json.loads(lines[-1])
    assert figures["chunks"] == 2 and figures["resumes"] == 1 and figures["grpo_steps"] == 2
    assert figures["after_grpo"] is not None and figures["run_dir"] == str(out)
    status = run.read_status()
    assert status["status"] == "completed" and status["resumes"] == 1
    _assert_no_duplicates(run)
    metrics = run.file("metrics.jsonl").read_bytes()

    assert bench.main(small) == 0  # completed: reported as it is
    lines = capsys.readouterr().out.strip().splitlines()
    assert any("completed: its figures, not trained again" in line for line in lines)
    assert json.loads(lines[-1]) == figures
    assert run.file("metrics.jsonl").read_bytes() == metrics and run.read_status()["resumes"] == 1

    assert bench.main(small + ["--set", "learning_rate=0.1"]) == 2
    assert "holds a run of another config (learning_rate)" in capsys.readouterr().err
