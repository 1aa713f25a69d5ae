"""The cluster profile's durable state (``solaris.state``): unset fields default under
``$SOLARIS_STATE_URI/<app_id>``; set fields are kept; no root is a refusal that names the
variable and the fields, ``none`` an explicit opt-out; other profiles are untouched."""

from __future__ import annotations

import logging

import pytest

from solaris.config import load_config
from solaris.errors import ConfigError
from solaris.state import STATE_ENV, durable_defaults, durable_overrides

CLUSTER = {"serve.profile": "cluster"}


def test_cluster_profile_defaults_every_unset_field_under_the_root():
    cfg = durable_defaults(load_config(None, CLUSTER), "shop",
                           {STATE_ENV: "s3://bucket/solaris-state/"})
    assert cfg.cache.snapshot_uri == "s3://bucket/solaris-state/shop/cache"
    assert cfg.queue.snapshot_uri == "s3://bucket/solaris-state/shop/queue"
    assert cfg.serve.control_uri == "s3://bucket/solaris-state/shop/control"


def test_a_field_set_in_the_config_is_kept(tmp_path):
    cfg = load_config(None, {**CLUSTER, "cache.snapshot_uri": str(tmp_path / "mine")})
    got = durable_overrides(cfg, "shop", {STATE_ENV: str(tmp_path / "state")})
    assert got == {"queue.snapshot_uri": f"{tmp_path}/state/shop/queue",
                   "serve.control_uri": f"{tmp_path}/state/shop/control"}
    every = load_config(None, {**CLUSTER, "cache.snapshot_uri": "a", "queue.snapshot_uri": "b",
                               "serve.control_uri": "c"})
    assert durable_overrides(every, "shop", {}) == {}  # all set: no root needed


def test_no_root_refuses_and_names_the_variable_and_the_fields():
    cfg = load_config(None, {**CLUSTER, "queue.snapshot_uri": "q"})
    with pytest.raises(ConfigError) as e:
        durable_overrides(cfg, "shop", {STATE_ENV: "  "})
    msg = str(e.value)
    assert STATE_ENV in msg and "serve.profile=cluster" in msg
    assert "cache.snapshot_uri, serve.control_uri unset" in msg
    with pytest.raises(ConfigError, match="app_id='a/b'"):
        durable_overrides(cfg, "a/b", {STATE_ENV: "/state"})


def test_none_opts_out_with_a_warning(caplog):
    cfg = load_config(None, CLUSTER)
    with caplog.at_level(logging.WARNING, logger="solaris.state"):
        assert durable_defaults(cfg, "shop", {STATE_ENV: "None"}) is cfg
    assert "in memory only" in caplog.text and "cache.snapshot_uri" in caplog.text


@pytest.mark.parametrize("profile", ["serving", "replay"])
def test_other_profiles_keep_their_fields(profile):
    cfg = load_config(None, {"serve.profile": profile})
    assert durable_overrides(cfg, "shop", {STATE_ENV: "s3://bucket/state"}) == {}
    assert durable_overrides(cfg, "shop", {}) == {}
    assert cfg.cache.snapshot_uri is None and cfg.serve.control_uri is None
