"""The GPU readout of the Train tab: memory and utilisation while a run trains on a GPU (hidden on CPU).

Training runs in the dashboard's own process (`dashboard.runner`), so torch's CUDA allocator statistics are the
run's own: memory allocated by tensors, reserved by the caching allocator, and the peak. Utilisation is the
device's, from NVML (`pynvml`, when installed) or `nvidia-smi`, as trackio's and LlamaBoard's system panels read it.
A reading is cached for `READOUT_SECONDS`, so many open pages cost one query, not one each.
"""

from __future__ import annotations

import html
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

__all__ = ["has_gpu", "gpu_readout", "readout_html"]

#: How long one reading is reused (every open page polls; the device is asked once per interval).
READOUT_SECONDS = 2.0
_cache: dict[str, Any] = {"at": -1e9, "value": None}
_lock = threading.Lock()


def has_gpu() -> bool:
    """This machine has an NVIDIA GPU (its driver's `nvidia-smi` is on the PATH, as the Makefile checks): cheap,
    without importing torch into the dashboard before a run needs it."""
    return shutil.which("nvidia-smi") is not None


def gpu_readout(device: int = 0) -> dict[str, Any] | None:
    """Memory and utilisation of GPU `device` (default 0), or None without a CUDA GPU.

    Returns `{"name", "allocated_gb", "reserved_gb", "peak_gb", "total_gb", "used_gb", "utilization"}`: the first
    three are this process's (torch), `used_gb` and `utilization` (percent) the whole device's (None when neither
    NVML nor nvidia-smi answers).
    """
    with _lock:
        if time.monotonic() - _cache["at"] < READOUT_SECONDS:
            return _cache["value"]
        value = _read(device)
        _cache.update(at=time.monotonic(), value=value)
        return value


def _read(device: int) -> dict[str, Any] | None:
    # Only a process that already imported torch can be training on a GPU; importing it here would cost seconds.
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    gib = 2**30
    props = torch.cuda.get_device_properties(device)
    readout = {
        "name": props.name,
        "allocated_gb": torch.cuda.memory_allocated(device) / gib,
        "reserved_gb": torch.cuda.memory_reserved(device) / gib,
        "peak_gb": torch.cuda.max_memory_allocated(device) / gib,
        "total_gb": props.total_memory / gib,
        "used_gb": None,
        "utilization": None,
    }
    readout.update(_device_usage(device))
    return readout


def _device_usage(device: int) -> dict[str, Any]:
    """The device's utilisation (%) and used memory (GiB): NVML when installed, else nvidia-smi, else nothing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        return {"utilization": float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                "used_gb": pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30}
    except Exception:  # noqa: BLE001 - not installed, or no driver access: try nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    try:
        out = subprocess.run([smi, f"--id={device}", "--query-gpu=utilization.gpu,memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=2.0)
        util, used = (float(x) for x in out.stdout.strip().split(",")[:2])
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}
    return {"utilization": util, "used_gb": used / 1024}


def readout_html(readout: dict[str, Any] | None) -> str:
    """One line for the status bar (`id="train-gpu"`), or "" without a GPU."""
    if not readout:
        return ""
    parts = [f'{readout["allocated_gb"]:.1f} GiB allocated (peak {readout["peak_gb"]:.1f}, reserved '
             f'{readout["reserved_gb"]:.1f}) of {readout["total_gb"]:.0f} GiB']
    if readout.get("used_gb") is not None:
        parts.append(f'device {readout["used_gb"]:.1f} GiB used')
    if readout.get("utilization") is not None:
        parts.append(f'utilisation {readout["utilization"]:.0f}%')
    util = "" if readout.get("utilization") is None else f'{readout["utilization"]:.0f}'
    return (f'<div id="train-gpu" class="sqe-muted" data-utilization="{util}">GPU {html.escape(readout["name"])}: '
            f'{" · ".join(parts)}</div>')
