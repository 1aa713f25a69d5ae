"""One request definition for every consumer: which rows of a log are served together, when.

A log with request ids (the synthetic generator's) carries it on every row. A plain
interaction log (MovieLens-100K, generic logs) does not: a user's rows of one time bucket form
one request at the bucket's first ts. The offline features (history, its ages, the aggregate,
and so z and the FM's probabilities: ``solaris/features.py``) and the replay's request log
(``solaris/simulate/log.py``) both read it from here, so a row's inputs offline are the ones
its replayed request can see.
"""

from __future__ import annotations

import numpy as np

from solaris.errors import ConfigError


def request_times(users: np.ndarray, ts: np.ndarray, granularity_s: int) -> np.ndarray:
    """(N,) int64: the event time of the request each row belongs to.

    A log without request ids (MovieLens, generic logs) becomes requests as the replay builds
    them (``solaris/simulate/log.py``): a user's rows of one bucket ``floor(ts / granularity_s)``
    form one request at the bucket's first ts. ``granularity_s`` 0: each row is a request at
    its own ts. Rows must be in event order.
    """
    users = np.asarray(users)
    ts = np.asarray(ts, dtype=np.int64)
    if granularity_s < 0:
        raise ConfigError(f"granularity_s={granularity_s!r}: must be >= 0")
    if granularity_s == 0 or len(ts) == 0:
        return ts.copy()
    bucket = np.floor_divide(ts, int(granularity_s))
    order = np.lexsort((np.arange(len(ts)), bucket, users))  # by user, bucket, event order
    su, sb = users[order], bucket[order]
    new = np.ones(len(ts), dtype=bool)
    new[1:] = (su[1:] != su[:-1]) | (sb[1:] != sb[:-1])
    first = np.maximum.accumulate(np.where(new, np.arange(len(ts)), 0))
    out = np.empty_like(ts)
    out[order] = ts[order][first]
    return out
