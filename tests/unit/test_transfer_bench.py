"""bench/transfer.py's ``--set``: a bad override is refused by name before any dataset
process starts."""

from __future__ import annotations

import pytest

from solaris.errors import ConfigError
from tests.benches import load_bench

transfer = load_bench("transfer")


@pytest.mark.parametrize("bad, named", [("residual.present_affine=test", "residual.present_affine"),
                                        ("nokey", "nokey"),
                                        ("residual.nope=1", "residual.nope"),
                                        ("queue.merge=later", "queue.merge='later': the option "
                                                              "was removed")])
def test_bad_set_is_refused_before_any_process_starts(bad, named, tmp_path, monkeypatch) -> None:
    def no_spawn(*a, **k):
        raise AssertionError("a dataset process was started")

    monkeypatch.setattr(transfer.mp, "get_context", no_spawn)
    out = tmp_path / "t.json"
    with pytest.raises(ConfigError, match=named):
        transfer.main(["--json", str(out), "--datasets", "synthetic", "--set", bad])
    assert not out.exists()
