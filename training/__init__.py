"""GRPO training for SQLEnv with TRL.

Importing this package is cheap (no torch): heavy modules are imported where they are used, so the dashboard
can read run directories without loading an ML stack.
"""
