"""The one config tree: frozen dataclasses, checked on construction, loaded from YAML at the edge.

Every field has a comment; every check raises ``ConfigError`` naming the field and the value.
Sub-configs are passed whole (``FMConfig`` to the FM, ``VMConfig`` to a VM, ...).
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solaris.errors import ConfigError

log = logging.getLogger(__name__)


def _check(cond: bool, name: str, value: Any, why: str) -> None:
    if not cond:
        raise ConfigError(f"{name}={value!r}: {why}")


@dataclass(frozen=True)
class SyntheticConfig:
    """The embedded default data generator."""

    seed: int = 0  # generator seed; same seed -> byte-identical output
    num_users: int = 1500  # users over the whole horizon (some arrive late: cold users)
    num_items: int = 800  # catalogue size
    latent_dim: int = 8  # dimension of the hidden user-interest / item vectors
    num_categories: int = 12  # item categories (an item attribute, derived from its vector)
    num_tags: int = 24  # multi-hot item tag vocabulary
    num_surfaces: int = 2  # surfaces (e.g. feed and search); interests differ per surface
    days: float = 30.0  # event-time horizon
    target_interactions: int = 60_000  # approximate labelled (impressed) pairs to emit
    candidates_per_request: int = 100  # retrieval-stage output size (100..500)
    impressions_per_request: int = 6  # candidates shown (and labelled) per request
    late_user_share: float = 0.3  # share of users whose first session falls in the last half
    drift: float = 0.6  # per-day random-walk scale of user interests
    zipf_a: float = 1.1  # item popularity exponent
    chunk_rows: int = 1_000_000  # rows per Parquet chunk when streaming large outputs
    new_item_share: float = 0.1  # share of items released during the horizon (cold items)
    click_rate: float = 0.2  # base click rate of impressions (bias fitted on a pilot; session
    # intent, absent from the pilot, lifts the realised rate by ~1-2 points)
    conversion_rate: float = 0.05  # target base conversion rate of impressions (needs a click)
    affinity: float = 8.0  # weight of <user interest, item vector> in the click logit
    session_intent: float = 1.0  # pull of in-session clicked items on the user's interest
    surface_spread: float = 0.5  # scale of per-user, per-surface interest offsets (0 = none)
    requests_per_session: float = 3.0  # mean requests per session (geometric-ish, >= 1)
    # emit a second user continuous feature, "bias_hint": the user's click-logit term
    # (user_bias) plus as much independent noise, standardised (correlation ~0.7), drawn from
    # a stream of its own, so every other byte of the data is the same as without it; off
    # (the default): the users table and spec are unchanged. ``activity`` alone carries
    # little of user_bias (0.15 of it); this gives a feature a VM can read signal from
    user_bias_feature: bool = False
    # the request process's retrieval stage: 0 redraws its noise per request (every request
    # of a user meets a fresh candidate list); > 0 gives each user a retrieval state (the
    # noise on its interest estimate and on the popular items' scores) that drifts as an
    # Ornstein-Uhlenbeck process with this time constant in hours, so requests hours apart
    # share most of their candidates, as a feed's do
    retrieval_memory_h: float = 0.0
    # with retrieval_memory_h > 0: the share of that noise's variance the user's state holds;
    # the rest is each request's own (1: all state, every request of an hour alike)
    retrieval_persistence: float = 1.0
    burst_shape: float = 0.5  # gamma shape of per-user-day activity multipliers (smaller: burstier)
    # taste cohorts: 0 (off) starts each user near a favourite category weakly tied to its age
    # bucket; > 0 draws this many cohort centroids and puts every user, whatever its features,
    # at unit(centroid + cohort_spread * noise / sqrt(latent_dim)): users of one cohort are
    # alike in long-run taste (near-twins, not twins)
    cohorts: int = 0
    cohort_spread: float = 0.5
    # the interests' memory of the user's starting taste, in days: 0 (off) lets them drift as
    # a random walk; > 0 pulls each window's drift back toward it (an Ornstein-Uhlenbeck
    # process of this time constant), so a taste (and a cohort) lasts
    taste_memory_days: float = 0.0
    # the logging ranker's noise on its estimate of the user's interest (smaller: impressions
    # closer to what a model of the user's current interest would rank first)
    rank_noise: float = 3.0
    # the named profile these values came from (solaris.data.profiles): a config that names
    # one starts from its values, and the keys it sets win
    profile: str = "classic"

    def __post_init__(self) -> None:
        from solaris.data.profiles import PROFILES

        _check(self.profile in PROFILES, "synthetic.profile", self.profile,
               f"must be one of {', '.join(PROFILES)}")
        _check(self.retrieval_memory_h >= 0, "synthetic.retrieval_memory_h",
               self.retrieval_memory_h, "must be >= 0 (0: redrawn per request)")
        _check(0.0 <= self.retrieval_persistence <= 1.0, "synthetic.retrieval_persistence",
               self.retrieval_persistence, "must be in [0, 1]")
        _check(self.burst_shape > 0, "synthetic.burst_shape", self.burst_shape, "must be > 0")
        _check(self.num_users >= 2, "synthetic.num_users", self.num_users, "need at least 2 users")
        _check(self.num_items >= 2, "synthetic.num_items", self.num_items, "need at least 2 items")
        _check(self.latent_dim >= 1, "synthetic.latent_dim", self.latent_dim, "must be >= 1")
        _check(self.num_surfaces >= 2, "synthetic.num_surfaces", self.num_surfaces, "must be >= 2")
        _check(self.days > 0, "synthetic.days", self.days, "must be > 0")
        _check(self.target_interactions >= 1000, "synthetic.target_interactions",
               self.target_interactions, "must be >= 1000")
        _check(100 <= self.candidates_per_request <= 500, "synthetic.candidates_per_request",
               self.candidates_per_request, "must be within 100..500")
        _check(1 <= self.impressions_per_request <= self.candidates_per_request,
               "synthetic.impressions_per_request", self.impressions_per_request,
               "must be within 1..candidates_per_request")
        _check(0.0 <= self.late_user_share < 1.0, "synthetic.late_user_share",
               self.late_user_share, "must be in [0, 1)")
        _check(self.zipf_a > 0, "synthetic.zipf_a", self.zipf_a, "must be > 0")
        _check(self.chunk_rows >= 1000, "synthetic.chunk_rows", self.chunk_rows, "must be >= 1000")
        _check(self.num_categories >= 1, "synthetic.num_categories", self.num_categories,
               "must be >= 1")
        _check(self.num_tags >= 1, "synthetic.num_tags", self.num_tags, "must be >= 1")
        _check(self.drift >= 0, "synthetic.drift", self.drift, "must be >= 0")
        _check(self.cohorts >= 0, "synthetic.cohorts", self.cohorts, "must be >= 0 (0: off)")
        _check(self.cohort_spread >= 0, "synthetic.cohort_spread", self.cohort_spread,
               "must be >= 0")
        _check(self.taste_memory_days >= 0, "synthetic.taste_memory_days",
               self.taste_memory_days, "must be >= 0 (0: a random walk)")
        _check(self.rank_noise >= 0, "synthetic.rank_noise", self.rank_noise, "must be >= 0")
        _check(0.0 <= self.new_item_share < 1.0, "synthetic.new_item_share",
               self.new_item_share, "must be in [0, 1)")
        launch_items = self.num_items - int(self.num_items * self.new_item_share)
        _check(launch_items >= self.candidates_per_request, "synthetic.num_items", self.num_items,
               f"items available at launch ({launch_items}) must be >= "
               f"candidates_per_request={self.candidates_per_request}")
        _check(0.0 < self.click_rate < 1.0, "synthetic.click_rate", self.click_rate,
               "must be in (0, 1)")
        _check(0.0 < self.conversion_rate < self.click_rate, "synthetic.conversion_rate",
               self.conversion_rate, f"must be in (0, click_rate={self.click_rate})")
        _check(self.affinity >= 0, "synthetic.affinity", self.affinity, "must be >= 0")
        _check(self.session_intent >= 0, "synthetic.session_intent", self.session_intent,
               "must be >= 0")
        _check(self.surface_spread >= 0, "synthetic.surface_spread", self.surface_spread,
               "must be >= 0")
        _check(self.requests_per_session >= 1, "synthetic.requests_per_session",
               self.requests_per_session, "must be >= 1")


@dataclass(frozen=True)
class DataConfig:
    """Where the data comes from."""

    dataset: str = "synthetic"  # synthetic | movielens | generic
    data_dir: str | None = None  # MovieLens dir, generated synthetic Parquet dir, or generic YAML
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    # the deployment's id map to extend (an artifacts directory or its ids/ folder): every id
    # it holds keeps its code, new ids are appended (solaris/ids.py); None: a new deployment
    ids: str | None = None

    def __post_init__(self) -> None:
        _check(self.dataset in ("synthetic", "movielens", "generic"), "data.dataset", self.dataset,
               "must be one of synthetic, movielens, generic")
        if self.dataset == "generic":
            _check(self.data_dir is not None, "data.data_dir", self.data_dir,
                   "required for dataset 'generic' (a YAML mapping file)")


@dataclass(frozen=True)
class SplitConfig:
    """Global-time periods (DESIGN.md, honest teacher outputs) and the VM's vertical slice."""

    fm_frac: float = 0.5  # earliest share of rows: the FM's training period
    vm_frac: float = 0.25  # next share: the VM's training period (teacher outputs out-of-sample)
    val_frac: float = 0.1  # next share: validation (early stopping, grid, calibration)
    # the remaining rows (1 - fm - vm - val) are the test period
    vm_surface: int | None = None  # the VM's vertical slice: only this surface (None = all)
    vm_user_share: float = 1.0  # the VM's vertical slice: this share of users (hashed)
    vm_trains_on_fm_period: bool = True  # FM-period rows also train the VM, slots marked absent

    def __post_init__(self) -> None:
        for name in ("fm_frac", "vm_frac", "val_frac"):
            v = getattr(self, name)
            _check(0.0 < v < 1.0, f"split.{name}", v, "must be in (0, 1)")
        rest = 1.0 - self.fm_frac - self.vm_frac - self.val_frac
        _check(rest > 0.0, "split.fm_frac+vm_frac+val_frac",
               self.fm_frac + self.vm_frac + self.val_frac, "must leave a test period (< 1)")
        _check(0.0 < self.vm_user_share <= 1.0, "split.vm_user_share", self.vm_user_share,
               "must be in (0, 1]")
        if self.vm_surface is not None:
            _check(self.vm_surface >= 0, "split.vm_surface", self.vm_surface, "must be >= 0")


