"""One entry point from a DataConfig to a validated Dataset."""

from __future__ import annotations

import logging
from pathlib import Path

from solaris.config import DataConfig
from solaris.data.schema import Dataset
from solaris.errors import DataError
from solaris.ids import IdMap

log = logging.getLogger(__name__)


def load_dataset(cfg: DataConfig, fetch: bool = False) -> Dataset:
    """Synthetic (generated in memory, or read back from a generated Parquet dir), MovieLens-100K
    from ``data_dir`` (fetched into the cache when ``fetch`` and no dir is given), or a generic
    log described by a YAML mapping file. ``cfg.ids``: the deployment's id map, which the
    dataset's codes extend (a generic log's new ids are appended to it; any other loader's
    codes must already extend it)."""
    earlier = None
    if cfg.ids is not None:
        earlier = IdMap.load(cfg.ids)
        if earlier is None:
            raise DataError(f"data.ids={cfg.ids}: no id map there (ids/users.parquet, "
                            "ids/items.parquet)")
    if cfg.dataset == "synthetic":
        if cfg.data_dir:
            from solaris.data.synthetic import load_parquet_dir

            ds = load_parquet_dir(cfg.data_dir)
        else:
            from solaris.data.synthetic import generate

            ds = generate(cfg.synthetic)
    elif cfg.dataset == "movielens":
        from solaris.data.movielens import load_movielens

        path = cfg.data_dir
        if path is None:
            if not fetch:
                raise DataError("data.data_dir: MovieLens needs --data-dir (or --fetch)")
            from solaris.data.fetch import default_cache_dir, fetch_movielens

            path = fetch_movielens(default_cache_dir())
        ds = load_movielens(path)
    else:
        from solaris.data.generic import load_generic_yaml

        ds = load_generic_yaml(Path(cfg.data_dir), ids=earlier)
    ds.validate()
    if earlier is not None:  # the native loaders code by their own rules: check them
        IdMap.from_dataset(ds).check_extends(earlier, f"data.ids={cfg.ids}")
    log.info("loaded %s: %d interactions, %d users, %d items", ds.name,
             ds.interactions.num_rows, ds.num_users, ds.num_items)
    return ds
