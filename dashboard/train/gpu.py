"""The GPU line of the Train tab's status bar: memory and utilisation while a run trains on a GPU (none on CPU).

Training runs in a child process (`dashboard.core.runner`), so the figures come from the run itself: its heartbeat
stores `training.gpu.gpu_readout()` in status.json every few seconds (`status["gpu"]`), and the bar shows them.
"""

from __future__ import annotations

import html
import shutil
from typing import Any

__all__ = ["has_gpu", "readout_html"]


def has_gpu() -> bool:
    """This machine has an NVIDIA GPU (its driver's `nvidia-smi` is on the PATH, as the Makefile checks): cheap,
    without importing torch into the dashboard."""
    return shutil.which("nvidia-smi") is not None


def readout_html(readout: dict[str, Any] | None) -> str:
    """One line for the status bar (`id="train-gpu"`) from a run's `status["gpu"]`, or "" without one."""
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
