"""The published MovieLens-100K (fetched once into the cache): counts, label rates, order, formats.

Skips with the reason when the package registry cannot be reached. The data stays in the
cache directory ($SOLARIS_CACHE or ~/.cache/solaris), never in the repository.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from solaris.data.fetch import FetchError, default_cache_dir, fetch_movielens
from solaris.data.movielens import load_movielens
from test_loaders import assert_same, recbole_to_grouplens

pytestmark = [pytest.mark.network, pytest.mark.slow]


@pytest.fixture(scope="module")
def ml100k_dir() -> Path:
    try:
        return fetch_movielens(default_cache_dir(), timeout_s=120.0)
    except FetchError as exc:
        pytest.skip(f"MovieLens-100K not available: {exc}")


def test_ml100k_counts_label_rates_and_order(ml100k_dir):
    ds = load_movielens(ml100k_dir)
    ds.validate()
    assert (ds.num_users, ds.num_items, ds.interactions.num_rows) == (943, 1682, 100_000)
    inter = ds.interactions
    like = inter.column("like").to_numpy().mean()
    love = inter.column("love").to_numpy().mean()
    assert 0.50 < like < 0.60 and 0.18 < love < 0.25  # 55.4% and 21.2% in the release (fixed data)
    ts = inter.column("ts").to_numpy()
    user_raw = ds.users.column("raw_id").to_numpy()[inter.column("user_id").to_numpy()]
    item_raw = ds.items.column("raw_id").to_numpy()[inter.column("item_id").to_numpy()]
    assert np.array_equal(np.lexsort((item_raw, user_raw, ts)), np.arange(len(ts)))
    assert (np.diff(ts) == 0).mean() > 0.1  # ties are common: the tie-break matters
    assert ds.spec.item_multihot == {"genres": 19}
    assert ds.spec.user_categorical["occupation"] == 21


def test_ml100k_grouplens_copy_loads_identically(ml100k_dir, tmp_path):
    gl = recbole_to_grouplens(ml100k_dir, tmp_path / "ml-100k")
    assert_same(load_movielens(ml100k_dir), load_movielens(gl))
