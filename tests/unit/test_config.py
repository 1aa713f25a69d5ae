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
    ({"residual.present_affine": "test"}, "residual.present_affine='test'"),
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


# options removed once their default had won: (key, a value an old config may hold, the note)
OLD_OPTIONS = [
    ("residual.guard_family", "per_input", "docs/results/2026-12-03-replay-guard-family.md"),
    ("residual.train_verifier", "base", "docs/results/2026-12-04-replay-presence-signal.md"),
    ("residual.pair_scale_on", "served", "docs/results/2026-12-03-replay-pair-scale-on.md"),
    ("residual.pair_gate_on", "served_delta",
     "docs/results/2026-12-04-replay-own-pair-gate.md"),
    ("queue.merge", "later", "docs/results/2026-12-02-speculation-policies-merge-earlier.md"),
]


def _nested(dotted: dict) -> dict:
    out: dict = {}
    for key, value in dotted.items():
        section, name = key.split(".")
        out.setdefault(section, {})[name] = value
    return out


def test_the_removed_options_are_the_table_of_their_notes():
    import dataclasses
    from pathlib import Path

    from solaris.config import REMOVED

    root = Path(__file__).resolve().parents[2]
    assert {k: note for k, (_, note) in REMOVED.items()} == {k: n for k, _, n in OLD_OPTIONS}
    for key, (_, note) in REMOVED.items():
        assert (root / note).is_file(), note
        section, name = key.split(".")
        assert name not in {f.name for f in dataclasses.fields(getattr(SolarisConfig(), section))}


@pytest.mark.parametrize("key, old, note", OLD_OPTIONS)
def test_a_config_that_sets_a_removed_option_is_refused_with_its_note(key, old, note,
                                                                      tmp_path):
    from solaris.config import REMOVED, config_from_dict, parse_overrides, with_overrides

    want = rf"{key}='{old}': the option was removed, '{REMOVED[key][0]}' is always the " \
           rf"behaviour \(its result: {note}\)"
    with pytest.raises(ConfigError, match=want):  # --set KEY=VALUE
        load_config(None, parse_overrides([f"{key}={old}"]))
    p = tmp_path / "c.yaml"
    p.write_text(f"{key.split('.')[0]}:\n  {key.split('.')[1]}: {old}\n")
    with pytest.raises(ConfigError, match=want):  # a YAML file
        load_config(p)
    with pytest.raises(ConfigError, match=want):
        config_from_dict(_nested({key: old}))
    with pytest.raises(ConfigError, match=want):
        with_overrides(SolarisConfig(), {key: old})
    # even set to the behaviour it now always has: the key is gone
    with pytest.raises(ConfigError, match=f"{key}=.*the option was removed"):
        load_config(None, {key: REMOVED[key][0]})


def test_a_stored_config_with_removed_options_still_loads(tmp_path, caplog):
    """An artifact's manifest and a finished run's replay-config.yaml embed the whole config
    of the version that wrote them: the removed options they hold are ignored (a value other
    than today's behaviour is logged), while an override naming one is refused."""
    import copy
    import json
    import logging

    import yaml

    from solaris.artifacts import Artifacts
    from solaris.config import REMOVED, config_from_dict, config_to_dict

    cfg = load_config(None, {"encoder.width": 8, "queue.capacity": 77})
    old = config_to_dict(cfg)
    for key, value, _ in OLD_OPTIONS:
        section, name = key.split(".")
        old[section][name] = value
    kept = copy.deepcopy(old)
    with caplog.at_level(logging.WARNING, logger="solaris.config"):
        assert config_from_dict(old, stored=True) == cfg
    assert old == kept  # the stored dict itself is left as it was
    for key, value, _ in OLD_OPTIONS:
        assert f"{key}={value!r} is a removed option" in caplog.text
    # an artifact manifest written by an older version (solaris train stores its config)
    art = tmp_path / "art"
    art.mkdir()
    (art / "manifest.json").write_text(json.dumps({
        "schema": 2, "version": "v-old", "tasks": ["click"], "vms": {"click": {"file": "x.pt"}},
        "sizes": {"num_users": 4, "num_items": 4}, "config": old}))
    assert Artifacts.open(art).config == cfg
    # a finished replay's replay-config.yaml
    p = tmp_path / "replay-config.yaml"
    p.write_text(yaml.safe_dump(old, sort_keys=False))
    assert load_config(p, stored=True) == cfg
    got = load_config(p, {"queue.capacity": 5}, stored=True)
    assert got.queue.capacity == 5
    with pytest.raises(ConfigError, match="queue.merge='later': the option was removed"):
        load_config(p, {"queue.merge": "later"}, stored=True)
    with pytest.raises(ConfigError, match="the option was removed"):
        load_config(p)  # read as a user's config: refused by name
    # a stored config at today's behaviour loads without a word
    caplog.clear()
    same = config_to_dict(cfg)
    for key, (now, _) in REMOVED.items():
        section, name = key.split(".")
        same[section][name] = now
    with caplog.at_level(logging.WARNING, logger="solaris.config"):
        assert config_from_dict(same, stored=True) == cfg
    assert "removed option" not in caplog.text
