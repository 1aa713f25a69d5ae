"""Data: schemas, the synthetic generator, loaders and time splits."""
