"""The benches: scripts that print figures (the last line one JSON object), one folder per concept (bench/README.md
lists every script). The top floor: they may import `sqlenv`, `training`, `dashboard`, `app` and the tests' helpers."""
