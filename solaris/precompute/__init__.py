"""What fills the cache: the FM worker's lease -> history -> FM + encoder step (``worker``),
the precompute queue (``pqueue``), the cost ledger (``ledger``) and the speculation
policies (``speculation``)."""
