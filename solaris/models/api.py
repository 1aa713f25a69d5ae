"""The two model interfaces SOLARIS reads models through, and plug-in by import path.

Everything outside a model's own file -- training, the FM workers, the KNN job and user
encoder, the router and the scorer, the replay, the transfer report -- reads a model through
these interfaces only; the built-ins (``solaris.models.fm.FoundationModel``,
``solaris.models.vm.VerticalModel``) are one implementation each.

**FM** (``FMModel``), a ``torch.nn.Module`` with:

- ``version`` (str), ``tasks`` (tuple of task names, the heads' order), ``history_len``
  (the longest behaviour history it reads), ``shared_dim`` (the width of its last shared
  layer: what the pair encoder compresses and the cache keeps);
- ``request_part(req) -> state``: a request's state as of its time, once per request.
  ``req`` holds ``REQUEST_KEYS`` (what the history store builds:
  ``solaris.history.HistoryStore.batch``), R rows each; ``state`` is any dict of tensors
  with R rows first (the workers run it in fixed-size row blocks);
- ``candidate_part(state, cand, req_index) -> (B, shared_dim)``: the last shared layer of B
  (request, candidate) pairs; ``cand`` holds ``CANDIDATE_KEYS``, ``req_index`` (B,) maps
  each pair to its request's row of ``state``. A row's output must depend on its own
  inputs only (no operation across rows), so a pair's vector does not depend on its lease;
- ``heads(shared) -> (B, T)``: per-task logits on a shared-layer vector (encoder training,
  the encoder's logit term, the transfer report's KD);
- ``user_vectors(req) -> (R, U)``: a user vector for the user-KNN job and the router's
  cold-start path, from ``REQUEST_KEYS`` with the user id not read (a user the FM never saw
  gets one from the same function as everyone);
- ``item_vectors() -> (num_items, I)``: item vectors for the item-neighbour tier;
- optionally ``flops_per_pair() -> float | None``; ``solaris.models.flops`` counts the
  request and candidate parts itself where the FM does not say;
- optionally ``reads_unseen_users = True`` (``ReadsUnseenUsers``), a class attribute: the
  FM reads a user it never saw (a ``user`` id ``>= num_users``, zero ``user_cat`` and
  ``user_cont``) and gives finite outputs for it, so a new user's pairs are precomputed and
  served; without it such a user is answered by the VM alone until the FM is retrained.

What each key of ``REQUEST_KEYS`` and ``CANDIDATE_KEYS`` holds (dtype, shape, coding,
padding, unit) is ``solaris.models.contract.INPUTS``; ``solaris.models.check.check_fm``
(``solaris check-fm``) probes a class against all of this.

An FM class is built with ``Class.from_config(cfg, spec, num_users, num_items, tasks,
history_len)`` where it has that class method (the built-in reads its ``FMConfig`` fields),
else ``Class(spec=..., num_users=..., num_items=..., tasks=..., history_len=...,
version=cfg.version, **cfg.kwargs)``: ``fm.cls`` names the class (``module:Class``, as Ray
Serve names an application) and ``fm.kwargs`` holds its own keyword arguments.

**VM alone** (``VMModel``), a ``torch.nn.Module`` with ``forward(batch) -> (B,)`` logits on
``solaris.models.batch.BASE_KEYS`` and ``with_unknown_ids()`` (ids ``num_users`` /
``num_items`` then read an out-of-vocabulary row: serving never refuses an id); built like the
FM from ``vm.cls`` (``from_config(cfg, spec, num_users, num_items)``, else
``Class(spec=..., num_users=..., num_items=..., **cfg.kwargs)``). The corrections that read
the SOLARIS slots on top of it (``solaris.models.residual.ResidualVM``) take any VM alone.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

import torch

from solaris.errors import CheckpointError, ConfigError

Tensor = torch.Tensor

# request side: computed once per request (``HistoryStore.batch`` builds exactly these)
REQUEST_KEYS = ("user", "surface", "user_cat", "user_cont", "hist_item", "hist_action",
                "hist_surface", "hist_age", "hist_item_cat")
# candidate side: one row per (request, candidate) pair
CANDIDATE_KEYS = ("item", "item_cat", "item_mh", "item_cont")

BUILTIN_FM = "solaris.models.fm:FoundationModel"
BUILTIN_VM = "solaris.models.vm:VerticalModel"

FM_METHODS = ("request_part", "candidate_part", "heads", "user_vectors", "item_vectors")
FM_ATTRS = ("version", "tasks", "history_len", "shared_dim")
VM_METHODS = ("forward", "with_unknown_ids")


@runtime_checkable
class FMModel(Protocol):
    """What SOLARIS reads of a foundation model (module docstring)."""

    version: str
    tasks: tuple[str, ...]
    history_len: int
    shared_dim: int

    def request_part(self, req: dict[str, Tensor]) -> dict[str, Tensor]: ...

    def candidate_part(self, state: dict[str, Tensor], cand: dict[str, Tensor],
                       req_index: Tensor) -> Tensor: ...

    def heads(self, shared: Tensor) -> Tensor: ...

    def user_vectors(self, req: dict[str, Tensor]) -> Tensor: ...

    def item_vectors(self) -> Tensor: ...


@runtime_checkable
class ReadsUnseenUsers(Protocol):
    """An optional FM capability, declared by a class attribute (read from the class, so
    the router knows it without building the model): ``reads_unseen_users = True`` promises
    finite outputs for a user the FM never saw, an id ``>= num_users`` with zero side
    features. An FM that indexes a user-id table of ``num_users`` rows cannot promise it
    unless it maps such ids to a row of its own."""

    reads_unseen_users: bool


def reads_unseen_users(fm: Any) -> bool:
    """Whether an FM class or instance declares ``ReadsUnseenUsers`` (the attribute is
    ``True``; absent or anything else: it does not)."""
    return getattr(fm, "reads_unseen_users", False) is True


@runtime_checkable
class VMModel(Protocol):
    """What SOLARIS reads of a VM alone (module docstring)."""

    def forward(self, batch: dict[str, Tensor]) -> Tensor: ...

    def with_unknown_ids(self) -> "VMModel": ...


def shared_layer(fm: FMModel, batch: dict[str, Tensor]) -> Tensor:
    """The last shared layer (B, shared_dim) of a batch whose rows each carry their own
    request side (``REQUEST_KEYS`` and ``CANDIDATE_KEYS``, B rows each)."""
    B = batch["item"].shape[0]
    req_index = torch.arange(B, device=batch["item"].device)  # (B,)
    return fm.candidate_part(fm.request_part(batch), batch, req_index)  # (B, S)


def import_class(path: str, field: str) -> type:
    """The class ``path`` (``package.module:Class``) names; ``ConfigError`` naming ``field``
    and the path where it is malformed, cannot be imported or is not a class."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise ConfigError(f"{field}={path!r}: expected 'package.module:Class'")
    module, name = path.split(":")
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # ImportError, or the module failing as it imports
        raise ConfigError(f"{field}={path!r}: cannot import {module!r} "
                          f"({type(e).__name__}: {e})") from e
    cls = getattr(mod, name, None)
    if not isinstance(cls, type):
        raise ConfigError(f"{field}={path!r}: {module!r} has no class {name!r}")
    return cls


