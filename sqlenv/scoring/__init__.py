"""Scoring an answer: is it right? The typed answer verifier (the terminal reward) and execution accuracy (EX).

- `verifier`: `verify_answer` (typed comparison of the ANSWER text to the gold) and `format_answer`;
- `execution`: EX exactly as published Spider results compute it (the predicted and gold queries run in the sandbox);
- `result_eq`: whether two query results are the same denotation (test-suite-sql-eval's `result_eq`).

May import: `sqlenv.sandbox` (queries run there) and `sqlenv.agent.fences` (an answer may come in a code fence).
"""
