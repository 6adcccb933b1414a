"""Shared pytest fixtures. Real files only: datasets are built into temp folders, Spider is read in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sqlenv.data.spider import default_spider_dir

# OpenMP's default busy-waiting collapses on a shared, oversubscribed 2-core machine (measured: training steps
# ~25x slower while other jobs run); passive waiting costs nothing when the machine is idle. Before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Under pytest-xdist three workers share two cores, so a torch process that splits its ops over 2 threads waits for a
# core another worker holds: SmolLM2's three decoder plays took 19 CPU-seconds at 1 thread and 60 s at 2 beside one
# busy core. Workers, and the processes they start, take 1 thread unless they choose their own (a training run
# resolves its own: `training.device.resolve_cpu_threads`; the benches take `--threads`). Before torch loads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO_ROOT = Path(__file__).resolve().parent.parent
# The float model converted from a GGUF file, kept for the session's every process (workers, CLI runs, servers): the
# first load converts it (~25 s), the rest read it (<1 s). Here, not in the user's ~/.cache.
os.environ.setdefault("SQLENV_MODEL_CACHE", str(REPO_ROOT / ".cache" / "models"))


# --------------------------------------------------------------------------- pytest-xdist
# `make test` runs `pytest -n 3`; pyproject's addopts say `--dist loadfile --no-loadscope-reorder`: a worker is handed
# whole groups, in the order the workers collected them.
BROWSER_TESTS = "tests/browser"
HEAVY_FIRST = ("browser", "slow")  # a group's rank: its heaviest mark; unmarked groups come last


def worker_group(nodeid: str) -> str:
    """The group a test runs in, on one worker: its file, so that module fixtures (a trained model, an app server, a
    built dataset) are built by one worker only; and the whole of tests/browser/ as one, so that one Chromium and
    one dashboard server (the session's) serve every browser test, and test_dashboard.py's tests keep their order
    (Compare and Runs open the run its training test made)."""
    path = nodeid.split("::", 1)[0]
    return BROWSER_TESTS if path.startswith(BROWSER_TESTS + "/") else path


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own choice; no error where xdist is absent
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, with `worker_group` for a file. (Overriding `_split_scope` is how xdist's own schedulers
    differ; its `loadgroup` cannot be used: it marks a test's group by rewriting `item._nodeid`, which pytest 9.2
    no longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On xdist workers, the heaviest groups first (browser, then those with slow tests), so neither worker is left
    running a long file at the end while the other idles. Each worker collects and sorts alike (a stable sort keeps
    every file's own order); a plain run keeps the usual order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank: dict[str, int] = {}
    for item in items:
        heaviest = next((i for i, mark in enumerate(HEAVY_FIRST) if item.get_closest_marker(mark)), len(HEAVY_FIRST))
        group = worker_group(item.nodeid)
        rank[group] = min(rank.get(group, heaviest), heaviest)
    items.sort(key=lambda item: rank[worker_group(item.nodeid)])


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
    from sqlenv.data.datasets import resolve_dataset

    return resolve_dataset("builtin")


@pytest.fixture(scope="module")
def questions(builtin):
    """The built-in dataset's train questions."""
    from sqlenv.data.datasets import load_questions

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
    from training_helpers import built_tiny_model

    built_tiny_model()  # built once for all test processes

    return load_model_and_tokenizer("builtin:tiny", device="cpu")
