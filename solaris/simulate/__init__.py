"""What serving would have served, simulated over a request log (product code).

Training reads it (the VMs train on the SOLARIS inputs the speculation schedule would have
produced at each row's request time: ``schedule.py``, ``served.py``), and the replay compares
the live system against the same code. Nothing here imports the replay, the closed loop,
the reports or the benches.

- ``log.py``: the request log (who asked for which candidates when) and causal retrieval;
- ``coverage.py``: the verifier -> queue -> budgeted FM -> store loop on (user, item) keys;
- ``schedule.py``: that loop over a period's rows, as the presence masks training reads;
- ``served.py``: the same loop with embeddings -- the slots as served.
"""
