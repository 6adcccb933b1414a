"""What a run learns and what its steps cost: learning curves, a real model end to end, a GRPO sweep, a step's loss,
profile and threads, the question sampler in simulation, episodes in tokens; `meters`, shared by the benches that
record a config's cost in `configs/measured.json`."""
