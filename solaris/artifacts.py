"""The artifact schema and its one loader: every reader of ``solaris train``'s output uses it.

An artifact directory (``solaris.train.artifacts.train_artifacts`` writes it)::

    manifest.json        schema, version, tasks, sizes, periods, file names, figures, config,
                         ``files``: each other file's sha256 and size (absent before them)
    fm.pt                the FM: state dict + FMConfig (its class, ``cls``) + sizes   kind "fm"
    encoder.pt           the pair encoder: state dict + EncoderConfig + in_dim        kind "encoder"
    side.npz             side-feature tables by user / item id
    ids/users.parquet    the deployment's id map (``solaris.ids``): raw ids in code order;
    ids/items.parquet    absent in artifacts written before it (the identity)
    vm_<task>.pt         the served (residual) VM: its VM alone's config + corrections  kind "vm"
    vm_<task>_alone.pt   the VM alone                                                   kind "vm"

``SCHEMA`` is the manifest's ``schema``; a manifest written before the field existed is
schema 1 (the same layout, the built-in classes). A schema this loader does not know, a
class that cannot be imported, or a file that does not fit what the manifest says is refused
with a ``CheckpointError`` naming it. The models are built through ``solaris.models.api``
from the class their checkpoint's config names, so an artifact of a team's own FM or VM
loads wherever the class imports.

An artifact location is a local path or a ``pyarrow.fs`` URI (``s3://``, ``gs://``,
``file://``): ``Artifacts.open`` and ``load_models`` read a URI from this node's verified copy
(``solaris.artifact_store``), so a replica or worker on any node opens the same location.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from solaris.artifact_store import local_artifacts
from solaris.config import SolarisConfig, config_from_dict
from solaris.data.schema import FeatureSpec
from solaris.errors import CheckpointError, ConfigError
from solaris.ids import IdMap
from solaris.models import api
from solaris.models.encoder import PairEncoder
from solaris.train.checkpoint import load_checkpoint

SCHEMA = 2
KNOWN_SCHEMAS = (1, 2)  # 1: written before the manifest named its schema (same layout)
SIDE_KEYS = ("user_cat", "user_cont", "item_cat", "item_mh", "item_cont")


@dataclass(frozen=True)
class SideTables:
    """The side-feature tables a worker, the scorer and the KNN job need, indexed by user /
    item id: what travels to every worker (``FeatureTables`` has the same five arrays)."""

    user_cat: np.ndarray  # (num_users, n_uc) int
    user_cont: np.ndarray  # (num_users, n_ud) float32
    item_cat: np.ndarray  # (num_items, n_ic) int
    item_mh: np.ndarray  # (num_items, n_mh, M) int, codes + 1
    item_cont: np.ndarray  # (num_items, n_id) float32

    @classmethod
    def from_features(cls, ft: Any) -> "SideTables":
        """The tables of a ``FeatureTables`` (or anything with the same five arrays)."""
        return cls(ft.user_cat, ft.user_cont, ft.item_cat, ft.item_mh, ft.item_cont)


def load_side_tables(path: str | Path) -> SideTables:
    """Read ``side.npz``; CheckpointError naming the file if missing or corrupt."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: side tables not found (re-run `solaris train`)")
    try:
        with np.load(path, allow_pickle=False) as f:
            return SideTables(**{k: f[k] for k in SIDE_KEYS})
    except Exception as e:  # truncated zip, missing key, foreign file
        raise CheckpointError(f"{path}: cannot read side tables ({type(e).__name__}: {e})") from e


def read_manifest(root: str | Path) -> dict:
    """The manifest of artifact directory ``root``, its schema checked."""
    path = Path(root) / "manifest.json"
    if not path.exists():
        raise CheckpointError(f"{root}: no manifest.json (train artifacts with `solaris train`)")
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: malformed manifest ({type(e).__name__}: {e})") from e
    if not isinstance(m, dict):
        raise CheckpointError(f"{path}: malformed manifest (not a JSON object)")
    schema = m.get("schema", 1)
    if schema not in KNOWN_SCHEMAS:
        raise CheckpointError(f"{path}: schema={schema!r}, this SOLARIS reads schemas "
                              f"{', '.join(map(str, KNOWN_SCHEMAS))} (upgrade SOLARIS or "
                              "retrain)")
    return m


def _class_error(path: Path, e: ConfigError) -> CheckpointError:
    return CheckpointError(f"{path}: {e}")


