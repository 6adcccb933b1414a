"""The Play tab: `tab` lets a person play an episode by hand; `episodes` keeps every visitor's environment, bounded
in all and per client.

Imports `dashboard.core` and `dashboard.access`, never another tab.
"""
