"""Shared pytest fixtures. Real files only: datasets are built into temp folders, Spider is read in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sqlenv.spider import default_spider_dir

# OpenMP's default busy-waiting collapses on a shared, oversubscribed 2-core machine (measured: training steps
# ~25x slower while other jobs run); passive waiting costs nothing when the machine is idle. Before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def spider_source() -> Path:
    """The local Spider copy: `$SQLENV_SPIDER_DIR`, defaulting to `../shared/spider` beside the repository."""
    path = default_spider_dir()
    if not (path / "tables.json").exists():
        if os.environ.get("CI"):
            pytest.fail(f"Spider data not found at {path} (set SQLENV_SPIDER_DIR)")
        pytest.skip(f"Spider data not found at {path} (set SQLENV_SPIDER_DIR)")
    return path


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(questions_path, db_dir) of the small real toy dataset every answer type is covered by."""
    from sqlenv.checker import build_toy_dataset

    return build_toy_dataset(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="module")
def builtin():
    """The built-in dataset's `DatasetInfo` (built under `data/` on first use). Modules that build their own
    copy in a temp folder define a `builtin` fixture of their own."""
    from sqlenv.datasets import resolve_dataset

    return resolve_dataset("builtin")


@pytest.fixture(scope="module")
def questions(builtin):
    """The built-in dataset's train questions."""
    from sqlenv.datasets import load_questions

    return load_questions(builtin.questions_path("train"))


@pytest.fixture()
def env(toy):
    """A fresh SQLEnvironment on the toy dataset, closed after the test."""
    from sqlenv.environment import SQLEnvironment

    e = SQLEnvironment(*toy)
    yield e
    e.close()


# --------------------------------------------------------------------------- short real training runs
@pytest.fixture(scope="module")
def one_cpu_thread():
    """The tiny model's ops are too small to split; two threads per process crawl on a busy machine. Use with
    `pytestmark = pytest.mark.usefixtures("one_cpu_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    """(model, tokenizer) of the built-in tiny model on CPU, shared by a module (deep-copy before training)."""
    from training.models import load_model_and_tokenizer

    return load_model_and_tokenizer("builtin:tiny", device="cpu")
