"""The SQL sandbox: where every QUERY, DESCRIBE and SAMPLE runs, read-only and bounded in time, memory and text.

- `sandbox`: `Sandbox`, the one door (schema, samples, queries) built from the modules below;
- `sql_checks`: what SQL may run (text checks, the connection's authorizer, database paths);
- `sql_costs`: the price of every SQL function allowed between two time checks;
- `prepare_cost`: the price of preparing a statement (the copies SQLite makes of CTEs and subqueries);
- `sql_runner`: the read-only connection, the time limit and the capped fetch of rows;
- `watchdog`: the thread that interrupts every statement at its deadline;
- `heap_room`: room in SQLite's shared heap (idle connections closed, the longest statement stopped);
- `limits`: `SandboxSettings` (every number that bounds time, memory or text) and SQLite's heap limit;
- `result_text`: result tables and cells as observation text, cut to bounded lengths;
- `native_memory`: giving freed memory back to the system (glibc).

May import: nothing else from `sqlenv` (the standard library and sqlglot only): the sandbox is the floor that
everything holding SQL stands on, and it knows nothing of episodes, rewards or models.
"""