@dataclass(frozen=True)
class FeatureConfig:
    """How per-row model inputs are built."""

    history_len: int = 32  # behaviour events the FM reads, most recent first (as of the row)
    # aggregated user embedding of the offline features (the fresh-z training inputs): pairs
    # written in this window; the served aggregate, and the serving simulations that train
    # its scale, read what the cache retains (cache.retention_s): keep the two equal
    agg_window_s: int = 24 * 3600
    # rows sharing a row's timestamp (e.g. the same request's other candidates, whose labels
    # arrive later) are not its history unless this is set (tie order then counts as time)
    history_ties: bool = False
    # logs without request ids (MovieLens, generic): a user's rows of one bucket of this many
    # seconds form one request at the bucket's first ts, offline (history, its ages, the
    # aggregate and so z and the FM's probabilities are as of that time) and in the replay's
    # request log alike; 0: each row is served at its own ts (the definition before 300 s)
    request_granularity_s: int = 300

    def __post_init__(self) -> None:
        _check(self.history_len >= 1, "features.history_len", self.history_len, "must be >= 1")
        _check(self.request_granularity_s >= 0, "features.request_granularity_s",
               self.request_granularity_s, "must be >= 0")
        _check(self.agg_window_s > 0, "features.agg_window_s", self.agg_window_s, "must be > 0")


@dataclass(frozen=True)
class FMConfig:
    """The foundation model (sized like one relative to the VM: >= 20x its compute per pair)."""

    emb_dim: int = 32  # width of id / feature / history-token embeddings
    seq_heads: int = 2  # attention heads of the sequence arch (2: attention dominates CPU time)
    seq_layers: int = 1  # self-attention layers over the history before target attention
    dense_hidden: int = 64  # dense arch (MLP over continuous features) width
    cross_layers: int = 3  # DCNv2 cross layers in the shared interaction stack
    shared_dim: int = 128  # width of the last shared layer (what the encoder compresses)
    head_hidden: int = 64  # per-task head hidden width
    dropout: float = 0.1  # dropout in the interaction stack
    version: str = "fm-v1"  # travels with every embedding this FM (and its encoder) makes
    # the FM's class, "package.module:Class" (solaris/models/api.py); the built-in reads the
    # fields above, another class is built with its own keyword arguments, ``kwargs``
    cls: str = "solaris.models.fm:FoundationModel"
    kwargs: dict[str, Any] = field(default_factory=dict)
    # an already-trained FM: a state dict (``torch.save``) or an ``fm.pt`` of ``solaris
    # train``, read by ``cls``; training then fits only the encoder and the VMs ("" = train)
    weights: str = ""

    def __post_init__(self) -> None:
        _check(isinstance(self.cls, str) and self.cls.count(":") == 1 and all(self.cls.split(":")),
               "fm.cls", self.cls, "expected 'package.module:Class'")
        _check(isinstance(self.kwargs, dict), "fm.kwargs", self.kwargs, "must be a mapping")
        _check(isinstance(self.weights, str), "fm.weights", self.weights, "must be a path or ''")
        for name in ("emb_dim", "seq_heads", "seq_layers", "dense_hidden", "cross_layers",
                     "shared_dim", "head_hidden"):
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 1, f"fm.{name}", v, "must be an int >= 1")
        _check(self.emb_dim % self.seq_heads == 0, "fm.emb_dim", self.emb_dim,
               f"must be divisible by fm.seq_heads={self.seq_heads}")
        _check(0.0 <= self.dropout < 1.0, "fm.dropout", self.dropout, "must be in [0, 1)")
        _check(bool(self.version), "fm.version", self.version, "must be non-empty")