def _check_model(model: Any, path: str, field: str, attrs: tuple[str, ...],
                 methods: tuple[str, ...]) -> None:
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{field}={path!r}: built a {type(model).__name__}, not a "
                          "torch.nn.Module")
    missing = [a for a in attrs if not hasattr(model, a)]
    missing += [m for m in methods if not callable(getattr(model, m, None))]
    if missing:
        raise ConfigError(f"{field}={path!r}: the model lacks {', '.join(missing)} "
                          "(solaris.models.api)")


def build_fm(cfg: Any, spec: Any, num_users: int, num_items: int, tasks: tuple[str, ...],
             history_len: int, cls: type | None = None) -> Any:
    """A new FM of class ``cfg.cls`` (``FMConfig``), checked against ``FMModel``; ``cls``:
    that class itself, not imported (the FM checker's classes need not import by path)."""
    cls = import_class(cfg.cls, "fm.cls") if cls is None else cls
    make = getattr(cls, "from_config", None)
    try:
        if callable(make):
            fm = make(cfg, spec, num_users, num_items, tuple(tasks), history_len)
        else:
            fm = cls(spec=spec, num_users=num_users, num_items=num_items, tasks=tuple(tasks),
                     history_len=history_len, version=cfg.version, **dict(cfg.kwargs))
    except (TypeError, ValueError) as e:  # the class refused its arguments
        raise ConfigError(f"fm.kwargs={dict(cfg.kwargs)!r}: {cfg.cls} refused them "
                          f"({type(e).__name__}: {e})") from e
    _check_model(fm, cfg.cls, "fm.cls", FM_ATTRS, FM_METHODS)
    if tuple(fm.tasks) != tuple(tasks):
        raise ConfigError(f"fm.cls={cfg.cls!r}: built with tasks {tuple(fm.tasks)}, "
                          f"expected {tuple(tasks)}")
    return fm


def build_vm(cfg: Any, spec: Any, num_users: int, num_items: int, slot_dim: int = 0) -> Any:
    """A new VM alone of class ``cfg.cls`` (``VMConfig``), checked against ``VMModel``."""
    cls = import_class(cfg.cls, "vm.cls")
    make = getattr(cls, "from_config", None)
    try:
        if callable(make):
            vm = make(cfg, spec, num_users, num_items, slot_dim)
        else:
            vm = cls(spec=spec, num_users=num_users, num_items=num_items, **dict(cfg.kwargs))
    except (TypeError, ValueError) as e:  # the class refused its arguments
        raise ConfigError(f"vm.kwargs={dict(cfg.kwargs)!r}: {cfg.cls} refused them "
                          f"({type(e).__name__}: {e})") from e
    _check_model(vm, cfg.cls, "vm.cls", (), VM_METHODS)
    return vm


def load_weights(model: torch.nn.Module, state: dict[str, Tensor], where: str) -> None:
    """``model.load_state_dict(state)``; ``CheckpointError`` naming ``where`` if they do
    not fit."""
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(f"{where}: weights do not fit the model its config describes "
                              f"({e})") from e
