"""SQL shapes shared by the sandbox's tests and the soak (`bench/security/soak.py`)."""

from __future__ import annotations


def row_of(call: str, n: int) -> str:
    """A select list of `n` copies of `call` in at most 100 columns (the sandbox's `max_columns` is 128), summed:
    `+` calls no function, so the program holds exactly `n` calls of it."""
    per = -(-n // 100)
    return ", ".join("+".join([f"({call})"] * min(per, n - i)) for i in range(0, n, per))
