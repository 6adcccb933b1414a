"""What a bench measures while a run trains in its process, and the measurement it records.

- `MemoryMeter`: this process's resident memory (peak overall and per phase), the bytes it wrote, and the machine's
  load while it ran, so a time taken on a shared machine says so.
- `refuse_shared`: why a `--record` must not start now (other work loads the cores), unless asked to record anyway.
- `PhaseClock`: wall seconds per phase, from the run's status events (a `run_training` listener).
- `measurement`: the `configs/measured.json` entry of a finished run (what `dashboard.core.measured.record` keeps and
  the Train form's cost line shows), read from the run directory's comparison summary.
"""

from __future__ import annotations

import os
import resource
import shlex
import threading
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["MemoryMeter", "PhaseClock", "measurement", "run_outcome", "grpo_rewards", "reward_fifths", "command_line",
           "machine_load", "usable_cores", "refuse_shared", "BUSY_LOAD"]

#: A 1-minute load average at or above this before a measured run starts means other work keeps at least a core
#: busy: the run would share the cores, and its wall minutes would not be what a newcomer's idle machine gives.
BUSY_LOAD = 1.0


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: `taskset` counts), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_load() -> float | None:
    """The machine's 1-minute load average (runnable threads, all processes), or None where the OS has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def refuse_shared(allow_shared: bool, load: float | None = None) -> str | None:
    """Why a `--record` must not start now, or None: other work loads the machine (a 1-minute load of `BUSY_LOAD`
    or more; `load` defaults to the current one), so the figures would not be an idle machine's. `allow_shared`
    (a bench's `--shared`) records anyway: the entry then says the cores were shared (`measurement`)."""
    load = machine_load() if load is None else load
    if allow_shared or load is None or load < BUSY_LOAD:
        return None
    return (f"--record measures idle cores, and the 1-minute load is {load:g} on {usable_cores()} cores: wait for "
            "the other work to end, or add --shared to record figures marked as taken on a shared machine")


class MemoryMeter:
    """This process's resident memory, sampled twice a second on its own thread: the peak overall and per phase;
    the bytes it has written to storage (Linux `/proc/self/io`), the run's checkpoints included; and the machine's
    1-minute load average, averaged over the samples (above the core count, other work shared the cores)."""

    def __init__(self):
        self.phase: str | None = None
        self.peak_by_phase: dict[str, float] = {}
        self.peak = 0.0
        self.loads: list[float] = []
        self._stop = threading.Event()
        self._written_at_start = self.written_bytes()

    @staticmethod
    def rss_gb() -> float:
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2**20
        except OSError:
            pass
        return 0.0

    @staticmethod
    def written_bytes() -> int:
        try:
            for line in Path("/proc/self/io").read_text().splitlines():
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    def written_gb(self) -> float:
        return (self.written_bytes() - self._written_at_start) / 2**30

    def mean_load(self) -> float | None:
        return round(sum(self.loads) / len(self.loads), 2) if self.loads else None

    def start(self) -> None:
        def sample() -> None:
            while not self._stop.wait(0.5):
                rss = self.rss_gb()
                self.peak = max(self.peak, rss)
                if self.phase:
                    self.peak_by_phase[self.phase] = max(self.peak_by_phase.get(self.phase, 0.0), rss)
                try:
                    self.loads.append(os.getloadavg()[0])
                except OSError:
                    pass

        threading.Thread(target=sample, daemon=True, name="memory-meter").start()

    def stop(self) -> None:
        self._stop.set()


class PhaseClock:
    """Wall seconds per phase of a run, as a `run_training` listener (call it with each event, or `enter` a phase).

    Args:
        on_phase: called with each phase entered (None when the run ends), e.g. to tell a meter which phase runs.
    """

    IDLE = (None, "done", "queued", "resuming")

    def __init__(self, on_phase: Callable[[str | None], None] | None = None):
        self.seconds: dict[str, float] = {}
        self.phase: str | None = None
        self._since = time.perf_counter()
        self._on_phase = on_phase

    def enter(self, phase: str | None) -> None:
        now = time.perf_counter()
        if self.phase not in self.IDLE:
            self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + now - self._since
        self.phase, self._since = phase, now
        if self._on_phase is not None:
            self._on_phase(phase)

    def __call__(self, event: str, payload: dict) -> None:
        phase = payload.get("phase") if event == "status" else None
        if phase and phase != self.phase:
            self.enter(phase)


def cpu_minutes() -> float:
    """CPU time this process and its finished children have used so far (all their threads), in minutes: unlike
    wall time, other work on the machine barely changes it."""
    seconds = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        seconds += usage.ru_utime + usage.ru_stime
    return round(seconds / 60, 1)


def command_line(script: str, argv: list[str] | None) -> str:
    """The command that ran a bench, as it can be typed again."""
    import sys

    return shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)])


