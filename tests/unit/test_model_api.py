"""The model interfaces and the artifact loader (solaris/models/api.py, solaris/artifacts.py):
classes by import path, refused with errors that name what is wrong; one loader for every
reader; an imported FM gives what training it in the same run gives."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from solaris.artifacts import SCHEMA, Artifacts
from solaris.config import FMConfig, SolarisConfig, VMConfig, load_config
from solaris.data.load import load_dataset
from solaris.errors import CheckpointError, ConfigError
from solaris.models import api
from solaris.models.fm import FoundationModel
from solaris.models.vm import VerticalModel
from solaris.train.artifacts import train_artifacts
from solaris.train.checkpoint import load_checkpoint, save_checkpoint
from tests import tiny
from tests.unit.test_models import SMALL_FM, TASKS, TINY_SPEC


class NoHeads(torch.nn.Module):
    """An FM class that lacks most of the interface."""

    def __init__(self, spec, num_users, num_items, tasks, history_len, version):
        super().__init__()
        self.version, self.tasks, self.history_len, self.shared_dim = version, tasks, 1, 1


@pytest.mark.parametrize("path, why", [
    ("solaris.models.fm.FoundationModel", "expected 'package.module:Class'"),
    ("no_such_module_here:FM", "cannot import 'no_such_module_here'"),
    ("solaris.models.fm:NoSuchClass", "has no class 'NoSuchClass'"),
    ("solaris.models.fm:REQUEST_KEYS", "has no class 'REQUEST_KEYS'"),
])
def test_a_class_path_that_does_not_name_a_class_is_refused_naming_it(path, why):
    with pytest.raises(ConfigError, match="fm.cls") as e:
        api.import_class(path, "fm.cls")
    assert why in str(e.value)


def test_the_config_refuses_a_malformed_class_path():
    with pytest.raises(ConfigError, match="fm.cls='torch'"):
        FMConfig(cls="torch")
    with pytest.raises(ConfigError, match="vm.kwargs"):
        VMConfig(kwargs=[1])


def test_the_builtins_are_one_implementation_each():
    fm = api.build_fm(SMALL_FM, TINY_SPEC, 7, 11, TASKS, 5)
    assert isinstance(fm, FoundationModel) and isinstance(fm, api.FMModel)
    assert fm.shared_dim == SMALL_FM.shared_dim and fm.tasks == TASKS
    vm = api.build_vm(VMConfig(emb_dim=4, hidden=(8,)), TINY_SPEC, 7, 11)
    assert isinstance(vm, VerticalModel) and isinstance(vm, api.VMModel)
    with pytest.raises(ConfigError, match="the built-in FM reads the fm"):
        api.build_fm(FMConfig(kwargs={"dim": 8}), TINY_SPEC, 7, 11, TASKS, 5)


def test_a_class_that_lacks_the_interface_is_refused_naming_what_it_lacks():
    cfg = FMConfig(cls="tests.unit.test_model_api:NoHeads")
    with pytest.raises(ConfigError, match="lacks request_part, candidate_part, heads, "
                                          "user_vectors, item_vectors"):
        api.build_fm(cfg, TINY_SPEC, 7, 11, TASKS, 5)
    with pytest.raises(ConfigError, match="refused them"):
        api.build_fm(FMConfig(cls=cfg.cls, kwargs={"width": 3}), TINY_SPEC, 7, 11, TASKS, 5)


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    return tiny.train_tiny(tmp_path_factory.mktemp("api") / "art")


def test_the_manifest_names_its_schema_and_an_unknown_one_is_refused(art, tmp_path):
    a = Artifacts.open(art)
    assert a.manifest["schema"] == SCHEMA and a.manifest["fm_imported"] is False
    fm, enc, version = a.models()
    assert isinstance(fm, api.FMModel) and version == a.version == enc.version
    bad = tmp_path / "art"
    shutil.copytree(art, bad)
    m = json.loads((bad / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps({**m, "schema": 99}))
    with pytest.raises(CheckpointError, match="schema=99"):
        Artifacts.open(bad)
    del m["schema"]  # written before the field: schema 1, the same layout
    (bad / "manifest.json").write_text(json.dumps(m))
    assert Artifacts.open(bad).models()[2] == version


def test_an_artifact_whose_class_cannot_be_imported_is_refused_naming_it(art, tmp_path):
    bad = tmp_path / "art"
    shutil.copytree(art, bad)
    ck = load_checkpoint(bad / "fm.pt", "fm")
    fm = Artifacts.open(art).fm()
    save_checkpoint(bad / "fm.pt", fm, "fm", {**ck["config"], "cls": "gone_package.fm:FM"},
                    **ck["meta"])
    with pytest.raises(CheckpointError, match="fm.pt: fm.cls='gone_package.fm:FM': cannot "
                                              "import 'gone_package.fm'"):
        Artifacts.open(bad).models()


def test_an_imported_fm_gives_what_training_it_in_the_run_gives(art, tmp_path):
    """``fm.weights``: the FM is read, not trained; the encoder and every VM are then the
    same bits as those of the run that trained these weights."""
    out = tmp_path / "imported"
    weights = tmp_path / "weights.pt"
    torch.save(Artifacts.open(art).fm().state_dict(), weights)  # a plain state dict
    cfg = load_config(None, {**tiny.TINY, "fm.weights": str(weights)})
    m = train_artifacts(cfg, load_dataset(cfg.data), out, seed=0)
    assert m["fm_imported"] is True and m["train_device"] == "cpu"
    for name in ("fm.pt", "encoder.pt", "vm_click.pt", "vm_conversion_alone.pt"):
        a = load_checkpoint(art / name, name.split("_")[0].split(".")[0])["state_dict"]
        b = load_checkpoint(out / name, name.split("_")[0].split(".")[0])["state_dict"]
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), name
    if not torch.cuda.is_available():  # no GPU here: auto trains on the CPU, cuda is refused
        gpu = load_config(None, {**tiny.TINY, "train.device": "cuda"})
        with pytest.raises(ConfigError, match="train.device='cuda'"):
            train_artifacts(gpu, load_dataset(gpu.data), tmp_path / "gpu", seed=0)
    missing = load_config(None, {**tiny.TINY, "fm.weights": str(tmp_path / "none.pt")})
    with pytest.raises(CheckpointError, match="none.pt'?: no such file"):
        train_artifacts(missing, load_dataset(missing.data), tmp_path / "x", seed=0)


def test_nothing_outside_a_models_own_file_reads_its_layers():
    """Every consumer reads the FM and the VM through the interfaces: no product file but the
    model's own names a layer of the built-in FM or VM on anything but ``self``."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    fm = api.build_fm(SMALL_FM, TINY_SPEC, 7, 11, TASKS, 5)
    vm = api.build_vm(VMConfig(emb_dim=4, hidden=(8,)), TINY_SPEC, 7, 11)
    layers = {n for n, _ in fm.named_children()} | {n for n, _ in fm.named_parameters()
                                                    if "." not in n}
    layers |= {n for n, _ in vm.named_children()}
    assert {"inter_proj", "item_emb", "task_heads", "user_emb", "mlp"} <= layers
    own = {root / "solaris/models/fm.py", root / "solaris/models/vm.py"}
    offenders = []
    for top in ("solaris", "serve", "actors", "jobs"):
        for path in sorted((root / top).rglob("*.py")):
            if path in own:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr in layers
                        and not (isinstance(node.value, ast.Name) and node.value.id == "self")):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno} "
                                     f"{ast.unparse(node)}")
    assert not offenders, offenders


def test_training_into_a_dangling_link_is_a_clear_error(tmp_path):
    """An output directory that is a link to nothing (a replay's OUT/artifacts pointed at
    artifacts not trained yet) is named, with its target, before any training."""
    from solaris.train.artifacts import train_artifacts

    out = tmp_path / "artifacts"
    out.symlink_to(tmp_path / "not-there")
    with pytest.raises(ConfigError, match="not-there, which does not exist"):
        train_artifacts(SolarisConfig(), None, out, seed=0)
    assert not (tmp_path / "not-there").exists()
