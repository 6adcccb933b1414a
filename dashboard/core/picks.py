"""Pickers whose list the server refreshes (runs, Play's questions): a refresh never undoes a pick made meanwhile.

A refresh event (page load, opening a tab, "Refresh runs") sends the dropdown's value as it was when the event
started. An answer that set the value from that copy ("keep the current run, else the newest") put back a stale one
when the user picked a run in between: under load, the page opened on the newest run a second after the user had
chosen another, and the tab showed the wrong run's comparison. So the server answers with the choices and the
default only; which value to show is decided in the page, when the answer arrives, from the value the user sees then
(`keep_picks`).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

# (value now, listing) -> the value to show: the user's pick while it is listed, else the default. A multiselect keeps
# the picks still listed. Runs in the page (a `js` event), so "now" is when the refresh's answer arrived.
KEEP_PICKS_JS = """(current, listing) => {
    const listed = (listing && listing.values) || [];
    if (Array.isArray(current)) return current.filter(v => listed.includes(v));
    return listed.includes(current) ? current : ((listing && listing.default) ?? null);
}"""


def listing(values: list[Any], default: Any = None) -> dict[str, Any]:
    """What a refresh sends a `keep_picks` dropdown: the values it may hold, and the value shown when it holds none
    of them (None: empty; a multiselect's default is ignored, it keeps what is still listed)."""
    return {"values": list(values), "default": default}


def listing_holder() -> gr.JSON:
    """A hidden component holding a refresh's `listing` for the page's `keep_picks` step."""
    return gr.JSON(None, visible=False)


def keep_picks(event, pairs: list[tuple[gr.Dropdown, gr.JSON]]):
    """After `event` (a refresh that updated each dropdown's choices and wrote its listing to its holder), set each
    dropdown's value in the page (`KEEP_PICKS_JS`); returns the chained event. A value that changes fires the
    dropdown's `change` as a pick does; one that stays fires nothing."""
    for dropdown, holder in pairs:
        event = event.then(None, inputs=[dropdown, holder], outputs=[dropdown], js=KEEP_PICKS_JS,
                           show_progress="hidden", queue=False)
    return event