def run_outcome(run_dir: Path | str) -> dict[str, Any]:
    """What GRPO changed, from a finished run's records: the comparison's paired count (`fixed`: questions the trained
    model answers and the base column did not; `broken`: the reverse; the same questions, greedy), the step
    keep_best handed back (`kept_step`, None without a panel) and the validation panel's success at each step it
    played (`validation`: {step: success})."""
    from training.run.directory import RunDir

    run = RunDir(Path(run_dir))
    pairs = [r for r in run.read("comparison") if r.get("kind") == "pair" and r.get("base") and r.get("trained")]
    correct = lambda episode: bool(episode.get("correct"))  # noqa: E731
    keep = run.read_status(default={}).get("keep_best") or {}
    return {
        "fixed": sum(correct(p["trained"]) and not correct(p["base"]) for p in pairs) if pairs else None,
        "broken": sum(correct(p["base"]) and not correct(p["trained"]) for p in pairs) if pairs else None,
        "kept_step": keep.get("step"),
        "validation": {str(e["step"]): e["success_rate"] for e in run.read("evals")
                       if e.get("split") == "validation" and e.get("success_rate") is not None},
    }


def grpo_rewards(run: Any) -> list[float]:
    """The mean reward of each logged GRPO step of a run (`run`: a `training.run.directory.RunDir`), in order."""
    return [m["reward"] for m in run.read("metrics") if m.get("phase", "grpo") == "grpo" and "reward" in m]


def reward_fifths(rewards: list[float]) -> tuple[float | None, float | None]:
    """The mean of the first fifth and of the last fifth of `rewards` (at least one step each; None, None for none)."""
    if not rewards:
        return None, None
    fifth = max(1, len(rewards) // 5)
    return sum(rewards[:fifth]) / fifth, sum(rewards[-fifth:]) / fifth


def measurement(config, run_dir: Path | str, *, device: str | None, minutes: float, command: str,
                phase_seconds: dict[str, float] | None = None, peak_memory_gb: float | None = None,
                disk_written_gb: float | None = None, mean_load: float | None = None,
                load_before: float | None = None, note: str | None = None) -> dict[str, Any]:
    """The `configs/measured.json` entry of a finished run of `config` (its comparison summary read from
    `run_dir`): success and EX at each stage on the comparison's eval questions, minutes all-in (and the CPU minutes
    of this process), memory, disk, seconds per phase, steps and episodes, the command, and a note saying when other
    work shared the cores (`shared`: the load before the run reached `BUSY_LOAD`, or averaged more than the cores
    during it).

    Args:
        config: the run's `TrainConfig`.
        device: the device it trained on ("cpu", "cuda").
        minutes: wall minutes all-in.
        command: the command line that ran it (`command_line`).
        phase_seconds, peak_memory_gb, disk_written_gb, mean_load: what `PhaseClock` and `MemoryMeter` measured.
        load_before: the 1-minute load when the run started (`machine_load`).
        note: anything else the entry should say.
    """
    from training.run.directory import RunDir

    run = RunDir(Path(run_dir))
    summary = next(r for r in reversed(run.read("comparison")) if r.get("kind") == "summary")

    def stage(key: str, field: str) -> float | None:
        result = summary.get(key)
        return result.get(field) if isinstance(result, dict) else None

    warm = bool(config.resolved_sft().enabled)
    # Without a warm start the `base` column is the model before any training: zero-shot for a pretrained model.
    keys = {"random": "random", "zero_shot": "zero_shot" if warm else "base", "warm_start": "base" if warm else None,
            "after_grpo": "trained"}
    success = {name: stage(key, "success_rate") if key else None for name, key in keys.items()}
    ex = {name: stage(key, "execution_accuracy") if key else None for name, key in keys.items()}
    cores = usable_cores()
    notes = [note] if note else []
    # More runnable threads than cores during the run, or other work already there when it began: it waited for
    # cores, and its wall minutes are longer than an idle machine's (its CPU minutes are not).
    shared = (load_before is not None and load_before >= BUSY_LOAD) or (mean_load is not None and mean_load > cores)
    loads = ", ".join(part for part in (
        f"the 1-minute load was {load_before:g} before the run" if load_before is not None else "",
        f"averaged {mean_load:g} during it" if mean_load is not None else "") if part)
    if shared:
        notes.append(f"shared machine: {loads} on {cores} cores, so the minutes are longer than on idle cores "
                     "(cpu_minutes: this process's CPU time)")
    elif loads:
        notes.append(f"idle cores: {loads} on {cores} cores")
    sft = config.resolved_sft()
    return {
        "model": config.model, "dataset": config.dataset,
        "machine": f"{cores}-core CPU" if device in (None, "cpu") else str(device),
        "minutes": round(minutes, 1),
        "cpu_minutes": cpu_minutes(),
        "cores": cores,
        "load_before": load_before,
        "mean_load": mean_load,
        "shared": shared,
        "peak_memory_gb": peak_memory_gb,
        "disk_written_gb": disk_written_gb,
        "phase_seconds": {k: round(v, 1) for k, v in (phase_seconds or {}).items()},
        "sft_steps": sft.max_steps if sft.enabled else 0,
        "grpo_episodes": config.max_steps * config.per_device_train_batch_size * config.gradient_accumulation_steps,
        "comparison_episodes": summary.get("n_episodes", config.comparison_episodes),
        "success": success,
        "execution_accuracy": ex,
        **run_outcome(run_dir),
        "command": command,
        **({"note": "; ".join(notes)} if notes else {}),
    }
