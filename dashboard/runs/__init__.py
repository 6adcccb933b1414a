"""The Runs tab: `tab` lays it out and wires it; `table` (every run and its headline result), `detail` (one run),
`config_diff` (two runs' configs field by field), `resume` (continue a run), `hub` (push a run to the Hub).

Imports `dashboard.core` and `dashboard.access`, never another tab.
"""
