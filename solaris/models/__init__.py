"""Pure-torch models: the foundation model, the pair encoder, vertical models."""
