"""The synthetic generator's static world: users and items, their hidden vectors and features.

Everything here is drawn once from ``np.random.default_rng(cfg.seed)``; what changes over
event time (drifting interests, sessions, labels) lives in ``synthetic_stream.py``.

Hidden structure, and which model can learn it:

* item vectors cluster around ``num_categories`` centroids; ``category`` is the nearest
  centroid and ``tags`` follow the vector, so item attributes carry the latent geometry;
* a user's interest starts near a favourite category (weakly tied to ``age_bucket``), or with
  ``cohorts`` near its taste cohort's centroid (tied to no feature), and then drifts (stream
  module; with ``taste_memory_days`` pulled back toward where it started): a static user id
  only learns its average, recent clicks reveal it;
* per-surface interest offsets are static and correlated across surfaces;
* user bias, item quality / Zipf popularity and surface bias are static: id-learnable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from solaris.config import SyntheticConfig
from solaris.data.schema import ITEM, RAW_ID, USER, FeatureSpec

EPOCH = 1_700_000_000  # ts of event time 0 (seconds)
DAY = 86_400

USER_CATEGORICAL = {"age_bucket": 6, "region": 8, "device": 3}
USER_CONTINUOUS = ("activity",)
BIAS_HINT = "bias_hint"  # the opt-in user feature correlated with user_bias
BIAS_HINT_STREAM = 0xB1A5  # its noise's generator: seeded (cfg.seed, this)
COHORT_STREAM = 0xC0  # the taste cohorts' generator (cfg.cohorts > 0): seeded (cfg.seed, this)
ITEM_CONTINUOUS = ("log_price",)
MAX_TAGS = 4  # tags per item: 1..MAX_TAGS
ACTIVITY_SIGMA = 1.0  # log-normal spread of per-user session rates (heavy tail)
LATE_START, LATE_END = 0.5, 0.95  # late users arrive within this share of the horizon
EARLY_AT_ZERO = 0.7  # share of non-late users present from event time 0


@dataclass(frozen=True)
class World:
    """Static hidden parameters plus the user / item tables they produce."""

    cfg: SyntheticConfig
    user_vec0: np.ndarray  # (U, d) unit interest at event time 0 (the home taste)
    surface_offset: np.ndarray  # (U, S, d) static per-surface interest offsets
    user_bias: np.ndarray  # (U,) click-logit user term
    user_conv: np.ndarray  # (U,) conversion-logit user term
    user_rate: np.ndarray  # (U,) expected sessions per active day
    user_arrival: np.ndarray  # (U,) int64 seconds: no session before this
    surface_cdf: np.ndarray  # (U, S) cumulative surface choice probabilities per session
    item_vec: np.ndarray  # (I, d) unit item vectors
    item_logpop: np.ndarray  # (I,) log Zipf popularity (the retrieval prior)
    item_quality: np.ndarray  # (I,) click-logit item term (correlated with popularity)
    item_conv: np.ndarray  # (I,) conversion-logit item term (cheap items convert more)
    item_release: np.ndarray  # (I,) int64 seconds: not retrievable before this
    surface_bias: np.ndarray  # (S,) click-logit surface term
    users: pa.Table
    items: pa.Table
    spec: FeatureSpec
    user_cohort: np.ndarray | None = None  # (U,) taste cohort (cfg.cohorts > 0), else None
    click_bias: float = 0.0  # global click-logit offset (fitted to cfg.click_rate on a pilot)
    conv_bias: float = 0.0  # global conversion-logit offset (fitted to cfg.conversion_rate)

    @property
    def horizon_s(self) -> int:
        return int(round(self.cfg.days * DAY))


def matmul(a: np.ndarray, bt: np.ndarray) -> np.ndarray:
    """``a @ bt`` for (n, d) x (d, m), summed over d in a fixed order.

    Not BLAS: its summation order follows its thread count, so a busy machine or a Ray worker
    (OMP_NUM_THREADS=1) would flip a few labels of the same seed. d is small here.
    """
    out = a[:, :1] * bt[0]
    for k in range(1, a.shape[1]):
        out += a[:, k:k + 1] * bt[k]
    return out


def rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sum over the last axis of ``a * b`` (broadcast), in a fixed order (see ``matmul``)."""
    out = a[..., 0] * b[..., 0]
    for k in range(1, a.shape[-1]):
        out = out + a[..., k] * b[..., k]
    return out


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (a zero row stays zero)."""
    return x / np.maximum(np.sqrt(rowdot(x, x)), 1e-12)[..., None]


def _standardise(x: np.ndarray) -> np.ndarray:
    sd = x.std()
    return (x - x.mean()) / (sd if sd > 0 else 1.0)


def _top_tags(rng: np.random.Generator, item_vec: np.ndarray, num_tags: int) -> pa.Array:
    """1..MAX_TAGS distinct tags per item, drawn by Gumbel top-k around the item vector."""
    n, d = item_vec.shape
    tag_vec = unit(rng.standard_normal((num_tags, d)))
    logits = 3.0 * matmul(item_vec, tag_vec.T) + rng.gumbel(size=(n, num_tags))  # (I, T)
    width = min(MAX_TAGS, num_tags)
    top = np.argsort(-logits, axis=1, kind="stable")[:, :width]
    k = np.minimum(1 + rng.binomial(MAX_TAGS - 1, 0.4, size=n), width)
    keep = np.arange(width)[None, :] < k[:, None]
    top = np.where(keep, top, num_tags)  # sentinel sorts last
    top.sort(axis=1)  # each row: its k tags ascending, then sentinels
    values = top[top < num_tags]  # row-major, so item by item
    offsets = np.concatenate([[0], np.cumsum(k)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(np.int64)))


def build_world(cfg: SyntheticConfig) -> World:
    """Draw users, items and every static parameter from ``cfg.seed``."""
    rng = np.random.default_rng(cfg.seed)
    n_u, n_i, d, k_cat, n_s = (cfg.num_users, cfg.num_items, cfg.latent_dim,
                               cfg.num_categories, cfg.num_surfaces)
    horizon = int(round(cfg.days * DAY))

    # items: clustered vectors, category = nearest centroid, Zipf popularity, price
    centroids = unit(rng.standard_normal((k_cat, d)))
    seed_cat = rng.integers(0, k_cat, size=n_i)
    item_vec = unit(centroids[seed_cat] + 0.6 * rng.standard_normal((n_i, d)) / np.sqrt(d))
    category = np.argmax(matmul(item_vec, centroids.T), axis=1).astype(np.int64)
    tags = _top_tags(rng, item_vec, cfg.num_tags)
    rank = rng.permutation(n_i) + 1
    item_logpop = -cfg.zipf_a * np.log(rank.astype(np.float64))
    item_quality = 0.3 * _standardise(item_logpop) + 0.3 * rng.standard_normal(n_i)
    price_dir = unit(rng.standard_normal(d))
    log_price = _standardise(0.7 * rowdot(item_vec, price_dir) + rng.standard_normal(n_i))
    item_conv = -0.5 * log_price + 0.5 * rng.standard_normal(n_i)
    n_new = int(n_i * cfg.new_item_share)
    item_release = np.zeros(n_i, dtype=np.int64)
    new = rng.permutation(n_i)[:n_new]
    item_release[new] = (rng.uniform(0.05, 0.95, size=n_new) * horizon).astype(np.int64)

    # users: age bucket -> favourite category (weakly), region -> bias, device -> surfaces
    n_age, n_region, n_device = (USER_CATEGORICAL[c] for c in ("age_bucket", "region", "device"))
    age = rng.choice(n_age, size=n_u, p=np.array([1, 3, 4, 3, 2, 1]) / 14.0)
    age_pref = rng.dirichlet(np.full(k_cat, 0.7), size=n_age)  # (A, K)
    fav = (age_pref[age].cumsum(1) < rng.random((n_u, 1))).sum(1).clip(0, k_cat - 1)
    user_vec0 = unit(centroids[fav] + 0.8 * rng.standard_normal((n_u, d)) / np.sqrt(d))
    cohort = None
    if cfg.cohorts > 0:  # its own stream: every other draw stays as it is without cohorts
        crng = np.random.default_rng([cfg.seed, COHORT_STREAM])
        cohort_vec = unit(crng.standard_normal((cfg.cohorts, d)))
        cohort = crng.integers(0, cfg.cohorts, size=n_u)  # independent of every feature
        user_vec0 = unit(cohort_vec[cohort]
                         + cfg.cohort_spread * crng.standard_normal((n_u, d)) / np.sqrt(d))
    surface_offset = cfg.surface_spread * rng.standard_normal((n_u, n_s, d)) / np.sqrt(d)
    region = rng.integers(0, n_region, size=n_u)
    device = rng.choice(n_device, size=n_u, p=[0.5, 0.35, 0.15])
    device_surface = 0.8 * rng.standard_normal((n_device, n_s))
    pref = np.exp(device_surface[device] + 0.5 * rng.standard_normal((n_u, n_s)))
    surface_cdf = np.cumsum(pref / pref.sum(1, keepdims=True), axis=1)
    surface_cdf[:, -1] = 1.0
    log_rate = ACTIVITY_SIGMA * rng.standard_normal(n_u)
    activity = _standardise(log_rate + 0.5 * rng.standard_normal(n_u))
    region_bias = 0.25 * rng.standard_normal(n_region)
    user_bias = region_bias[region] + 0.15 * _standardise(log_rate) + 0.4 * rng.standard_normal(n_u)
    user_conv = 0.4 * rng.standard_normal(n_u)
    surface_bias = 0.3 * rng.standard_normal(n_s)

    # arrival: late users only in the second half (cold users of a time split)
    late = rng.random(n_u) < cfg.late_user_share
    early_t = np.where(rng.random(n_u) < EARLY_AT_ZERO, 0.0, rng.uniform(0.0, 0.5, size=n_u))
    late_t = rng.uniform(LATE_START, LATE_END, size=n_u)
    user_arrival = np.ceil(np.where(late, late_t, early_t) * horizon).astype(np.int64)
    user_arrival[late] = np.maximum(user_arrival[late], int(np.ceil(0.5 * horizon)))

    # session rates: heavy-tailed weights scaled so the expected rows hit target_interactions
    weight = np.exp(log_rate)
    active_days = (horizon - user_arrival) / DAY
    sessions = cfg.target_interactions / (cfg.impressions_per_request * cfg.requests_per_session)
    user_rate = sessions * weight / float((weight * active_days).sum())

    users = pa.table({
        USER: pa.array(np.arange(n_u, dtype=np.int64)),
        RAW_ID: pa.array(np.arange(n_u, dtype=np.int64)),
        "age_bucket": pa.array(age.astype(np.int64)),
        "region": pa.array(region.astype(np.int64)),
        "device": pa.array(device.astype(np.int64)),
        "activity": pa.array(activity.astype(np.float32)),
    })
    user_continuous = USER_CONTINUOUS
    if cfg.user_bias_feature:  # its own stream: the draws above and below stay as they are
        noise = np.random.default_rng([cfg.seed, BIAS_HINT_STREAM]).standard_normal(n_u)
        hint = _standardise(_standardise(user_bias) + noise)
        users = users.append_column(BIAS_HINT, pa.array(hint.astype(np.float32)))
        user_continuous = (*USER_CONTINUOUS, BIAS_HINT)
    items = pa.table({
        ITEM: pa.array(np.arange(n_i, dtype=np.int64)),
        RAW_ID: pa.array(np.arange(n_i, dtype=np.int64)),
        "category": pa.array(category),
        "tags": tags,
        "log_price": pa.array(log_price.astype(np.float32)),
    })
    spec = FeatureSpec(
        user_categorical=dict(USER_CATEGORICAL),
        user_continuous=user_continuous,
        item_categorical={"category": k_cat},
        item_multihot={"tags": cfg.num_tags},
        item_continuous=ITEM_CONTINUOUS,
        num_surfaces=n_s,
    )
    return World(cfg=cfg, user_vec0=user_vec0, surface_offset=surface_offset,
                 user_bias=user_bias, user_conv=user_conv, user_rate=user_rate,
                 user_arrival=user_arrival, surface_cdf=surface_cdf, item_vec=item_vec,
                 item_logpop=item_logpop, item_quality=item_quality, item_conv=item_conv,
                 item_release=item_release, surface_bias=surface_bias, user_cohort=cohort,
                 users=users,
                 items=items, spec=spec)
