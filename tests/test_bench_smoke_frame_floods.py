"""`security/frame_floods.py` and `security/openai_bodies.py` in their smallest forms (see `test_bench_smoke_a.py`):
issue 59's shapes, each flood 1 s instead of 20, a 2 MB body instead of 20. The figures mean nothing at this size; each shape is tested where it is fixed
(tests/test_server_frames.py, tests/test_server_addresses.py)."""

from __future__ import annotations

from bench_smoke import run_bench


def test_frame_floods():
    figures = run_bench("security/frame_floods.py", "--flood-s", "1")
    assert figures["server_alive"]
    assert figures["continuation_kept"] == 0 and figures["continuation_ended"] >= 1
    assert figures["fragments_kept"] == 0 and figures["fragments_ended"] >= 1
    assert figures["forwarded_sessions_held"] <= 16 and figures["forwarded_honest_served"] == "10 of 10"


def test_openai_bodies():
    figures = run_bench("security/openai_bodies.py", "--body-mb", "2")
    assert figures["server_alive"] and figures["big_status"] == 413
    assert figures["many_status"] == figures["n_abc_status"] == figures["n_1e400_status"] == 400
