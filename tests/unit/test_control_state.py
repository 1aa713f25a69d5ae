"""The app's control state (solaris/online/control.py): revisions, write-through and restore,
bad settings refused by name, the routers' rebuild of their scales and forward-only switches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from solaris.errors import RequestError
from solaris.online.control import Control, ControlState, scale_table
from solaris.online.rollout import RolloutPolicy
from solaris.online.scales import PAIR, AGG, AGG_COL, ScaleTable
from solaris.tiers import Tier

MANIFESTS = {"v1": {"vms": {"click": {"scales": {"pair": {"pair": 1.0, "user_neighbour": 0.5,
                                                           "item_neighbour": 0.25},
                                                  "aggregate": 1.0}}}},
             "v2": {"vms": {"click": {"scales": {"pair": {"pair": 1.0}, "aggregate": 0.0}}}}}


def _setting(**kw):
    return {"version": "v1", "task": "click", "slot": "pair", "tier": "pair", "scale": 0.0,
            **kw}


def test_each_change_bumps_the_revision_and_the_latest_setting_of_a_key_wins():
    c = Control(None, clock=lambda: 5.0)
    assert c.snapshot()["revision"] == 0
    c.set_scale(_setting(scale=0.0))
    c.set_scale(_setting(scale=0.75))
    s = c.set_scale(_setting(slot="aggregate", tier=None, scale=0.5))
    assert s["revision"] == 3 and s["changed_at"] == 5.0
    assert {(x["slot"], x["scale"]) for x in s["scales"]} == {("pair", 0.75), ("aggregate", 0.5)}
    assert c.promote("click", "v2")["revision"] == 4
    assert c.promote("click", "v2")["revision"] == 4  # already recorded: no change


@pytest.mark.parametrize("bad, field", [({"scale": 1.5}, "scale"), ({"scale": float("nan")}, "scale"),
                                        ({"scale": True}, "scale"), ({"slot": "user"}, "slot"),
                                        ({"version": ""}, "version"), ({"task": 3}, "task"),
                                        ({"tier": 7}, "tier")])
def test_a_bad_setting_is_refused_naming_its_field_and_changes_nothing(bad, field):
    c = Control(None)
    with pytest.raises(RequestError, match=field):
        c.set_scale(_setting(**bad))
    assert c.snapshot()["revision"] == 0 and c.writes == 0


def test_the_state_is_written_through_and_a_restarted_holder_reads_it_back(tmp_path):
    c = Control(str(tmp_path))
    c.set_scale(_setting(scale=0.25))
    c.promote("click", "v2")
    assert c.writes == 2 and json.loads((tmp_path / "control.json").read_text())["revision"] == 2
    again = Control(str(tmp_path))
    assert again.restored and again.snapshot() == c.snapshot()
    assert again.set_scale(_setting(scale=0.5))["revision"] == 3  # it goes on from there


def test_a_corrupt_state_file_starts_empty_instead_of_crash_looping(tmp_path):
    (tmp_path / "control.json").write_text("{not json")
    c = Control(str(tmp_path))
    assert not c.restored and c.snapshot()["revision"] == 0
    (tmp_path / "control.json").write_text(json.dumps({"revision": -1}))
    assert Control(str(tmp_path)).snapshot()["revision"] == 0


def test_a_router_rebuilds_its_scales_from_the_vms_own_plus_every_setting():
    state = ControlState.from_dict({"revision": 2, "scales": [
        _setting(scale=0.0), _setting(slot="aggregate", tier=None, scale=0.5),
        _setting(version="v9", scale=0.1)]})  # a VM this deployment does not serve
    table, skipped = scale_table(MANIFESTS, state)
    a = table.array("v1", "click")
    assert a[PAIR, Tier.PAIR] == 0.0 and a[AGG, AGG_COL] == 0.5
    assert a[PAIR, Tier.USER_NEIGHBOUR] == 0.5  # untouched: the VM's own
    assert np.array_equal(table.array("v2", "click"), ScaleTable(MANIFESTS).array("v2", "click"))
    assert len(skipped) == 1 and "v9" in skipped[0]
    # the same state rebuilt twice is the same table (followers converge)
    assert np.array_equal(scale_table(MANIFESTS, state)[0].array("v1", "click"), a)


def test_a_switch_recorded_by_another_router_moves_this_one_forward_only():
    p = RolloutPolicy({"click": ["v1", "v2", "v3"]})
    assert p.advance_to("click", "v2") and p.active["click"] == "v2"
    assert not p.advance_to("click", "v1") and p.active["click"] == "v2"  # never back
    assert not p.advance_to("click", "v7") and not p.advance_to("view", "v3")
    assert p.advance_to("click", "v3") and p.active["click"] == "v3"


def test_the_lag_is_measured_only_for_a_change_a_router_followed():
    from solaris.online.control import change_lag_s

    clock = [1_000.0]
    c = Control(clock=lambda: clock[0])
    fresh = c.snapshot()
    assert fresh["revision"] == 0 and change_lag_s(fresh, 2e9) is None  # nothing changed yet
    changed = c.set_scale(_setting())
    assert change_lag_s(changed, 1_000.25) == 0.25
    assert change_lag_s(changed, 999.0) == 0.0  # a router clock behind the holder's
    assert change_lag_s(changed, 5_000.0, at_start=True) is None  # found at start: its age
