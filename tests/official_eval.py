"""test-suite-sql-eval's own code, as PyPI's `nl2sql360` (MIT) ships it: `nl2sql360/evaluator/test_suite_sql_eval/`
holds `exec_eval.py` and `parse.py` byte for byte as the official repository has them (only the import of `parse`
made relative). The tests label query pairs with it; the project never imports it.

`make install` installs it with `--no-deps` (its own dependencies, database drivers among them, are not needed by
`exec_eval`, which needs sqlparse and tqdm). It is loaded without running `nl2sql360/evaluator/__init__.py`, which
imports its other evaluators: a package module of our own points at that folder.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

PACKAGE = "_official_test_suite_sql_eval"


def official_exec_eval():
    """The official `exec_eval` module; skips the calling test when nl2sql360 is not installed."""
    if PACKAGE + ".exec_eval" in sys.modules:
        return sys.modules[PACKAGE + ".exec_eval"]
    spec = importlib.util.find_spec("nl2sql360")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        message = ("nl2sql360 (test-suite-sql-eval's code) is not installed: "
                   "pip install --no-deps nl2sql360==1.1.0 (make install does)")
        if os.environ.get("CI"):  # CI installs it: a missing copy must not silently drop the official labels
            pytest.fail(message)
        pytest.skip(message)
    folder = Path(spec.submodule_search_locations[0]) / "evaluator" / "test_suite_sql_eval"
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(folder)]
    sys.modules[PACKAGE] = package
    return importlib.import_module(PACKAGE + ".exec_eval")


# `eval_exec_match` runs each query with `asyncio.run`, which refuses to start where an event loop already runs:
# in the whole suite, the browser tests' Playwright (sync API) keeps one running on the main thread for the session.
# A thread of its own has none.
_RUNNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="official-exec-eval")


def official_label(db_path: Path, pred: str, gold: str) -> int:
    """`eval_exec_match` with the defaults every published Spider EX uses: 1 (match) or 0."""
    exec_eval = official_exec_eval()
    return _RUNNER.submit(exec_eval.eval_exec_match, db=str(db_path), p_str=pred, g_str=gold, plug_value=False,
                          keep_distinct=False, progress_bar_for_each_datapoint=False).result()