@dataclass(frozen=True)
class EncoderConfig:
    """Autoencoder compressing the FM's last shared layer to the pair-embedding width."""

    width: int = 32  # pair-embedding width (0 = ablation: use the raw shared layer)
    hidden: int = 128  # encoder / decoder hidden width
    logit_weight: float = 1.0  # weight of keeping the FM heads' logits through the bottleneck
    epochs: int = 15  # training epochs over the FM period's shared-layer outputs
    lr: float = 2e-3  # Adam learning rate

    def __post_init__(self) -> None:
        _check(self.width >= 0, "encoder.width", self.width, "must be >= 0 (0 = raw layer)")
        _check(self.hidden >= 1, "encoder.hidden", self.hidden, "must be >= 1")
        _check(self.logit_weight >= 0, "encoder.logit_weight", self.logit_weight, "must be >= 0")
        _check(self.epochs >= 1, "encoder.epochs", self.epochs, "must be >= 1")
        _check(self.lr > 0, "encoder.lr", self.lr, "must be > 0")


@dataclass(frozen=True)
class VMConfig:
    """A small vertical model with the two SOLARIS input slots."""

    emb_dim: int = 16  # user / item id and feature embedding width
    hidden: tuple[int, ...] = (64, 32)  # MLP widths
    slot_hidden: int = 32  # projection width of each SOLARIS slot before the MLP
    use_pair: bool = False  # read the pair slot (z, presence, tier, age)
    use_agg: bool = False  # read the user slot (aggregated embedding, presence)
    dropout: float = 0.0  # MLP dropout
    # after training, fold a Platt recalibration fitted on the validation rows into the model
    # (logit -> a * logit + b): the VM alone every arm shares is then calibrated, so a SOLARIS
    # correction trained on top of it learns what the FM adds, not a recalibration of the base
    calibrate: bool = True
    # the VM alone's class, "package.module:Class" (solaris/models/api.py); the built-in reads
    # the fields above, another class is built with its own keyword arguments, ``kwargs``
    cls: str = "solaris.models.vm:VerticalModel"
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(isinstance(self.cls, str) and self.cls.count(":") == 1 and all(self.cls.split(":")),
               "vm.cls", self.cls, "expected 'package.module:Class'")
        _check(isinstance(self.kwargs, dict), "vm.kwargs", self.kwargs, "must be a mapping")
        _check(self.emb_dim >= 1, "vm.emb_dim", self.emb_dim, "must be >= 1")
        _check(len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden), "vm.hidden",
               self.hidden, "must be a non-empty list of positive widths")
        _check(self.slot_hidden >= 1, "vm.slot_hidden", self.slot_hidden, "must be >= 1")
        _check(0.0 <= self.dropout < 1.0, "vm.dropout", self.dropout, "must be in [0, 1)")


AGG_ITEMS = ("features", "fm", "both", "off")  # ResidualConfig.agg_items


@dataclass(frozen=True)
class ResidualConfig:
    """The residual SOLARIS correction on top of the frozen VM alone (DESIGN.md step 3)."""

    hidden: int = 32  # width of each slot's correction MLP delta(z, base logit)
    folds: int = 3  # cross-fitted VM-alone models giving delta out-of-sample base logits
    lr: float = 3e-3  # Adam learning rate of delta and the gates
    epochs: int = 25  # max epochs (early stopping on validation, train.patience)
    # scales tried per slot and tier on validation; 0 is the kill switch (tier not looked up)
    scales: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    # an input learned on simulated serving (imputed tiers, the aggregate) is served only if
    # its validation gain is at least this many standard errors of the per-row gain, as the
    # level of the family of inputs the guard judges together (user neighbour, item
    # neighbour, aggregate): each input needs ``family_z(min_gain_z, 3)`` (2.43 at z = 2), so
    # the chance that noise switches on any of the three stays that of one input at
    # ``min_gain_z`` (Bonferroni)
    min_gain_z: float = 2.0
    # share of the training rows (the latest) that stops training on simulated serving early
    holdout_share: float = 0.2
    # where a pair tier is served, the logit mapped once more (alpha + beta * logit, per tier):
    # "off" -- identity; "served" -- fitted on the training rows simulated serving covers with
    # that tier (out-of-sample base logits), kept only if it passes the guard on validation
    present_affine: str = "off"
    # what the aggregate's correction crosses the aggregate with, the candidate's (a table of
    # item vectors, ``ResidualVM(agg_items=...)``, ``candidate_table``): "features", its side
    # features coded one-hot / multi-hot; "fm", the FM's ``item_vectors()``; "both"; "off",
    # nothing -- the correction then can only shift a user's whole logit
    agg_items: str = "features"
    # the imputed tiers (user / item neighbour) on simulated serving: "own" -- a correction of
    # their own (delta and gate), started as the own pair's and held near it by
    # ``imputed_prox`` (an L2 pull of every weight toward its start); "gate" -- the own pair's
    # correction with only the tier-and-age gate trained
    imputed_fit: str = "own"
    imputed_prox: float = 1e-3

    def __post_init__(self) -> None:
        _check(self.hidden >= 1, "residual.hidden", self.hidden, "must be >= 1")
        _check(self.folds >= 2, "residual.folds", self.folds, "must be >= 2")
        _check(self.lr > 0, "residual.lr", self.lr, "must be > 0")
        _check(self.epochs >= 1, "residual.epochs", self.epochs, "must be >= 1")
        _check(len(self.scales) >= 1 and all(0.0 <= x <= 1.0 for x in self.scales)
               and 0.0 in self.scales, "residual.scales", self.scales,
               "must be values in [0, 1] including 0")
        _check(self.min_gain_z >= 0, "residual.min_gain_z", self.min_gain_z, "must be >= 0")
        _check(0 < self.holdout_share < 1, "residual.holdout_share", self.holdout_share,
               "must be in (0, 1)")
        _check(self.present_affine in ("off", "served"), "residual.present_affine",
               self.present_affine, "must be 'off' or 'served'")
        _check(self.agg_items in AGG_ITEMS, "residual.agg_items", self.agg_items,
               f"must be one of {', '.join(map(repr, AGG_ITEMS))}")
        _check(self.imputed_fit in ("own", "gate"), "residual.imputed_fit", self.imputed_fit,
               "must be 'own' or 'gate'")
        _check(self.imputed_prox >= 0, "residual.imputed_prox", self.imputed_prox,
               "must be >= 0")


# ScheduleConfig.history_at: the betting request's time, or the write's release
HISTORY_TIMES = ("request", "visible")


def check_history_at(value: Any, name: str = "schedule.history_at") -> str:
    """``value`` if it is one of ``HISTORY_TIMES``; else ``ConfigError`` naming it."""
    _check(value in HISTORY_TIMES, name, value,
           f"must be one of {', '.join(map(repr, HISTORY_TIMES))}")
    return value


