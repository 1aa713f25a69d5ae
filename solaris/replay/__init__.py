"""Event-time replay of a request log through the serving system: the request log, coverage
measures and a key-level simulator of the precompute schedule, and their plots."""
