"""Named profiles of the synthetic generator: whole worlds a config picks by name.

A profile changes the request process -- how many users come back how often, and what the
retrieval stage hands the ranker -- and, where it says so, how tastes are laid out and move
and how the logging ranker sees them (``TASTE``); never the click model's form, the models
or their training. A config naming one (``data.synthetic.profile: feed``) starts from its
values; any key the config sets itself wins.

* ``classic``: the built-in defaults. 1,500 users over 30 days, a handful of requests per
  user a month, the retrieval's noise redrawn per request (candidate recurrence within 6 h
  about 0.3).
* ``feed``: the regime SOLARIS is built for (the paper reports over 60% of a request's
  candidates ranked for the same user within the past six hours): 800 users over 6 days,
  ~5 requests per active user a day in sessions of ~3, and a retrieval stage with per-user
  state that drifts over hours, so ~70% of a request's candidates were the same user's
  candidates within 6 h.
* ``cohorts``: the feed's request process in a world where the fallback tiers have what the
  paper's production has; its values were committed before any tier was measured in it.
  Why each (the paper's figures as docs/DESIGN.md quotes them):

  - ``cohorts`` 20, ``cohort_spread`` 0.3: the paper's user-neighbour tier lifts coverage
    from 40-50% to ~70% with imputed embeddings worth ~40% of real ones, so a user's nearest
    users must share much of its taste: 20 cohorts of ~40 users give every user more than the
    10 neighbours the router probes inside its own cohort, drawn independent of every user
    feature, so only behaviour finds them. The ideal 10-nearest cosine of the hidden 24 h
    interests is 0.84 (0.765 in ``feed``; at or below 0.9: near-twins, not twins).
  - ``drift`` 0.2 a day, ``taste_memory_days`` 7: an ad or feed user's tastes hold for
    weeks and change within them; a random walk of 0.6 a day (``feed``) dissolves any cohort
    within the horizon, while a third of the step pulled back toward the user's taste over a
    week keeps the cohorts for the whole 6 days and still moves a user's interest day to day.
  - ``rank_noise`` 1.0 (3.0 elsewhere): the paper's impressions come from the production
    ranker, the model its verifier is, so the logging ranker here sees the user's interest
    nearly as a trained model would (the exploration noise on its scores stays).
  - served (``SERVING``) with the VM on surface 0 alone (``split.vm_surface``) while the FM
    trains on both: a production VM serves one vertical, the foundation model learns from
    every surface, so part of its edge is stable knowledge of the user a neighbour can share.
"""

from __future__ import annotations

from typing import Any

from solaris.errors import ConfigError

# the request-process fields a profile may set (a test holds profiles to these)
REQUEST_PROCESS = ("num_users", "days", "target_interactions", "requests_per_session",
                   "retrieval_memory_h", "retrieval_persistence", "burst_shape", "late_user_share")
# the taste fields a profile may set besides: how tastes are laid out (cohorts), how they move
# (drift, memory) and how the logging ranker sees them; the click model's form is unchanged
TASTE = ("cohorts", "cohort_spread", "drift", "taste_memory_days", "rank_noise")
PROFILE_FIELDS = (*REQUEST_PROCESS, *TASTE)

PROFILES: dict[str, dict[str, Any]] = {
    "classic": {},
    "feed": {
        "num_users": 800,
        "days": 6.0,
        "target_interactions": 132_000,  # a replay window (the last 15%) of ~3,300 requests
        "requests_per_session": 3.0,
        "retrieval_memory_h": 1.5,
        "retrieval_persistence": 1.0,
        "burst_shape": 2.0,
    },
    "cohorts": {
        "num_users": 800,
        "days": 6.0,
        "target_interactions": 132_000,
        "requests_per_session": 3.0,
        "retrieval_memory_h": 1.5,
        "retrieval_persistence": 1.0,
        "burst_shape": 2.0,
        "cohorts": 20,
        "cohort_spread": 0.3,
        "drift": 0.2,
        "taste_memory_days": 7.0,
        "rank_noise": 1.0,
    },
}

# how SOLARIS is run in a profile's world by the demo and bench/feed_regime.py (config keys,
# dotted): a feed's traffic is ~12x the classic world's per event hour, so no hourly FM
# budget; half of a request's candidates are bet on (its impressions come from a logging
# ranker of its own, which the VM's top fifth finds no better than chance); the precompute
# lag of a worker fleet that keeps up (1 min) instead of the 5 min of a batch schedule
SERVING: dict[str, dict[str, Any]] = {
    "classic": {},
    "feed": {"verifier.fraction": 0.5, "schedule.lag_s": 60.0,
             "schedule.budget_per_hour": 0.0},
    "cohorts": {"verifier.fraction": 0.5, "schedule.lag_s": 60.0,
                "schedule.budget_per_hour": 0.0, "split.vm_surface": 0},
}

# the demo's size of a profile: the same request process (per user) for 500 of the 800
# users, the fewest at which the FM trained there still beats the VM alone across training
# floats (400: behind at 1 and 2 threads; docs/results/2026-12-07-feed-regime-walls.md); and
# the requests it replays, the window's first (None: all), so it stays within minutes
DEMO_SIZE: dict[str, dict[str, Any]] = {
    "classic": {},
    "feed": {"num_users": 500, "target_interactions": 82_500},
}
DEMO_REQUESTS: dict[str, int | None] = {"classic": None, "feed": 1564}


def profile_values(name: Any, where: str = "synthetic") -> dict[str, Any]:
    """The field values profile ``name`` sets (with ``profile`` itself)."""
    if name not in PROFILES:
        raise ConfigError(f"{where + '.' if where else ''}profile={name!r}: unknown profile "
                          f"(known: {', '.join(PROFILES)})")
    return {**PROFILES[name], "profile": name}