@dataclass(frozen=True)
class ScheduleConfig:
    """The speculation schedule as the replay runs it (event time) and the transfer report
    simulates it on the test period (``c_sim``)."""

    tick_s: float = 60.0  # event seconds per tick
    lag_s: float = 300.0  # work enqueued at t is written no earlier than t + lag
    budget_per_hour: float = 3000.0  # FM pair-evaluations per event hour (0: no limit)
    # the history an FM worker reads for a pair: "request", as of the request that bet on it;
    # "visible", as of the tick end that released it (the entry then holds what the worker
    # could read when it computed: the betting request's own feedback and any later
    # request's before it; in production, without the replay's gate, as of the worker's
    # clock when it leases). The entry's written_at, its TTL and the age the VM reads stay
    # the request's. The live FM workers (``Lease.read_at``), ``solaris simulate`` and
    # training's simulated serving all read it.
    history_at: str = "request"

    def __post_init__(self) -> None:
        check_history_at(self.history_at)
        _check(self.tick_s > 0, "schedule.tick_s", self.tick_s, "must be > 0")
        _check(self.lag_s >= 0, "schedule.lag_s", self.lag_s, "must be >= 0")
        _check(self.budget_per_hour >= 0, "schedule.budget_per_hour", self.budget_per_hour,
               "must be >= 0")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation shared by FM and VM training."""

    batch_size: int = 512  # rows per step
    # where the FM trains: "auto" (a GPU where torch sees one, else the CPU), "cpu", "cuda";
    # the FM is moved back to the CPU after, so what follows is the same code on any machine
    device: str = "auto"
    fm_lr: float = 2e-3  # FM Adam learning rate
    fm_epochs: int = 12  # FM max epochs (early stopping on the FM's own held-out tail)
    vm_epochs: int = 25  # VM max epochs (early stopping on validation)
    patience: int = 2  # epochs without validation improvement before stopping
    weight_decay: float = 1e-6  # Adam L2
    # torch intra-op threads; 1 by default: on a small shared machine, 2 threads contending
    # with another busy process ran an FM step ~10x slower than 1 thread (measured)
    threads: int = 1

    def __post_init__(self) -> None:
        _check(self.device in ("auto", "cpu", "cuda"), "train.device", self.device,
               "must be 'auto', 'cpu' or 'cuda'")
        _check(self.batch_size >= 1, "train.batch_size", self.batch_size, "must be >= 1")
        _check(self.fm_lr > 0, "train.fm_lr", self.fm_lr, "must be > 0")
        _check(self.fm_epochs >= 1, "train.fm_epochs", self.fm_epochs, "must be >= 1")
        _check(self.vm_epochs >= 1, "train.vm_epochs", self.vm_epochs, "must be >= 1")
        _check(self.patience >= 1, "train.patience", self.patience, "must be >= 1")
        _check(self.threads >= 1, "train.threads", self.threads, "must be >= 1")


@dataclass(frozen=True)
class ReportConfig:
    """The transfer report."""

    seeds: int = 5  # seeds (FM, encoder and VMs retrained per seed)
    coverages: tuple[float, ...] = (1.0, 0.6, 0.5, 0.2)  # pair coverages evaluated
    vm_lrs: tuple[float, ...] = (3e-3, 1e-2)  # validation grid shared by every VM variant
    kd_alphas: tuple[float, ...] = (0.3, 0.7)  # KD soft-label weights (extra grid for KD)
    bootstrap: int = 1000  # paired bootstrap resamples for the FM-vs-VM gap
    alpha: float = 0.05  # significance level of that test

    def __post_init__(self) -> None:
        _check(self.seeds >= 1, "report.seeds", self.seeds, "must be >= 1")
        _check(all(0.0 < c <= 1.0 for c in self.coverages), "report.coverages", self.coverages,
               "each must be in (0, 1]")
        _check(len(self.vm_lrs) >= 1 and all(x > 0 for x in self.vm_lrs), "report.vm_lrs",
               self.vm_lrs, "must be a non-empty list of positive rates")
        _check(all(0.0 < a < 1.0 for a in self.kd_alphas), "report.kd_alphas", self.kd_alphas,
               "each must be in (0, 1)")
        _check(self.bootstrap >= 100, "report.bootstrap", self.bootstrap, "must be >= 100")
        _check(0.0 < self.alpha < 1.0, "report.alpha", self.alpha, "must be in (0, 1)")


@dataclass(frozen=True)
class CacheConfig:
    """The pair-embedding store (one per shard) and the shard group."""

    dim: int = 32  # pair-embedding width (the encoder's width)
    codec: str = "fp32"  # fp32 | fp16 | int8 (per-vector scale)
    read_ttl_s: int = 4 * 3600  # event time an entry is readable as a pair embedding
    retention_s: int = 24 * 3600  # event time an entry is kept (the aggregate reads it)
    bucket_s: int = 900  # expiry granularity: whole time buckets are freed at once
    capacity: int = 1_000_000  # entries per store (per shard); eviction prefers low scores
    num_shards: int = 2  # cache-shard actors, users placed by consistent hashing
    virtual_nodes: int = 128  # ring points per shard (smooths the hash ring)
    deadline_ms: float = 25.0  # a lookup round waits this long; late shards read as misses
    # pyarrow.fs URI or local dir of shard snapshots; None: in memory only (the cluster
    # profile defaults it under $SOLARIS_STATE_URI: solaris/state.py)
    snapshot_uri: str | None = None
    snapshot_every_s: float = 60.0  # wall-clock seconds between shard snapshots
    # change records each store keeps for the routers' read replicas (solaris/cache/journal.py;
    # a replica further behind reads the whole store); 0: no journal, no replica can follow
    journal_records: int = 100_000

    def __post_init__(self) -> None:
        _check(self.dim >= 1, "cache.dim", self.dim, "must be >= 1")
        _check(self.codec in ("fp32", "fp16", "int8"), "cache.codec", self.codec,
               "must be one of fp32, fp16, int8")
        _check(self.read_ttl_s > 0, "cache.read_ttl_s", self.read_ttl_s, "must be > 0")
        _check(self.retention_s >= self.read_ttl_s, "cache.retention_s", self.retention_s,
               f"must be >= cache.read_ttl_s={self.read_ttl_s}")
        _check(0 < self.bucket_s <= self.read_ttl_s, "cache.bucket_s", self.bucket_s,
               f"must be in (0, cache.read_ttl_s={self.read_ttl_s}]")
        _check(self.capacity >= 1, "cache.capacity", self.capacity, "must be >= 1")
        _check(self.num_shards >= 1, "cache.num_shards", self.num_shards, "must be >= 1")
        _check(self.virtual_nodes >= 1, "cache.virtual_nodes", self.virtual_nodes, "must be >= 1")
        _check(self.deadline_ms > 0, "cache.deadline_ms", self.deadline_ms, "must be > 0")
        _check(self.snapshot_every_s > 0, "cache.snapshot_every_s", self.snapshot_every_s,
               "must be > 0")
        _check(self.journal_records >= 0, "cache.journal_records", self.journal_records,
               "must be >= 0")


@dataclass(frozen=True)
class EnrichConfig:
    """How a request's two SOLARIS slots are filled (DESIGN.md step 3)."""

    # nearest stored user neighbours probed per request, and how the pairs they hold are
    # imputed: weighted (their similarity-weighted mean) or nearest (the nearest holder's).
    # Measured on the cohorts world's validation rows, click, 3 training seeds
    # (docs/results/2026-12-07-user-neighbours.md): weighted over 50 gains the most or as much
    # as any and the guard serves it in all three; nearest of 10 in two, nearest of 50 in one
    user_knn_probe: int = 50
    user_knn_mode: str = "weighted"
    item_knn_probe: int = 10  # nearest item neighbours probed for a still-missing pair
    item_tier: bool = True  # use the item-neighbour tier
    aggregate: bool = True  # send the aggregated user embedding (the user slot)
    max_candidates: int = 1000  # larger requests are rejected by name

    def __post_init__(self) -> None:
        _check(self.user_knn_probe >= 0, "enrich.user_knn_probe", self.user_knn_probe,
               "must be >= 0")
        _check(self.user_knn_mode in ("nearest", "weighted"), "enrich.user_knn_mode",
               self.user_knn_mode, "must be nearest or weighted")
        _check(self.item_knn_probe >= 0, "enrich.item_knn_probe", self.item_knn_probe,
               "must be >= 0")
        _check(self.max_candidates >= 1, "enrich.max_candidates", self.max_candidates,
               "must be >= 1")

