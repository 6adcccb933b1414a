"""The hardware a run uses, decided once by the run plan (`training.plan.RunPlan.resolve`): the device, the precision
and the CPU threads. Below the plan and the model loader alike (`training.models.resolve_device_dtype` picks the same
way), so neither imports the other for it. torch is imported only where a GPU is asked about.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["resolve_device", "busy_cores_now", "idle_cores", "resolve_cpu_threads", "CPU_BF16_ENV", "BF16_CPU_FLAGS",
           "cpu_has_bf16_units", "resolve_precision"]


def resolve_device(device: str = "auto") -> str:
    """`"auto"` → `"cuda"` when a CUDA GPU is visible, else `"cpu"`; any other value as it is."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def busy_cores_now(window_s: float = 1.0) -> float | None:
    """The cores the machine keeps busy now: its CPU time that was not idle over the next `window_s` seconds
    (Linux's /proc/stat), in cores. None where /proc/stat cannot be read."""
    import os
    import time

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as stat:
            ticks = [int(t) for t in stat.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        return sum(ticks), ticks[3] + ticks[4]

    try:
        total0, idle0 = sample()
        time.sleep(window_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (1 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)


def idle_cores() -> int:
    """The cores this process may use that no other job holds now: the cores of its CPU set less the cores the
    machine keeps busy over the next second (`busy_cores_now`, rounded; the call waits that second; the 1-minute load
    average where /proc/stat cannot be read), at least 1. The load average is not the first choice: it decays over
    minutes, so a run started just after another job ended read that job's load and took one core of two for its
    whole length.

    Why it matters (`python bench/learning/cpu_threads.py`, SmolLM2-135M's forward and backward over 700 tokens, 2
    cores): idle, 2 torch threads take 4.5-4.8 s a step and 1 thread 8.1 s; beside one other CPU job, 2 threads take
    9.5-16 s (their OpenMP threads wait for a core the other job holds, spinning) and 1 thread 7.9-8.1 s; at load 6 the
    default 2 threads took 57.6 s. So a run takes the cores that are free when it starts."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    busy = busy_cores_now()
    if busy is None:
        try:
            busy = os.getloadavg()[0]
        except (OSError, AttributeError):
            busy = 0.0
    return max(1, min(cores, (os.cpu_count() or cores) - round(busy)))


def resolve_cpu_threads(config: Any) -> int:
    """Torch threads of a CPU run: `cpu_threads`, else 1 for `builtin:tiny` (its matrices are too small to split),
    else `idle_cores()` when the run starts."""
    if config.cpu_threads is not None:
        return config.cpu_threads
    return 1 if config.is_builtin_model else idle_cores()


#: Forces the answer of `cpu_has_bf16_units`: "1" (bf16 units present) or "0" (none), for a CPU the probe misreads.
CPU_BF16_ENV = "SQLENV_CPU_BF16"
#: The /proc/cpuinfo flags of the matrix units oneDNN runs bf16 matmuls on (Intel AMX, AVX512-BF16; AMD Zen 4+ lists
#: avx512_bf16). Without them torch converts bf16 to fp32 around every product: 4.6-7.6x SLOWER than fp32 on an AVX2
#: EPYC (a 576 -> 1536 linear at 16-512 rows, 1 thread), where a CPU listing amx_bf16 runs it 2.8-7.1x faster.
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_has_bf16_units(cpuinfo: str | None = None) -> bool:
    """Whether this CPU has bf16 matrix units (`BF16_CPU_FLAGS` among its flags). `cpuinfo`: the text of
    /proc/cpuinfo (default: read it; a machine without one, not Linux, answers False). `$SQLENV_CPU_BF16` set to
    "1" or "0" answers instead of the flags."""
    import os

    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise ValueError(f"{CPU_BF16_ENV}={forced!r}: expected 1 (the CPU has bf16 units) or 0 (it has none)")
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return False
    flags = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags.update(value.split())
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def resolve_precision(precision: str, device: str) -> str:
    """`"auto"` → bf16 on a CUDA GPU that supports it or a CPU with bf16 matrix units (`cpu_has_bf16_units`), fp32
    otherwise (fp16 only when asked: GRPO's ratios are fragile in fp16); any other value as it is. `device` is a
    resolved device. bf16 is mixed precision: the weights and optimizer state stay fp32, the products run in bf16
    (the trainers' autocast, and decoders that compute as it does)."""
    if precision != "auto":
        return precision
    if device == "cuda":
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device == "cpu":
        return "bf16" if cpu_has_bf16_units() else "fp32"
    return "fp32"
