"""A causal LM playing SQLEnv: conversations rendered as TRL renders them (`chat`), batched decoding (`decoding`;
each episode's KV cache kept across turns: `multi_turn`, and on a GPU `graph_decoder` over `slot_model`,
`decode_state` and `step_graphs`, picked by `decoders`), many episodes played together (`episodes`), the model as an
evaluation policy (`model_policy`), and the model behind an OpenAI-compatible endpoint (`openai_server`). Used by the
GRPO rollouts, the evals and the comparison."""
