"""Where a cluster app keeps its durable state: the cluster profile's defaults.

A cluster app whose cache shards, queue and control state live only in memory loses them
with a node, so the cluster profile (``serve.profile: cluster``) gives each durable-state
field left unset a place under one root, ``$SOLARIS_STATE_URI`` (a local or shared
directory, or a ``pyarrow.fs`` URI such as ``s3://bucket/solaris-state``):

    cache.snapshot_uri   <root>/<app_id>/cache
    queue.snapshot_uri   <root>/<app_id>/queue
    serve.control_uri    <root>/<app_id>/control

A field set in the config is kept. With a field unset and no root, the app refuses to start
(a cluster app with no durable state is a mistake); an operator who wants none says so with
``SOLARIS_STATE_URI=none``. The serving and replay profiles keep their fields as configured
(unset: in memory only).

``serve_app.build_app`` resolves this once and hands the result to every deployment as
overrides, so every replica and actor uses the same locations whatever its node's
environment. No Ray here.
"""

from __future__ import annotations

import logging
from typing import Mapping

from solaris.config import SolarisConfig, with_overrides
from solaris.errors import ConfigError

log = logging.getLogger(__name__)

STATE_ENV = "SOLARIS_STATE_URI"  # the root of a cluster app's durable state
NO_STATE = "none"  # SOLARIS_STATE_URI=none: the operator wants no durable state
# each durable-state field and its folder under <root>/<app_id>
FIELDS = {"cache.snapshot_uri": "cache", "queue.snapshot_uri": "queue",
          "serve.control_uri": "control"}


def _value(cfg: SolarisConfig, dotted: str) -> str | None:
    section, name = dotted.split(".")
    return getattr(getattr(cfg, section), name)


def durable_overrides(cfg: SolarisConfig, app_id: str, environ: Mapping[str, str]
                      ) -> dict[str, str]:
    """Dotted overrides (``load_config``'s) that give ``cfg``'s unset durable-state fields
    their cluster-profile defaults under ``environ[STATE_ENV]``; empty outside the cluster
    profile, when every field is set, or when the root is ``none``. ConfigError naming
    ``SOLARIS_STATE_URI`` and the unset fields when a cluster app has neither."""
    if cfg.serve.profile != "cluster":
        return {}
    unset = [f for f in FIELDS if not _value(cfg, f)]
    if not unset:
        return {}
    if not app_id or "/" in app_id:
        raise ConfigError(f"app_id={app_id!r}: must be a non-empty name without '/' (it "
                          f"names the app's state under ${STATE_ENV})")
    root = (environ.get(STATE_ENV) or "").strip()
    if not root:
        raise ConfigError(
            f"serve.profile=cluster with {', '.join(unset)} unset and no {STATE_ENV}: a "
            f"cluster app keeps its durable state under {STATE_ENV} (a directory every node "
            f"shares, or a URI such as s3://bucket/solaris-state), or in the fields "
            f"{', '.join(FIELDS)} set in its config; {STATE_ENV}={NO_STATE} runs it with none")
    if root.lower() == NO_STATE:
        log.warning("%s=%s: %s stay unset; the app's state lives in memory only and is lost "
                    "with its actors", STATE_ENV, NO_STATE, ", ".join(unset))
        return {}
    base = f"{root.rstrip('/')}/{app_id}"
    return {f: f"{base}/{FIELDS[f]}" for f in unset}


def durable_defaults(cfg: SolarisConfig, app_id: str, environ: Mapping[str, str]
                     ) -> SolarisConfig:
    """``cfg`` with ``durable_overrides`` applied."""
    overrides = durable_overrides(cfg, app_id, environ)
    return with_overrides(cfg, overrides) if overrides else cfg
