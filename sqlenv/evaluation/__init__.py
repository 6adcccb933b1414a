"""Evaluation, the "green agent": policies play episodes and the results are scored, broken down and saved.

- `evaluate`: `evaluate()` plays a policy for N episodes and returns an `EvaluationResult`;
- `concurrent`: the same with N episodes in flight, for policies that wait on an endpoint;
- `policies`: the seeded random agent, the gold-reading oracle and the untrained agent's two mistakes;
- `openai_policy`: any chat model behind an OpenAI-compatible endpoint, through the trained model's four tools;
- `breakdown`: success and EX overall, per hardness and per database, with 95% Wilson intervals;
- `saved`: the one on-disk format of an evaluation (`python -m sqlenv eval --out DIR`, the Compare tab).

May import: the core's `types`, `sqlenv.agent` (what a model reads and writes), `sqlenv.scoring` (the oracle's
answer text), `sqlenv.data` (hardness levels, the atomic swap of a saved directory) and the core's `json_files`
(a saved evaluation's bounded reads). Environments come in as arguments (anything with the
`sqlenv.protocol.Environment` interface), never imported.
"""
