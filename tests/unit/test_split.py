"""Time splits: no leakage across periods, the FM's cutoff before the VM's rows."""

import numpy as np
import pytest

from solaris.config import SplitConfig, SyntheticConfig
from solaris.data.split import time_split, vertical_mask, warm_mask
from solaris.data.synthetic import generate
from solaris.errors import DataError


@pytest.fixture(scope="module")
def ds():
    return generate(SyntheticConfig(num_users=200, num_items=300, days=8.0,
                                    target_interactions=6000))


def test_periods_are_strictly_ordered_in_time(ds):
    p = time_split(ds, SplitConfig())
    ts = ds.interactions.column("ts").to_numpy()
    assert ts[p.fm].max() < ts[p.vm].min()  # the FM's training cutoff precedes every VM row
    assert ts[p.vm].max() < ts[p.val].min()
    assert ts[p.val].max() < ts[p.test].min()
    # together they cover every row exactly once (no vertical slice by default)
    allrows = np.concatenate([p.fm, p.vm, p.val, p.test])
    assert len(np.unique(allrows)) == len(allrows) == ds.interactions.num_rows
    assert p.cuts[0] == ts[p.vm].min() and p.ranges["test"][1] == ts.max()


def test_fractions_are_respected(ds):
    p = time_split(ds, SplitConfig(fm_frac=0.4, vm_frac=0.3, val_frac=0.1))
    n = ds.interactions.num_rows
    assert abs(len(p.fm) / n - 0.4) < 0.02 and abs(len(p.vm) / n - 0.3) < 0.02


def test_ties_never_straddle_a_cut(ds):
    ts = ds.interactions.column("ts").to_numpy()
    p = time_split(ds, SplitConfig())
    for a, b in ((p.fm, p.vm), (p.vm, p.val), (p.val, p.test)):
        assert not set(ts[a]) & set(ts[b])


def test_vertical_slice_by_surface_and_users(ds):
    cfg = SplitConfig(vm_surface=1, vm_user_share=0.5)
    p = time_split(ds, cfg)
    surf = ds.interactions.column("surface").to_numpy()
    users = ds.interactions.column("user_id").to_numpy()
    for rows in (p.vm, p.val, p.test, p.fm_vertical):
        assert (surf[rows] == 1).all()
    # the FM still trains on every surface and user of its period
    assert set(surf[p.fm]) == {0, 1}
    sliced = np.unique(users[vertical_mask(ds, cfg)])
    assert 0.3 < len(sliced) / len(np.unique(users)) < 0.7
    # the slice is a function of the user id: the same in every process
    assert np.array_equal(vertical_mask(ds, cfg), vertical_mask(ds, cfg))


def test_bad_surface_is_named(ds):
    with pytest.raises(DataError, match="split.vm_surface=5"):
        time_split(ds, SplitConfig(vm_surface=5))


def test_warm_users_had_rows_before_test(ds):
    p = time_split(ds, SplitConfig())
    warm = warm_mask(ds, p)
    users = ds.interactions.column("user_id").to_numpy()
    before = set(users[np.concatenate([p.fm, p.vm, p.val])])
    assert warm.tolist() == [u in before for u in users[p.test]]
    assert 0 < warm.mean() < 1  # late-arriving users make some test rows cold
