"""Request-time features of a log: numeric columns with one value per request.

A generic log's mapping may declare ``request_features: [col, ...]`` (``ColumnMapping``):
numbers known when the request is served (the hour, a device's battery, a session length,
...), the same on every row of one request. The loader checks that, standardises each column
over its requests (one value per request; a null is 0 after standardising, the mean, as the
side tables' continuous features) and carries it as a ``float32`` column of the interaction
table and of the request table, named as declared (``solaris.data.schema``). The raw mean and
std go into ``FeatureSpec`` so that serving standardises a request's value the same way
(``solaris.online.scoring.request_vector``).

Numpy in, numpy out; no Ray.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pyarrow as pa

from solaris.data.columns import Source
from solaris.data.schema import ITEM, SEQ, SURFACE, TS, USER
from solaris.errors import ConfigError

# column names of the interaction and request tables a request feature cannot take
RESERVED = (SEQ, USER, ITEM, TS, SURFACE, "request_id", "candidates", "impressed")


def check_names(names: Iterable, tasks: Iterable[str]) -> tuple[str, ...]:
    """The declared request features as a tuple; ``ConfigError`` naming one that is not a
    column name, is listed twice, or would take the name of a column the tables already
    have (the schema's, a task's or a task's ``label_<task>`` list)."""
    if isinstance(names, str):
        raise ConfigError(f"mapping.request_features={names!r}: must be a list of columns")
    out = tuple(names)
    taken = {*RESERVED, *tasks, *(f"label_{t}" for t in tasks)}
    for name in out:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"mapping.request_features: {name!r} is not a column name")
        if name in taken:
            raise ConfigError(f"mapping.request_features: {name!r} is a name the interaction "
                              "or request table already uses (rename the column)")
    dup = sorted({c for c in out if out.count(c) > 1})
    if dup:
        raise ConfigError(f"mapping.request_features={dup!r}: listed more than once")
    return out


def standardised(values: dict[str, np.ndarray], groups: np.ndarray, src: Source,
                 request: str | None) -> tuple[dict[str, np.ndarray], tuple[float, ...],
                                               tuple[float, ...]]:
    """Each column ``values[name]`` (N,) float64, NaN for nulls, standardised over its
    requests: (name -> (N,) float32 with nulls at 0, raw means, raw stds). ``groups`` (N,)
    int: the request of each row. A row whose value differs from its request's first row
    (file order; two nulls agree) is a ``DataError`` naming the column and the row."""
    groups = np.asarray(groups, np.int64)
    by = np.lexsort((np.arange(len(groups)), groups))  # by request, then file order
    g = groups[by]
    first = np.ones(len(g), bool)
    first[1:] = g[1:] != g[:-1]
    head = by[np.maximum.accumulate(np.where(first, np.arange(len(g)), 0))]  # (N,) sorted
    out, means, stds = {}, [], []
    what = f"request {request!r}" if request else "user and timestamp"
    for name, v in values.items():
        v = np.asarray(v, np.float64)
        a, b = v[by], v[head]
        bad = ~((a == b) | (np.isnan(a) & np.isnan(b)))
        if bad.any():
            row = int(by[bad].min())  # the first such row in file order
            raise src.error(name, row, f"a request feature must hold one value per request "
                                       f"(rows of one {what}); this row differs from the "
                                       f"request's first row")
        per_request = v[by][first]
        known = per_request[~np.isnan(per_request)]
        mean = float(known.mean()) if len(known) else 0.0
        std = float(known.std()) if len(known) else 0.0
        std = std if std > 0 else 1.0
        z = np.where(np.isnan(v), 0.0, (v - mean) / std)
        out[name] = z.astype(np.float32)
        means.append(mean)
        stds.append(std)
    return out, tuple(means), tuple(stds)


def with_columns(table: pa.Table, cols: dict[str, np.ndarray]) -> pa.Table:
    """``table`` with a non-null ``float32`` column per entry appended, in order."""
    for name, v in cols.items():
        table = table.append_column(pa.field(name, pa.float32(), nullable=False),
                                    pa.array(np.asarray(v, np.float32), pa.float32()))
    return table
