"""Where the repository's configs live, found one way: `configs/` beside the `dashboard` package."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO_ROOT", "CONFIGS_DIR", "DEFAULT_CONFIG_FILE"]

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "configs"
#: The Train form's starting values unless the app is given `--config`.
DEFAULT_CONFIG_FILE = CONFIGS_DIR / "tiny_cpu.json"
