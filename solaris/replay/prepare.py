"""What a replay needs before its first request: the window, the data directory the KNN job
reads, the seed history, and the map from labelled replay pairs to interaction rows.

The replay window is the split's test period (``SplitConfig``): every model the replay serves
trained on the FM, VM and validation periods, all strictly earlier (``check_trained_before``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from solaris import atomic
from solaris.config import SolarisConfig
from solaris.data.schema import ITEM, SURFACE, TS, USER, Dataset
from solaris.data.split import Periods, time_split
from solaris.errors import DataError
from solaris.seeding import seed_history  # noqa: F401  (the replay's seeding is the product's)


def window(ds: Dataset, cfg: SolarisConfig) -> tuple[Periods, int]:
    """The split's periods and the replay window's first event time (the test period's)."""
    periods = time_split(ds, cfg.split)
    return periods, int(periods.cuts[2])


def check_no_request_features(ds: Dataset, what: str) -> None:
    """The replay, the prediction and the closed loop do not send a log's request-time
    features yet: refuse such a log rather than serve its VM inputs it did not train on
    (every request at the features' mean)."""
    if ds.spec.request_continuous:
        raise DataError(f"{ds.name}: the mapping declares request features "
                        f"{list(ds.spec.request_continuous)}; {what} does not send them yet "
                        "(serving does: /rank's features). Drop them from the mapping to "
                        f"run {what}.")


def check_trained_before(manifest: dict, start_ts: int) -> None:
    """Every period the artifacts trained or validated on ends before ``start_ts``."""
    for name in ("fm", "vm", "val"):
        last = int(manifest["periods"][name]["ts_max"])
        if last >= start_ts:
            raise DataError(f"artifacts' {name} period ends at ts={last}, inside the replay "
                            f"window starting at ts={start_ts}: models must train on earlier "
                            "data only")


def write_data_dir(ds: Dataset, out: str | Path) -> Path:
    """``ds`` as a ``solaris data`` directory (users, items, interactions Parquet files and
    ``meta.json`` last), what ``jobs/rebuild_knn.py`` reads. The whole log is written once: the
    job's ``as_of`` keeps each rebuild causal."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(ds.users, out / "users.parquet")
    pq.write_table(ds.items, out / "items.parquet")
    pq.write_table(ds.interactions, out / "interactions.parquet", row_group_size=1 << 20)
    meta = {"name": ds.name, "tasks": list(ds.tasks), "spec": ds.spec.to_dict(),
            "interactions": ds.interactions.num_rows}
    atomic.save_json(out / "meta.json", meta)
    return out
