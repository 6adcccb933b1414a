"""`make browser` (run by `make test`): installing Chromium for the browser tests is said, never silent."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _make_browser(tmp_path: Path, apt_exit: int) -> subprocess.CompletedProcess:
    """`make -s browser` with a PATH that has no chromium, `id` saying root, and an `apt-get` stub that records
    its arguments and exits with `apt_exit`."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "id").write_text("#!/bin/sh\necho 0\n")
    (stubs / "apt-get").write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/apt-args"\necho noisy apt output\n'
                                   f"exit {apt_exit}\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": str(stubs)}
    return subprocess.run([make, "-s", "-C", str(REPO), "browser"], capture_output=True, text=True, env=env,
                          timeout=60)


def test_a_missing_chromium_is_installed_visibly(tmp_path):
    res = _make_browser(tmp_path, apt_exit=0)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "apt-args").read_text().split() == ["install", "-y", "-q", "chromium"]
    lines = res.stdout.splitlines()
    assert lines == ["browser tests: chromium is missing, installing it: apt-get install -y chromium",
                     "browser tests: chromium installed"]


def test_a_failed_install_says_the_browser_tests_will_be_skipped(tmp_path):
    res = _make_browser(tmp_path, apt_exit=100)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1].startswith("chromium not installed: browser tests will be skipped")
