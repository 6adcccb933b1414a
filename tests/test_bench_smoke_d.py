"""`security/websocket_holds.py` in its smallest form (see `test_bench_smoke_a.py`): issue 49's shapes, 5 MB of pings
instead of 500 (~46 s, most of it the server's 20 s reset and session timeouts; ~6 s of CPU), in a file of its own so
that its waiting overlaps the other workers' CPU. The figures mean nothing at this size; each shape is tested where it
is fixed (tests/test_server_websockets.py).

The other two security benches wait out the server's timeouts too, on more CPU: `security/web_server.py` (~70 s, ~15 s
of CPU at `--steps 10 --wait 3`) and `security/soak.py` (~72 s, ~36 s of CPU at `--duration 5 --honest 2 --hostile
2`). With them this file held one worker ~180 s and a fresh-clone CI took 958 s all-in (818 s of tests; 808 s and
710 s the run before), past its 15 minutes, though the host's own pace varies as much; their shapes are tested where
they are fixed (tests/test_server_web.py, tests/test_server_websockets.py, tests/test_adversarial.py).
"""

from __future__ import annotations

import pytest

from bench_smoke import run_bench


@pytest.mark.slow
def test_websocket_holds():
    figures = run_bench("security/websocket_holds.py", "--ping-mb", "5")
    assert figures["server_alive"] and figures["mcp_sockets"] == 64
    assert figures["mcp_accepted"] + figures["mcp_refused"] == 64 and figures["mcp_honest_served"] == "10 of 10"
    assert figures["mcp_values_outcomes"] == ["closed"] * 4 and figures["mcp_kept_past_wait"] == 0
    assert figures["ping_ended_by_server"] == [True] and figures["ping_rss_growth_mb"] < 100
    assert figures["shares_honest_served"] == "10 of 10" and figures["shares_newcomers_served"] == "4 of 4"
    assert figures["unread_session_end_s"] <= 30  # its 20 s session timeout, and a loaded machine's lateness

