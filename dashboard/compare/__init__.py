"""The Compare tab: `tab` shows a run's policies on the same eval question side by side and their tables
(`dashboard.core.results`); `added_columns` adds columns from saved evaluations and other runs.

Imports `dashboard.core` and `dashboard.access`, never another tab.
"""
