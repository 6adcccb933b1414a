"""Static check: no undefined names, unused imports or syntax errors anywhere in the repository (ruff)."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT


def test_ruff_finds_no_mistakes():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", str(REPO_ROOT)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