@dataclass(frozen=True)
class VerifierConfig:
    """Which served candidates are sent to precompute (DESIGN.md step 5) and at what rate."""

    fraction: float = 0.2  # share of ALL a request's candidates, top by VM score, considered
    # a found pair expiring within this event time is re-enqueued (age > cache.read_ttl_s -
    # horizon_s). The default, 5 min short of the default 4 h TTL, computes a found pair of
    # the top fraction again, with the user's history as of this request, once it is 5 min
    # old: fresher embeddings earn more clicks in the closed loop, for 11% more FM evaluations
    # on the synthetic data and 88% on MovieLens' bursts of requests (1800 was the rule it
    # was compared with: docs/results/2026-12-04-verifier-refresh.md)
    horizon_s: float = 14100.0
    # budget: pair-evaluations per second of the controller's clock (event or wall time, the
    # caller's choice); 0 = no budget, the fraction stays fixed
    budget_per_s: float = 0.0
    min_fraction: float = 0.01  # lower bound of the adapted fraction
    max_fraction: float = 1.0  # upper bound of the adapted fraction
    interval_s: float = 10.0  # clock seconds between fraction updates (rate measured over it)
    gain: float = 0.5  # log-space step: fraction *= (target / measured rate) ** gain
    max_step: float = 2.0  # one update changes the fraction by at most this factor either way
    # queue-depth feedback: above this many pending pairs the target rate shrinks in
    # proportion (target * target_depth / depth); 0 = no depth feedback
    target_depth: int = 0

    def __post_init__(self) -> None:
        _check(0.0 < self.min_fraction <= self.max_fraction <= 1.0, "verifier.min_fraction",
               self.min_fraction, f"must satisfy 0 < min_fraction <= max_fraction="
               f"{self.max_fraction} <= 1")
        _check(self.min_fraction <= self.fraction <= self.max_fraction, "verifier.fraction",
               self.fraction, f"must be within [min_fraction={self.min_fraction}, "
               f"max_fraction={self.max_fraction}]")
        _check(self.horizon_s >= 0, "verifier.horizon_s", self.horizon_s, "must be >= 0")
        _check(self.budget_per_s >= 0, "verifier.budget_per_s", self.budget_per_s,
               "must be >= 0 (0 = no budget)")
        _check(self.interval_s > 0, "verifier.interval_s", self.interval_s, "must be > 0")
        _check(0.0 < self.gain <= 1.0, "verifier.gain", self.gain, "must be in (0, 1]")
        _check(self.max_step > 1.0, "verifier.max_step", self.max_step, "must be > 1")
        _check(self.target_depth >= 0, "verifier.target_depth", self.target_depth,
               "must be >= 0 (0 = no depth feedback)")


@dataclass(frozen=True)
class HistoryConfig:
    """The event-time behaviour history per user that the FM's request part reads."""

    max_events: int = 64  # events kept per user (a ring: the oldest arrival is overwritten)
    max_users: int = 1_000_000  # users kept; past it the least recently active are evicted
    evict_share: float = 0.01  # share of max_users evicted at once when full (amortises it)

    def __post_init__(self) -> None:
        _check(self.max_events >= 1, "history.max_events", self.max_events, "must be >= 1")
        _check(self.max_users >= 1, "history.max_users", self.max_users, "must be >= 1")
        _check(0.0 < self.evict_share <= 1.0, "history.evict_share", self.evict_share,
               "must be in (0, 1]")


@dataclass(frozen=True)
class QueueConfig:
    """The precompute queue: bounded, priority by verifier score, leased to FM workers. A
    pair already pending when another request bets on it keeps the higher priority and stays
    with the earlier request by event time (``solaris.precompute.pqueue``)."""

    capacity: int = 100_000  # pending + leased pairs; past it the lowest priority is dropped
    lease_timeout_s: float = 30.0  # wall seconds before an un-acked lease returns to the queue
    lease_pairs: int = 256  # default pairs per lease (whole request groups, >= one group)
    # pyarrow.fs URI or local dir of queue snapshots; None: in memory only (the cluster
    # profile defaults it under $SOLARIS_STATE_URI: solaris/state.py)
    snapshot_uri: str | None = None
    snapshot_every_s: float = 5.0  # wall seconds between queue snapshots

    def __post_init__(self) -> None:
        _check(self.capacity >= 1, "queue.capacity", self.capacity, "must be >= 1")
        _check(self.lease_timeout_s > 0, "queue.lease_timeout_s", self.lease_timeout_s,
               "must be > 0")
        _check(self.lease_pairs >= 1, "queue.lease_pairs", self.lease_pairs, "must be >= 1")
        _check(self.snapshot_every_s > 0, "queue.snapshot_every_s", self.snapshot_every_s,
               "must be > 0")


