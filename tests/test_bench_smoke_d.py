"""The three security benches in their smallest form (see `test_bench_smoke_a.py`), in a file of their own: each spends
most of its time waiting on the server's own timeouts, and pytest-xdist gives each file to one worker, so the others
keep the cores busy meanwhile.

- `security/web_server.py`: the server a Space runs (`--web`) under issue 43's shapes, 10 steps of 1 MB arguments
  instead of 1,000 (~70 s, ~15 s of CPU);
- `security/websocket_holds.py`: issue 49's shapes, 5 MB of pings instead of 500 (~46 s, its 20 s reset and
  session timeouts; ~6 s of CPU);
- `security/soak.py`: 5 s of 2 honest and 2 hostile sessions instead of 600 s of 64 and 64 (~72 s: the server's
  rest after the soak and the hostile shapes' timeouts; ~36 s of CPU).

The figures mean nothing at this size; each shape is tested where it is fixed (tests/test_server_web.py,
tests/test_server_websockets.py).
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


@pytest.mark.slow
def test_websocket_holds():
    figures = run_bench("security/websocket_holds.py", "--ping-mb", "5")
    assert figures["server_alive"] and figures["mcp_sockets"] == 64
    assert figures["mcp_accepted"] + figures["mcp_refused"] == 64 and figures["mcp_honest_served"] == "10 of 10"
    assert figures["mcp_values_outcomes"] == ["closed"] * 4 and figures["mcp_kept_past_wait"] == 0
    assert figures["ping_ended_by_server"] == [True] and figures["ping_rss_growth_mb"] < 100
    assert figures["shares_honest_served"] == "10 of 10" and figures["shares_newcomers_served"] == "4 of 4"
    assert figures["unread_session_end_s"] <= 30  # its 20 s session timeout, and a loaded machine's lateness


@pytest.mark.slow
def test_soak():
    figures = run_bench("security/soak.py", "--duration", "5", "--honest", "2", "--hostile", "2")
    assert figures["server_alive"] and figures["requests"] > 0 and figures["honest_episodes"] > 0
    assert figures["honest_errors"] == 0 and figures["breaches"] == 0 and figures["sessions_leaked"] == 0
    assert figures["health_failures"] == 0 and sum(figures["hostile_shapes"].values()) == 2