def fm_from_checkpoint(ck: dict, where: str | Path) -> Any:
    """The FM an ``fm.pt`` checkpoint describes, its weights loaded, in eval mode."""
    meta = ck["meta"]
    try:
        cfg = config_from_dict({"fm": ck["config"]}).fm
        fm = api.build_fm(cfg, FeatureSpec.from_dict(meta["spec"]), meta["num_users"],
                          meta["num_items"], tuple(meta["tasks"]), meta["history_len"])
    except ConfigError as e:
        raise _class_error(Path(where), e) from e
    api.load_weights(fm, ck["state_dict"], str(where))
    return fm.eval()


def check_fm_class(root: str | Path) -> str:
    """The FM class path the artifacts' FM checkpoint names, after importing it here (the
    checkpoint memory-mapped: no weights read, no model built); a ``ConfigError`` naming the
    checkpoint and the class where it does not import. A deployment that starts FM workers
    checks this first: a class missing where the app runs is then one clear error, not a
    worker that fails as it starts."""
    root = local_artifacts(root)
    manifest = read_manifest(root) if (root / "manifest.json").exists() else {}
    path = root / manifest.get("fm", "fm.pt")
    ck = load_checkpoint(path, "fm", mmap=True)
    try:
        cls = config_from_dict({"fm": ck["config"]}).fm.cls
        api.import_class(cls, "fm.cls")
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    return cls


def vm_alone_from_checkpoint(ck: dict, where: str | Path = "") -> Any:
    """The VM alone a VM checkpoint's config describes (weights not loaded): the model
    itself, or the base inside a residual VM's checkpoint."""
    meta = ck["meta"]
    try:
        cfg = config_from_dict({"vm": ck["config"]}).vm
        return api.build_vm(cfg, FeatureSpec.from_dict(meta["spec"]), meta["num_users"],
                            meta["num_items"], meta["slot_dim"])
    except ConfigError as e:
        raise _class_error(Path(where), e) from e


