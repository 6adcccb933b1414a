"""notebooks/train_grpo.ipynb runs end to end offline (nbclient), on the tiny config made even smaller."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "train_grpo.ipynb"

# The tiny config shrunk to a couple of minutes on 2 CPU cores: one GRPO step, a one-step SFT warm-start,
# one eval episode per split at the end and one comparison pair. The flow, files and plots are what is tested here;
# learning itself is measured by bench/learning/learning_curve.py.
SMOKE_OVERRIDES = {
    "max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 2, "step_budget": 3,
    "max_completion_length": 96, "max_turn_tokens": 24, "sft": {"max_steps": 1, "episodes": 4, "batch_size": 4},
    "eval_every": 0, "eval_episodes": 1, "trace_every": 0, "plot_every": 1, "comparison_episodes": 1,
    "compare_base": False,
}


@pytest.mark.slow
def test_notebook_runs_end_to_end(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    out_dir = tmp_path / "run"
    monkeypatch.setenv("SQLENV_NOTEBOOK_OVERRIDES", json.dumps({**SMOKE_OVERRIDES, "output_dir": str(out_dir)}))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: nothing may come from the Hub
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    nb = nbformat.read(NOTEBOOK, as_version=4)
    # Opened from notebooks/, as a user would: the setup cell must find the repository root itself.
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO / "notebooks")}})
    client.execute()  # raises CellExecutionError (with the cell's traceback) if any cell fails

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "\n".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    html = "\n".join(o.get("data", {}).get("text/html", "") for o in outputs if "data" in o)
    images = [o for o in outputs if "image/png" in o.get("data", {})]

    # Smoke test: the oracle solves, the random policy does not.
    assert "oracle: success 100%" in text and "random: success 0%" in text
    # Training ran, with live lines and a live plot, and finished.
    assert "step    1" in text and "run directory:" in text
    assert len(images) >= 2  # the live figure (display handle) and the summary figure
    status = json.loads((out_dir / "status.json").read_text())
    assert status["status"] == "completed", status
    assert "status: completed" in text
    # Random vs trained, side by side, from comparison.jsonl.
    records = [json.loads(line) for line in (out_dir / "comparison.jsonl").read_text().splitlines()]
    assert any(r.get("kind") == "summary" for r in records)
    assert "random" in text and "trained" in text and "<table>" in html and "Gold SQL" in html
    # Where the weights are, and they load.
    assert f"weights saved in: {(out_dir / 'final').resolve()}" in text
    assert (out_dir / "final" / "config.json").exists() and "reloaded:" in text
