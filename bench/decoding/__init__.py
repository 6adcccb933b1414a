"""The model playing: the decoders side by side, batched rollouts, an OpenAI-compatible endpoint's episodes/s."""
