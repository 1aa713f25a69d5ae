"""``check_fm_class``: the FM class an artifact's checkpoint names is imported without
building the FM; one that does not import is a ConfigError naming the file and the class."""

from __future__ import annotations

import pytest
import torch

from solaris.artifacts import check_fm_class
from solaris.errors import ConfigError
from solaris.train.checkpoint import save_checkpoint


def fm_checkpoint(root, cls: str) -> None:
    save_checkpoint(root / "fm.pt", torch.nn.Linear(2, 2), "fm", {"cls": cls}, version="v")


def test_an_importable_class_passes_and_is_named(tmp_path):
    fm_checkpoint(tmp_path, "solaris.models.fm:FoundationModel")
    assert check_fm_class(tmp_path) == "solaris.models.fm:FoundationModel"


@pytest.mark.parametrize("cls, why", [("nosuch.module:FM", "cannot import 'nosuch.module'"),
                                      ("solaris.models.fm:NoSuchFM", "has no class")])
def test_a_class_that_does_not_import_is_a_config_error_naming_it(tmp_path, cls, why):
    fm_checkpoint(tmp_path, cls)
    with pytest.raises(ConfigError) as e:
        check_fm_class(tmp_path)
    assert str(tmp_path / "fm.pt") in str(e.value) and cls in str(e.value) and why in str(e.value)
