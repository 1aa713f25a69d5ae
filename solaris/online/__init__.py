"""The request path: what the router and the VM replicas run for every request --
enrichment (``enrich``: a request's keys and its slots), the serving-side state (``serving``:
published KNN tables, cold-start memo, the after-answer policy), the vertical models
(``scoring``), the verifier's picks (``verifier``), rollout and live scales."""