@dataclass(frozen=True)
class PrecomputeConfig:
    """FM worker pool that drains the queue (one FM + encoder per worker)."""

    # pool size and scaling (solaris/precompute/scaling.py, run by the pool's owner every few
    # seconds): workers started with the pool; None: 0 in the cluster profile (a GPU worker
    # is asked for when there is work), 1 in a local profile
    workers: int | None = None
    # never fewer workers than this; None: 0 in the cluster profile (an idle pool holds no
    # worker, so Ray's autoscaler stops its GPU node), `workers` in a local profile (a local
    # pool never shrinks below what it started with)
    min_workers: int | None = None
    max_workers: int = 4  # never more workers than this (scaling on queue depth and lag)
    # pending pairs per worker above which the pool grows (to ceil(depth / this) workers)
    scale_up_depth: int = 5000
    # pending + leased pairs per worker at or under which the pool has a worker too many
    # (0: only an empty queue with nothing leased); below scale_up_depth: the band between
    # the two is the hysteresis in which the pool holds its size
    scale_down_depth: int = 0
    # the oldest pending pair has waited longer than this (wall seconds): one more worker,
    # none while a requested worker is not placed yet, at most one per this many seconds
    scale_up_lag_s: float = 120.0
    # a pool with a worker too many shrinks only after it has been so this long (the
    # cool-down, wall seconds); a removed worker stops leasing, acks what it holds, then goes
    scale_down_after_s: float = 300.0
    device: str = "auto"  # auto (a GPU where the worker got one, else CPU) | cpu | cuda
    # whether a worker asks Ray for accelerator_resources: auto -- with device cuda, or
    # device auto and either the cluster profile (serve.profile=cluster: asked for whether
    # or not a GPU node is up, so Ray's autoscaler launches one) or, locally, a GPU in the
    # cluster when the pool starts; never with device cpu | always | never (CPU workers)
    accelerator: str = "auto"
    # the Ray resources of one accelerator worker in the cluster profile ("GPU" goes to
    # num_gpus, the rest are custom resources: cluster.yaml's gpu_worker node type has
    # both); a local profile asks for the "GPU" entry alone
    accelerator_resources: dict[str, float] = field(
        default_factory=lambda: {"GPU": 1.0, "fm_gpu": 1.0})
    threads: int = 1  # torch intra-op threads per CPU worker
    idle_wait_s: float = 0.05  # wall seconds a worker waits after an empty lease
    # the FM forward runs in blocks of this many request groups / pairs, the last padded, so
    # a pair's vector does not depend on what else its lease holds (solaris.models.blocks);
    # 0: one call per lease (then a pair's vector may move in its last bits with its lease)
    block_requests: int = 32
    block_pairs: int = 256
    # a worker that runs on a GPU uses these instead, and leases this many pairs (on the CPU:
    # queue.lease_pairs). At 256-pair leases and blocks an H200 is launch-bound (about one
    # CPU core's pairs/s); at 4096 it computes 4.5-5.5x as many pairs a second as with the
    # CPU's blocks, with the same vectors to 2e-6 (bench/precompute_gpu.py;
    # docs/results/2026-12-04-gpu-workers.md)
    gpu_block_requests: int = 512
    gpu_block_pairs: int = 4096
    gpu_lease_pairs: int = 4096

    def __post_init__(self) -> None:
        _check(self.min_workers is None or self.min_workers >= 0, "precompute.min_workers",
               self.min_workers, "must be >= 0 or None (the profile's)")
        _check(self.workers is None or self.workers >= 0, "precompute.workers", self.workers,
               "must be >= 0 or None (the profile's)")
        _check(self.workers is None or self.min_workers is None
               or self.workers >= self.min_workers, "precompute.workers", self.workers,
               f"must be >= precompute.min_workers={self.min_workers}")
        _check(self.block_requests >= 0, "precompute.block_requests", self.block_requests,
               "must be >= 0")
        _check(self.block_pairs >= 0, "precompute.block_pairs", self.block_pairs,
               "must be >= 0")
        _check(self.gpu_block_requests >= 0, "precompute.gpu_block_requests",
               self.gpu_block_requests, "must be >= 0")
        _check(self.gpu_block_pairs >= 0, "precompute.gpu_block_pairs", self.gpu_block_pairs,
               "must be >= 0")
        _check(self.gpu_lease_pairs >= 1, "precompute.gpu_lease_pairs", self.gpu_lease_pairs,
               "must be >= 1")
        _check(self.max_workers >= max(1, self.workers or 0, self.min_workers or 0),
               "precompute.max_workers", self.max_workers,
               f"must be >= 1, precompute.workers={self.workers} and "
               f"precompute.min_workers={self.min_workers}")
        _check(self.scale_up_depth >= 1, "precompute.scale_up_depth", self.scale_up_depth,
               "must be >= 1")
        _check(0 <= self.scale_down_depth < self.scale_up_depth, "precompute.scale_down_depth",
               self.scale_down_depth,
               f"must be in [0, precompute.scale_up_depth={self.scale_up_depth})")
        _check(self.scale_up_lag_s > 0, "precompute.scale_up_lag_s", self.scale_up_lag_s,
               "must be > 0")
        _check(self.scale_down_after_s >= 0, "precompute.scale_down_after_s",
               self.scale_down_after_s, "must be >= 0")
        _check(self.accelerator in ("auto", "always", "never"), "precompute.accelerator",
               self.accelerator, "must be one of auto, always, never")
        res = self.accelerator_resources
        _check(isinstance(res, dict) and bool(res) and all(
            isinstance(k, str) and k and k != "CPU" and isinstance(v, (int, float))
            and not isinstance(v, bool) and v > 0 for k, v in res.items()),
            "precompute.accelerator_resources", res,
            "must map resource names (not CPU: that is the worker's own share) to amounts > 0")
        _check(self.device != "cuda" or (self.accelerator != "never" and res.get("GPU", 0) > 0),
               "precompute.device", self.device,
               "cuda needs precompute.accelerator other than never and a GPU in "
               "precompute.accelerator_resources")
        _check(self.device in ("auto", "cpu", "cuda"), "precompute.device", self.device,
               "must be one of auto, cpu, cuda")
        _check(self.threads >= 1, "precompute.threads", self.threads, "must be >= 1")
        _check(self.idle_wait_s >= 0, "precompute.idle_wait_s", self.idle_wait_s,
               "must be >= 0")


@dataclass(frozen=True)
class KnnConfig:
    """The KNN rebuild job (user and item neighbour tables) and how routers read its output."""

    k: int = 100  # neighbours kept per user (self excluded), cosine similarity
    item_k: int = 20  # neighbours kept per item
    # the user vector the user table is built from (solaris.knn.user_encoder): clicked_items,
    # the mean FM item vector over the user's clicked events (users who like alike), or
    # request_tower, the FM's user vector of its last history_len events (its state now)
    user_vector: str = "clicked_items"
    user_events: int = 1000  # latest events per user clicked_items reads
    exact_max: int = 1_000_000  # below this many rows an exact index; at or above it an IVF index
    recall_queries: int = 1000  # random queries of the recall@10 check against exact search
    min_recall: float = 0.95  # a build with recall@10 below this is refused (not published)
    table_uri: str | None = None  # pyarrow.fs URI or local dir of versioned tables + pointer
    poll_s: float = 5.0  # wall seconds between a router's checks of the published pointer
    nlist: int = 0  # IVF inverted lists; 0 = about 4 * sqrt(rows)
    train_per_list: int = 64  # k-means training sample per IVF list (capped at the rows)
    recall_margin: float = 0.02  # nprobe is tuned to min_recall + this on separate queries
    max_nprobe: int = 1024  # tuning doubles nprobe up to this (then the build is refused)
    search_batch: int = 4096  # queries per faiss call when filling a whole table
    keep_versions: int = 3  # published versions kept on storage (older ones are deleted)
    seed: int = 0  # seed of the training sample and the recall queries

    def __post_init__(self) -> None:
        _check(self.k >= 1, "knn.k", self.k, "must be >= 1")
        _check(self.item_k >= 1, "knn.item_k", self.item_k, "must be >= 1")
        _check(self.user_vector in ("clicked_items", "request_tower"), "knn.user_vector",
               self.user_vector, "must be clicked_items or request_tower")
        _check(self.user_events >= 1, "knn.user_events", self.user_events, "must be >= 1")
        _check(self.exact_max >= 1, "knn.exact_max", self.exact_max, "must be >= 1")
        _check(self.recall_queries >= 1, "knn.recall_queries", self.recall_queries, "must be >= 1")
        _check(0.0 <= self.min_recall <= 1.0, "knn.min_recall", self.min_recall,
               "must be in [0, 1]")
        _check(self.poll_s > 0, "knn.poll_s", self.poll_s, "must be > 0")
        _check(self.nlist >= 0, "knn.nlist", self.nlist, "must be >= 0 (0 = 4 * sqrt(rows))")
        _check(self.train_per_list >= 39, "knn.train_per_list", self.train_per_list,
               "must be >= 39 (faiss k-means needs 39 points per centroid)")
        _check(0.0 <= self.recall_margin < 1.0, "knn.recall_margin", self.recall_margin,
               "must be in [0, 1)")
        _check(self.max_nprobe >= 1, "knn.max_nprobe", self.max_nprobe, "must be >= 1")
        _check(self.search_batch >= 1, "knn.search_batch", self.search_batch, "must be >= 1")
        _check(self.keep_versions >= 2, "knn.keep_versions", self.keep_versions,
               "must be >= 2 (a reader of the previous pointer must still find its table)")