@dataclass(frozen=True)
class Artifacts:
    """An artifact directory (``solaris train``): version, tasks, VM files, side tables, and
    the loaders of its models."""

    root: Path
    version: str
    tasks: tuple[str, ...]
    vm_files: dict[str, str]  # task -> VM checkpoint file name
    num_users: int
    num_items: int
    dim: int  # pair-embedding width
    manifest: dict = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def open(cls, root: str | Path) -> "Artifacts":
        """The artifacts at ``root``: a local directory, or a URI read from this node's
        verified copy (``solaris.artifact_store.local_artifacts``; ``root`` is the copy)."""
        root = local_artifacts(root)
        m = read_manifest(root)
        try:
            vms = {t: v["file"] for t, v in m["vms"].items()}
            return cls(root, str(m["version"]), tuple(m["tasks"]), vms,
                       int(m["sizes"]["num_users"]), int(m["sizes"]["num_items"]),
                       int(m["config"]["encoder"]["width"]), m)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CheckpointError(f"{root / 'manifest.json'}: malformed manifest "
                                  f"({type(e).__name__}: {e})") from e

    @property
    def config(self) -> SolarisConfig:
        """The config the artifacts were trained with (less any option since removed:
        ``solaris.config.REMOVED``)."""
        return config_from_dict(self.manifest["config"], stored=True)

    @cached_property
    def spec(self) -> FeatureSpec:
        """The feature spec the models were trained on (as their checkpoints record it):
        what a request's real-time features are checked and standardised against."""
        files = [*self.vm_files.values()]
        path = self.root / (files[0] if files else self.manifest.get("fm", "fm.pt"))
        ck = load_checkpoint(path, "vm" if files else "fm")
        try:
            return FeatureSpec.from_dict(ck["meta"]["spec"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: malformed feature spec ({type(e).__name__}: "
                                  f"{e})") from e

    def side_tables(self) -> SideTables:
        return load_side_tables(self.root / self.manifest.get("side_tables", "side.npz"))

    def ids(self) -> IdMap:
        """The deployment's id map as of these artifacts (``solaris.ids``); artifacts written
        before maps were saved code by the identity (the wire's integers are the codes)."""
        m = IdMap.load(self.root)
        if m is None:
            return IdMap.identity(self.num_users, self.num_items)
        if len(m.users) != self.num_users or len(m.items) != self.num_items:
            raise CheckpointError(f"{self.root / 'ids'}: {len(m.users)} users and "
                                  f"{len(m.items)} items, the models {self.num_users} and "
                                  f"{self.num_items}")
        return m

    def fm(self) -> Any:
        """The FM (``solaris.models.api.FMModel``), weights loaded, in eval mode."""
        return _fm(self.root, self.manifest)[0]

    def encoder(self) -> PairEncoder:
        return _encoder(self.root, self.manifest)

    def models(self) -> tuple[Any, PairEncoder, str]:
        """(FM, encoder, their version); CheckpointError if the two versions differ."""
        return _models(self.root, self.manifest)

    def vm(self, task: str) -> tuple[torch.nn.Module, torch.nn.Module, dict]:
        """(served model, its VM alone, checkpoint meta) of ``task``: the residual VM
        (``solaris.models.residual.ResidualVM``) around its VM alone."""
        from solaris.errors import RequestError
        from solaris.models.residual import ResidualVM

        if task not in self.vm_files:
            raise RequestError(f"task={task!r}: no VM for it (tasks: {', '.join(self.tasks)})")
        path = self.root / self.vm_files[task]
        ck = load_checkpoint(path, "vm")
        meta = ck["meta"]
        if not meta.get("residual", False):
            raise CheckpointError(f"{path}: a jointly trained VM, a kind this SOLARIS no "
                                  "longer serves (retrain with `solaris train`)")
        base = vm_alone_from_checkpoint(ck, path)
        model = ResidualVM(base, int(meta["slot_dim"]), int(meta["hidden"]),
                           use_pair=bool(meta["use_pair"]), use_agg=bool(meta["use_agg"]),
                           use_z=bool(meta.get("use_z", True)),
                           imputed=bool(meta.get("imputed", False)),
                           agg_items=tuple(meta["agg_items"]) if meta.get("agg_items")
                           else None)
        state = ck["state_dict"]
        if "present_affine" not in state:  # saved before the map existed
            state = {**state, "present_affine": model.present_affine.clone()}
        api.load_weights(model, state, str(path))
        return model, base, meta

    def vm_alone(self, task: str) -> tuple[torch.nn.Module, float, float]:
        """(VM alone, its learning rate, its validation BCE) of ``task``."""
        entry = self.manifest.get("baselines", {}).get(task)
        if entry is None:
            raise CheckpointError(f"{self.root}: no VM alone for task {task!r}")
        path = self.root / entry["file"]
        ck = load_checkpoint(path, "vm")
        vm = vm_alone_from_checkpoint(ck, path)
        api.load_weights(vm, ck["state_dict"], str(path))
        return vm.eval(), float(entry["lr"]), float(entry["val_bce"])


def _fm(root: Path, manifest: dict) -> tuple[Any, str]:
    path = root / manifest.get("fm", "fm.pt")
    ck = load_checkpoint(path, "fm")
    return fm_from_checkpoint(ck, path), str(ck["meta"].get("version", ""))


def _encoder(root: Path, manifest: dict) -> PairEncoder:
    path = root / manifest.get("encoder", "encoder.pt")
    ck = load_checkpoint(path, "encoder")
    enc = PairEncoder(ck["meta"]["in_dim"], config_from_dict({"encoder": ck["config"]}).encoder)
    api.load_weights(enc, ck["state_dict"], str(path))
    enc.version = str(ck["meta"].get("version", ""))
    return enc.eval()


def _models(root: Path, manifest: dict) -> tuple[Any, PairEncoder, str]:
    (fm, version), enc = _fm(root, manifest), _encoder(root, manifest)
    if enc.version != version:
        raise CheckpointError(f"{root}: encoder version {enc.version!r} != FM version "
                              f"{version!r}")
    return fm, enc, version


def load_models(root: str | Path) -> tuple[Any, PairEncoder, str]:
    """(FM, encoder, version) of an artifact directory (``Artifacts.models``), or of a
    directory holding only ``fm.pt`` and ``encoder.pt`` (what the FM workers and the KNN
    job need); ``root`` may be a URI (``Artifacts.open``)."""
    root = local_artifacts(root)
    manifest = read_manifest(root) if (root / "manifest.json").exists() else {}
    return _models(root, manifest)


def served_unlike_trained(manifest: dict, cfg: SolarisConfig) -> str | None:
    """Why ``cfg`` would serve these artifacts' VMs inputs unlike those they were trained
    on, or None: the corrections were trained on simulated serving under the manifest's
    ``schedule.history_at``, and the FM workers' history time sets how fresh a cached z is."""
    trained = manifest.get("config", {}).get("schedule", {}).get("history_at", "request")
    if trained == cfg.schedule.history_at:
        return None
    return (f"artifacts {manifest.get('version', '?')} were trained with schedule.history_at="
            f"{trained!r} and are served with {cfg.schedule.history_at!r}: the cached "
            "embeddings are not as fresh as those the corrections trained on (retrain with "
            f"--set schedule.history_at={cfg.schedule.history_at})")
