"""`security/web_server.py` in its smallest form (see `test_bench_smoke_a.py`): the server a Space runs (`--web`)
under issue 43's shapes, 10 steps of 1 MB arguments instead of 1,000. A file of its own: the script spends most of
its ~70 s waiting on the server (its Gradio calls, its trim), and pytest-xdist gives each file to one worker, so the
others keep the cores busy meanwhile (~15 s of CPU in all). The figures mean nothing at this size; each shape is
tested where it is fixed (tests/test_server_web.py, tests/test_server_websockets.py).
"""

from __future__ import annotations

import pytest

from bench_smoke import run_bench


@pytest.mark.slow  # scheduled among the first files: a long wait at the suite's end would hold its last worker
def test_web_server(builtin):
    figures = run_bench("security/web_server.py", "--steps", "10", "--wait", "3")
    assert figures["server_alive"] and figures["ui_socket_accepted"] is False
    assert figures["page_steps_answered"] == figures["page_steps_sent"] > 0
    assert figures["big_steps_answered"] == figures["big_steps"] == 10
    assert figures["gradio_calls"] == 200 and figures["upload_bytes_kept"] == 0
    assert figures["large_outcomes"] == ["closed"] * 17  # every message past the bounds closed unparsed