PROFILES = ("serving", "cluster", "replay")  # serve.profile's values (ServeConfig)


@dataclass(frozen=True)
class ServeConfig:
    """The Ray Serve app: router + vertical models (serve_app.py)."""

    artifacts_dir: str | None = None  # trained artifacts (solaris train); None = build the default
    mode: str = "solaris"  # solaris (cache lookups) | vm (VM alone) | inline (FM in the request path)
    max_candidates: int = 1000  # candidates per /rank request; more is a 422 naming the field
    max_body_bytes: int = 1_000_000  # larger request bodies are a 413
    vm_batch_size: int = 16  # requests per @serve.batch call of a VM replica
    vm_batch_wait_s: float = 0.002  # how long a VM batch waits to fill
    rollout_threshold: float = 0.8  # a new version's coverage / the old one's at which VMs switch
    rollout_min_lookups: int = 2000  # candidates looked up under a new version before a switch
    inline_sharing: bool = False  # mode inline: share the FM's request part (else per pair)
    # impressions and verifier picks are sent in batches this often (each send is a call per
    # shard and one to the queue, and a call to an idle actor costs ~2 ms of CPU on 2 cores:
    # 20 ms cost the queue and the shards about 1 ms more CPU per request than 250; 1000
    # makes 0.13-0.22 such calls per request at 23 rps, against 0.44-0.59 at 250). Picks
    # wait at most this long for the queue, where they wait minutes for their user anyway
    flush_ms: float = 1000.0
    # the top-k candidates by score are recorded as impressions (what a feed shows); 0: none
    # (then /feedback alone feeds the history store)
    impressions_top_k: int = 10
    flush_requests: int = 32  # ... or once this many requests are buffered
    # the app's stateful actors (cache shards, queue, ledger, KNN holder) are detached: they
    # outlive the replicas that start them, so a redeploy that replaces replicas keeps the
    # cache and the queue (`ray stop`, or ray.kill by name, removes them); false: they die
    # with the replica that started them
    detached_state: bool = True
    # cold-start neighbour queries kept (an LRU map keyed by the query's exact inputs: a hit
    # is the answer a fresh query would give); 0: none kept
    cold_start_memo: int = 4096
    # a residual VM's VM alone runs beside the lookup round (the VM replica's ``base``) and the
    # router adds the corrections to its logits (``solaris.online.scoring.ResidualHead``): the
    # same scores, bit for bit, with the lookup no longer in front of the VM call; false: the
    # slots travel to the VM replica, which runs one forward after the lookup
    overlap: bool = True
    # serving: event time is the app's wall clock -- a request's `now`, `mode` or
    # `features_for` is a 422, and each store (pairs, history, queue) measures an event
    # time's skew against its wall clock; cluster: serving, and /rank and /feedback need the
    # service token (SOLARIS_SERVICE_TOKEN); replay: the replay / debug profile -- a request
    # may carry its event time and the debug fields, and a store measures skew against the
    # latest time it has seen (the replay, the benches and the tests turn it on)
    profile: str = "serving"
    # a store refuses an event time more than this far ahead of its reference (counted as
    # clock_refused); the replay widens it to its log's longest gap between requests
    max_skew_s: float = 300.0
    # where a request's cache lookups are answered: replica -- a read replica of the shards in
    # each router replica (solaris/cache/replica.py), pulled every replica_refresh_s; a
    # request makes no cache-shard call; shards -- one round of calls to the shards per
    # request (each shard that holds a key of the request)
    cache_reads: str = "replica"
    replica_refresh_s: float = 1.0  # wall seconds between a replica's pulls of its shards
    # a shard not pulled successfully for this long reads as misses (as a late shard does)
    replica_stale_s: float = 10.0
    # rollouts decided only at the barrier (ReplayRouter.flush_now) from the tick's lookups
    # in event-time order, shadow lookups chosen by request id: a replay's switch does not
    # depend on how its concurrent requests interleaved (the replay sets it; live serving
    # decides after every shadow lookup)
    rollout_at_barrier: bool = False
    # the app's control state (runtime scales, rollout switches; actors/control.py): one
    # copy every router replica follows, written whole here on every change and read back
    # when its holder restarts (a local directory or a pyarrow.fs URI: s3://, gs://); None:
    # kept by the holder only (a restart of the holder forgets it). The cluster profile
    # defaults it under $SOLARIS_STATE_URI (solaris/state.py)
    control_uri: str | None = None
    # a router's long poll of the control state returns at the next change or after this
    # many seconds with none (then it polls again)
    control_wait_s: float = 10.0
    # GET /healthz: each dependency's check is given up after this long (it then reads as
    # not answering); the answer is reused for health_cache_s; a published KNN table older
    # than health_knn_max_age_s is reported stale (the app degraded, still serving)
    health_budget_ms: float = 1000.0
    health_cache_s: float = 1.0
    health_knn_max_age_s: float = 2 * 86400.0

    def __post_init__(self) -> None:
        _check(self.control_wait_s > 0, "serve.control_wait_s", self.control_wait_s,
               "must be > 0")
        _check(self.health_budget_ms > 0, "serve.health_budget_ms", self.health_budget_ms,
               "must be > 0")
        _check(self.health_cache_s >= 0, "serve.health_cache_s", self.health_cache_s,
               "must be >= 0")
        _check(self.health_knn_max_age_s > 0, "serve.health_knn_max_age_s",
               self.health_knn_max_age_s, "must be > 0")
        _check(self.mode in ("solaris", "vm", "inline"), "serve.mode", self.mode,
               "must be one of solaris, vm, inline")
        _check(self.cache_reads in ("replica", "shards"), "serve.cache_reads",
               self.cache_reads, "must be one of replica, shards")
        _check(self.replica_refresh_s > 0, "serve.replica_refresh_s", self.replica_refresh_s,
               "must be > 0")
        _check(self.replica_stale_s >= self.replica_refresh_s, "serve.replica_stale_s",
               self.replica_stale_s,
               f"must be >= serve.replica_refresh_s={self.replica_refresh_s}")
        _check(self.profile in PROFILES, "serve.profile", self.profile,
               f"must be one of {', '.join(PROFILES)}")
        _check(self.max_skew_s > 0, "serve.max_skew_s", self.max_skew_s, "must be > 0")
        _check(self.max_candidates >= 1, "serve.max_candidates", self.max_candidates, "must be >= 1")
        _check(self.max_body_bytes >= 1024, "serve.max_body_bytes", self.max_body_bytes,
               "must be >= 1024")
        _check(self.vm_batch_size >= 1, "serve.vm_batch_size", self.vm_batch_size, "must be >= 1")
        _check(self.vm_batch_wait_s >= 0, "serve.vm_batch_wait_s", self.vm_batch_wait_s,
               "must be >= 0")
        _check(self.flush_ms > 0, "serve.flush_ms", self.flush_ms, "must be > 0")
        _check(self.impressions_top_k >= 0, "serve.impressions_top_k", self.impressions_top_k,
               "must be >= 0")
        _check(self.rollout_min_lookups >= 1, "serve.rollout_min_lookups",
               self.rollout_min_lookups, "must be >= 1")
        _check(self.cold_start_memo >= 0, "serve.cold_start_memo", self.cold_start_memo,
               "must be >= 0")
        _check(self.flush_requests >= 1, "serve.flush_requests", self.flush_requests,
               "must be >= 1")
        _check(0.0 < self.rollout_threshold <= 1.0, "serve.rollout_threshold",
               self.rollout_threshold, "must be in (0, 1]")


