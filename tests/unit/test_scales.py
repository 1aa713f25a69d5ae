"""The live scale table: a tier at 0 in every VM of a version is not looked up; bad values
are refused by name; VMs of older artifacts (no scales) keep every tier on and refuse changes."""

import pytest

from solaris.config import EnrichConfig
from solaris.errors import RequestError
from solaris.online.scales import ScaleTable

OFF = {"pair": {"pair": 1.0, "user_neighbour": 0.0, "item_neighbour": 0.0}, "aggregate": 0.0}


def _table() -> ScaleTable:
    return ScaleTable({"v1": {"vms": {"click": {"scales": OFF, "scale_curves": {"pair": {}},
                                                "present_affine": {"pair": [0.4, 1.2]}},
                                      "conversion": {"scales": OFF}}},
                       "v0": {"vms": {"click": {}}}})


def test_tiers_at_zero_everywhere_are_not_looked_up():
    t = _table()
    base = EnrichConfig()
    e = t.enrich_for("v1", base)
    assert (e.user_knn_probe, e.item_tier, e.aggregate) == (0, False, False)
    assert e.item_knn_probe == base.item_knn_probe and e.max_candidates == base.max_candidates
    # one VM of the version using a tier is enough to look it up
    t.set("v1", "conversion", "pair", "user_neighbour", 0.5)
    t.set("v1", "click", "aggregate", None, 0.25)
    e = t.enrich_for("v1", base)
    assert (e.user_knn_probe, e.item_tier, e.aggregate) == (base.user_knn_probe, False, True)
    assert t.enrich_for("v1", base) is e  # kept until a scale changes
    other = EnrichConfig(user_knn_probe=3)  # another base config gets its own answer
    assert t.enrich_for("v1", other).user_knn_probe == 3
    t.set("v1", "conversion", "pair", "user_neighbour", 0.0)
    assert t.enrich_for("v1", other).user_knn_probe == 0
    t.set("v1", "conversion", "pair", "user_neighbour", 0.5)
    assert t.state()["v1/conversion"]["scales"]["pair"]["user_neighbour"] == 0.5
    # the logit map where a pair tier is served is reported beside the scales
    assert t.state()["v1/click"]["present_affine"] == {"pair": [0.4, 1.2]}
    assert t.state()["v1/conversion"]["present_affine"] == {}
    # a VM of older artifacts keeps every tier on, as it was served
    assert t.enrich_for("v0", base) == base
    assert t.array("v0", "click")[0, 1:].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("args, match, field", [
    (("v1", "click", "pair", "pair", 1.5), "scale=1.5", "scale"),
    (("v1", "click", "pair", "pair", float("nan")), "scale=nan", "scale"),
    (("v1", "click", "pair", "none", 0.5), "tier='none'", "tier"),
    (("v1", "click", "user", None, 0.5), "slot='user'", "slot"),
    (("v9", "click", "aggregate", None, 0.5), "version='v9'", "version"),
    (("v0", "click", "aggregate", None, 0.5), "not a residual VM", "version"),
])
def test_bad_changes_are_refused_by_name(args, match, field):
    t = _table()
    before = t.state()
    with pytest.raises(RequestError, match=match) as err:
        t.set(*args)
    assert err.value.field == field  # the HTTP answer names this field
    assert t.state() == before
