"""The agent's side of the text: what a language model reads and what it writes, turned into actions.

- `prompts`: the system prompt, the first user turn, the four tools' schemas, tool results and the context budget;
- `model_output`: the action in a model turn (a tool call, or `ACTION: argument` text) parsed into a `SQLAction`;
- `fences`: code fences in model and user text, read in linear time.

May import: the core's `types` only: this is plain text, with no model, tokenizer or environment behind it (the
training package brings those).
"""