@dataclass(frozen=True)
class SolarisConfig:
    """Root of the config tree."""

    data: DataConfig = field(default_factory=DataConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    fm: FMConfig = field(default_factory=FMConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    vm: VMConfig = field(default_factory=VMConfig)
    residual: ResidualConfig = field(default_factory=ResidualConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    enrich: EnrichConfig = field(default_factory=EnrichConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    precompute: PrecomputeConfig = field(default_factory=PrecomputeConfig)
    knn: KnnConfig = field(default_factory=KnnConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)


# Options removed once their default had won, each with the behaviour that is now the only
# one and the dated note that measured it. A config that sets one is refused with that note;
# a stored config (an artifact's manifest, a finished run's replay-config.yaml) that holds one
# still loads, the key ignored.
REMOVED: dict[str, tuple[Any, str]] = {
    "residual.guard_family": ("bonferroni", "docs/results/2026-12-03-replay-guard-family.md"),
    "residual.train_verifier": ("crossfit",
                                "docs/results/2026-12-04-replay-presence-signal.md"),
    "residual.pair_scale_on": ("full", "docs/results/2026-12-03-replay-pair-scale-on.md"),
    "residual.pair_gate_on": ("fixed", "docs/results/2026-12-04-replay-own-pair-gate.md"),
    "queue.merge": ("earlier",
                    "docs/results/2026-12-02-speculation-policies-merge-earlier.md"),
}


def _removed_error(name: str, value: Any) -> ConfigError:
    only, note = REMOVED[name]
    return ConfigError(f"{name}={value!r}: the option was removed, {only!r} is always the "
                       f"behaviour (its result: {note})")


def _without_removed(values: Any, where: str) -> Any:
    """A stored config's ``values`` without the removed options it holds (a copy where it
    holds any; ``values`` itself is not changed). One that held another value than the
    behaviour now is logged: the config loaded is not the one its artifacts were made with."""
    if not isinstance(values, dict):
        return values  # _build names the bad shape
    out = values
    for name, (only, note) in REMOVED.items():
        *path, key = name.split(".")
        node: Any = out
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict) or key not in node:
            continue
        if node[key] != only:
            log.warning("%s: %s=%r is a removed option, loaded as %r (its result: %s)",
                        where, name, node[key], only, note)
        out = _drop(out, [*path, key])
    return out


def _drop(values: dict[str, Any], path: list[str]) -> dict[str, Any]:
    head, *rest = path
    if not rest:
        return {k: v for k, v in values.items() if k != head}
    return {**values, head: _drop(values[head], rest)}


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    """Build dataclass ``cls`` from a plain dict, recursing into nested dataclasses."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where or 'config'}={values!r}: expected a mapping")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    if cls is SyntheticConfig and "profile" in values:
        from solaris.data.profiles import profile_values

        values = {**profile_values(values["profile"], where), **values}
    kwargs: dict[str, Any] = {}
    for key, val in values.items():
        name = f"{where + '.' if where else ''}{key}"
        if key not in known and name in REMOVED:
            raise _removed_error(name, val)
        if key not in known:
            raise ConfigError(f"{name}={val!r}: unknown field "
                              f"(known: {', '.join(sorted(known))})")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, val, name)
        elif isinstance(val, list):
            kwargs[key] = tuple(val)
        else:
            kwargs[key] = val
    return cls(**kwargs)


def config_from_dict(values: dict[str, Any], *, stored: bool = False) -> SolarisConfig:
    """Build the config tree from nested dicts (e.g. parsed YAML). ``stored``: ``values`` is a
    config an earlier run wrote (an artifact manifest's ``config``): the removed options it
    may hold (``REMOVED``) are ignored instead of refused."""
    if stored:
        values = _without_removed(values, "stored config")
    return _build(SolarisConfig, values, "")


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                *, stored: bool = False) -> SolarisConfig:
    """Load YAML (if given) and apply dotted ``overrides`` such as ``{"fm.emb_dim": 32}``.
    ``stored``: the file is a config an earlier run wrote (a finished replay's
    ``replay-config.yaml``): the removed options it holds are ignored; ``overrides`` are
    checked as always."""
    import yaml

    values: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping, got {type(loaded).__name__}")
        values = _without_removed(loaded, str(path)) if stored else loaded
    return config_from_dict(_apply(values, overrides))


def _apply(values: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``values`` (a nested dict) with dotted ``overrides`` set in place."""
    for dotted, val in (overrides or {}).items():
        node = values
        parts = dotted.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = val
    return values


def with_overrides(cfg: "SolarisConfig", overrides: dict[str, Any]) -> "SolarisConfig":
    """A copy of ``cfg`` with dotted ``overrides`` applied (checked like any config)."""
    return config_from_dict(_apply(config_to_dict(cfg), overrides))


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs as dotted overrides for ``load_config`` (values parsed as
    YAML: ``fm.emb_dim=32`` gives an int, ``split.vm_surface=null`` None)."""
    import yaml

    out = {}
    for p in pairs:
        if "=" not in p:
            raise ConfigError(f"--set {p!r}: expected KEY=VALUE, e.g. fm.emb_dim=32")
        k, v = p.split("=", 1)
        out[k] = yaml.safe_load(v)
    return out


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config (for checkpoints and reports)."""
    return dataclasses.asdict(cfg)
