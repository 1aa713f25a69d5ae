import pytest

from solaris.config import SolarisConfig, load_config
from solaris.errors import ConfigError


def test_defaults_build():
    cfg = SolarisConfig()
    assert cfg.encoder.width == 32 and cfg.report.seeds == 5


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("fm:\n  emb_dim: 32\n  seq_heads: 4\nreport:\n  coverages: [1.0, 0.5]\n")
    cfg = load_config(p, {"encoder.width": 8})
    assert cfg.fm.emb_dim == 32 and cfg.encoder.width == 8
    assert cfg.report.coverages == (1.0, 0.5)


@pytest.mark.parametrize("override, field", [
    ({"fm.emb_dim": 30, "fm.seq_heads": 4}, "fm.emb_dim=30"),
    ({"split.fm_frac": 0.8, "split.vm_frac": 0.2, "split.val_frac": 0.1}, "split.fm_frac"),
    ({"data.dataset": "imdb"}, "data.dataset='imdb'"),
    ({"data.dataset": "generic"}, "data.data_dir=None"),
    ({"synthetic_typo": 1}, "synthetic_typo=1: unknown field"),
    ({"report.coverages": [0.0]}, "report.coverages"),
    ({"residual.pair_scale_on": "test"}, "residual.pair_scale_on='test'"),
    ({"residual.guard_family": "holm"}, "residual.guard_family='holm'"),
])
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, override)


def test_with_overrides_copies_and_checks_like_a_loaded_config():
    from solaris.config import with_overrides

    base = load_config(None, {"cache.num_shards": 3})
    got = with_overrides(base, {"cache.read_ttl_s": 3600, "fm.version": "fm-v2"})
    assert (got.cache.read_ttl_s, got.cache.num_shards, got.fm.version) == (3600, 3, "fm-v2")
    assert base.cache.read_ttl_s != 3600  # the original is untouched
    with pytest.raises(ConfigError, match="cache.read_ttl_s"):
        with_overrides(base, {"cache.read_ttl_s": 0})


def test_every_shipped_config_loads():
    """The SOLARIS configs in configs/ build (YAML reads a bare off as False: such a value
    must be quoted); the Serve configs (``applications``) are Serve's to read."""
    from pathlib import Path

    import yaml

    paths = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
    ours = [p for p in paths if "applications" not in (yaml.safe_load(p.read_text()) or {})]
    assert {p.name for p in ours} >= {"default.yaml", "example-causal-fm.yaml"}
    for p in ours:
        load_config(p)
