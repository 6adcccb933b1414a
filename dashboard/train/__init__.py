"""The Train tab: `tab` lays it out and wires Start, Stop and the long poll to the runner; `form` (the config form,
its model picker `model_picker` and cost line `cost_line`), `live` (the status bar `status`, the live charts
`live_plot`, the latest trace), `gpu` (has this machine a GPU; a run's GPU readout).

Imports `dashboard.core` and `dashboard.access`, never another tab.
"""
