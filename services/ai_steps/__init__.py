"""The AI steps service: lease and fence, the model call without locks, the second pass."""
