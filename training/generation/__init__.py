"""A causal LM playing SQLEnv: conversations rendered as TRL renders them (`chat`), batched decoding (`decoding`),
many episodes played together (`episodes`), the model as an evaluation policy (`model_policy`), and the model behind
an OpenAI-compatible endpoint (`openai_server`). Used by the GRPO rollouts, the evals and the comparison."""
