"""GPU memory and utilisation of a run, as its status.json carries them while it trains on a GPU.

The run's heartbeat (`training.train`, every `HEARTBEAT_SECONDS`) stores `gpu_readout()` under `status["gpu"]`, so
any reader (the dashboard's Train tab, which trains in a child process) shows the run's own figures: torch's CUDA
allocator statistics of the training process (allocated by tensors, reserved by the caching allocator, the peak) and
the device's utilisation and used memory from NVML (`pynvml`, when installed) or `nvidia-smi`, as trackio's and
LlamaBoard's system panels read them.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

__all__ = ["gpu_readout"]


def gpu_readout(device: int = 0) -> dict[str, Any] | None:
    """Memory and utilisation of CUDA device `device` (default 0) seen from this process, or None without one.

    Returns `{"name", "allocated_gb", "reserved_gb", "peak_gb", "total_gb", "used_gb", "utilization"}`: the first
    three are this process's (torch), `used_gb` and `utilization` (percent) the whole device's (None when neither
    NVML nor nvidia-smi answers).
    """
    import torch

    if not torch.cuda.is_available():
        return None
    gib = 2**30
    props = torch.cuda.get_device_properties(device)
    readout = {
        "name": props.name,
        "allocated_gb": round(torch.cuda.memory_allocated(device) / gib, 3),
        "reserved_gb": round(torch.cuda.memory_reserved(device) / gib, 3),
        "peak_gb": round(torch.cuda.max_memory_allocated(device) / gib, 3),
        "total_gb": round(props.total_memory / gib, 3),
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
