"""MovieLens (RecBole + GroupLens), generic Parquet/CSV loader and the fetch cache, on small files."""

from __future__ import annotations

import random
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from solaris.data.fetch import FetchError, default_cache_dir, extract_ml100k, fetch_movielens
from solaris.data.generic import ColumnMapping, FeatureColumns, load_generic, load_generic_yaml
from solaris.data.movielens import AGE_BUCKETS, GENRES, load_movielens
from solaris.data.schema import Dataset, interaction_schema
from solaris.errors import ConfigError, DataError

INTER_HEADER = ["user_id:token", "item_id:token", "rating:float", "timestamp:float"]
USER_HEADER = ["user_id:token", "age:token", "gender:token", "occupation:token", "zip_code:token"]
ITEM_HEADER = ["item_id:token", "movie_title:token_seq", "release_year:token", "class:token_seq"]

USERS = [
    ("1", "24", "M", "technician", "85711"),
    ("2", "53", "F", "other", "94043"),
    ("9", "17", "M", "student", "T8H1N"),  # Canadian zip -> "other"
    ("10", "56", "F", "writer", "02139"),
    ("3", "18", "M", "writer", "32067"),
    ("7", "25", "F", "student", "55105"),  # no ratings: still gets a code
]
ITEMS = [
    ("1", "Toy Story", "1995", "Animation Children's Comedy"),
    ("2", "GoldenEye", "1995", "Thriller Action Adventure"),  # genre order differs from the flags
    ("5", "unkonwn", "unkonwn", "unknown"),  # RecBole's own spelling of a missing year
    ("11", "Land Before Time III (1995)", "V", "Animation Children's"),  # year from the title
    ("12", "Nosferatu", "1922", "Horror"),
    ("20", "Side Only", "1977", "Drama Romance"),  # never rated
]
INTER = [  # user, item, rating, timestamp; several ties on the timestamp
    ("1", "1", "5", "100"), ("1", "2", "3", "100"), ("10", "1", "4", "100"), ("9", "1", "1", "100"),
    ("2", "5", "4", "90"), ("2", "11", "2", "200"), ("3", "12", "5", "150"), ("10", "2", "4.0", "150"),
    ("9", "12", "4", "150"), ("1", "11", "5", "300"), ("3", "1", "3", "300"), ("10", "11", "5", "300"),
]


def write_recbole(root: Path, inter=INTER, users=USERS, items=ITEMS, prefix: str = "ml-100k",
                  inter_header=INTER_HEADER) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    files = (("inter", inter_header, inter), ("user", USER_HEADER, users), ("item", ITEM_HEADER, items))
    for ext, header, rows in files:
        lines = ["\t".join(header)] + ["\t".join(r) for r in rows]
        (root / f"{prefix}.{ext}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def recbole_to_grouplens(src: Path, dst: Path, prefix: str = "ml-100k") -> Path:
    """Rewrite RecBole atomic files as GroupLens' u.data / u.user / u.item (test-only converter)."""
    def rows(ext: str) -> tuple[list[str], list[list[str]]]:
        lines = (src / f"{prefix}.{ext}").read_text(encoding="utf-8").splitlines()
        return [h.split(":")[0] for h in lines[0].split("\t")], [ln.split("\t") for ln in lines[1:] if ln]

    dst.mkdir(parents=True, exist_ok=True)
    names, data = rows("inter")
    cols = [names.index(c) for c in ("user_id", "item_id", "rating", "timestamp")]
    (dst / "u.data").write_text("".join("\t".join(r[c] for c in cols) + "\n" for r in data))
    names, data = rows("user")
    cols = [names.index(c) for c in ("user_id", "age", "gender", "occupation", "zip_code")]
    (dst / "u.user").write_text("".join("|".join(r[c] for c in cols) + "\n" for r in data))
    names, data = rows("item")
    out = []
    for r in data:
        rec = dict(zip(names, r))
        year = rec["release_year"]
        date = f"01-Jan-{year}" if len(year) == 4 and year.isdigit() else ""
        genres = set(rec["class"].split())
        flags = ["1" if g in genres else "0" for g in GENRES]
        out.append("|".join([rec["item_id"], rec["movie_title"], date, "", "http://x/"] + flags) + "\n")
    (dst / "u.item").write_bytes("".join(out).encode("latin-1"))
    return dst


def assert_same(a: Dataset, b: Dataset) -> None:
    assert a.name == b.name and a.tasks == b.tasks and a.spec == b.spec
    for part in ("interactions", "users", "items"):
        ta, tb = getattr(a, part), getattr(b, part)
        assert ta.schema == tb.schema, part
        assert ta.equals(tb), part


def column(ds_table: pa.Table, name: str) -> list:
    return ds_table.column(name).to_pylist()


# ----------------------------------------------------------------------------- MovieLens


def test_recbole_and_grouplens_load_identically(tmp_path):
    rb = load_movielens(write_recbole(tmp_path / "rb"))
    gl = load_movielens(recbole_to_grouplens(tmp_path / "rb", tmp_path / "gl" / "ml-100k"))
    assert_same(rb, gl)
    assert rb.name == "ml-100k"
    assert rb.interactions.schema == interaction_schema(("like", "love"))
    assert rb.requests is None


def test_movielens_labels_and_surface(tmp_path):
    ds = load_movielens(write_recbole(tmp_path))
    inter = ds.interactions
    assert ds.tasks == ("like", "love")
    users = column(ds.users, "raw_id")
    items = column(ds.items, "raw_id")
    rating = {(u, i): float(r) for u, i, r, _ in INTER}
    for u, i, like, love in zip(column(inter, "user_id"), column(inter, "item_id"),
                                column(inter, "like"), column(inter, "love")):
        r = rating[(str(users[u]), str(items[i]))]
        assert like == float(r >= 4) and love == float(r == 5)
    assert set(column(inter, "surface")) == {0} and ds.spec.num_surfaces == 1
    assert inter.column("like").type == pa.float32()


def test_movielens_codes_follow_sorted_raw_ids(tmp_path):
    ds = load_movielens(write_recbole(tmp_path))
    assert column(ds.users, "raw_id") == [1, 2, 3, 7, 9, 10]  # numeric order, side-only user 7 kept
    assert column(ds.users, "user_id") == list(range(6))
    assert column(ds.items, "raw_id") == [1, 2, 5, 11, 12, 20]
    assert ds.num_items == 6 and ds.interactions.num_rows == len(INTER)


def test_movielens_tie_order_is_by_user_then_item_raw_id(tmp_path):
    ds = load_movielens(write_recbole(tmp_path))
    users, items = column(ds.users, "raw_id"), column(ds.items, "raw_id")
    got = [(t, users[u], items[i]) for t, u, i in zip(column(ds.interactions, "ts"),
                                                         column(ds.interactions, "user_id"),
                                                         column(ds.interactions, "item_id"))]
    want = sorted((int(t), int(u), int(i)) for u, i, _, t in INTER)
    assert got == want
    assert got[1:5] == [(100, 1, 1), (100, 1, 2), (100, 9, 1), (100, 10, 1)]
    assert column(ds.interactions, "seq") == list(range(len(INTER)))


def test_movielens_shuffled_rows_give_identical_dataset(tmp_path):
    base = load_movielens(write_recbole(tmp_path / "a"))
    rng = random.Random(0)
    for k in range(3):
        inter, users, items = list(INTER), list(USERS), list(ITEMS)
        rng.shuffle(inter), rng.shuffle(users), rng.shuffle(items)
        assert_same(base, load_movielens(write_recbole(tmp_path / f"s{k}", inter, users, items, prefix="ml-100k")))


def test_movielens_features(tmp_path):
    ds = load_movielens(write_recbole(tmp_path))
    spec = ds.spec
    assert spec.user_categorical == {"age_bucket": 7, "gender": 2, "occupation": 4, "zip_region": 11}
    assert spec.user_continuous == ("age",) and spec.item_continuous == ("release_year",)
    assert spec.item_categorical == {"release_decade": 4}  # unknown, 1920s, 1970s, 1990s
    # Action Adventure Animation Children's Comedy Drama Horror Romance Thriller unknown
    assert spec.item_multihot == {"genres": 10}
    u = ds.users.to_pydict()  # raw ids 1, 2, 3, 7, 9, 10 with ages 24, 53, 18, 25, 17, 56
    assert [AGE_BUCKETS[b] for b in u["age_bucket"]] == ["18-24", "50-55", "18-24", "25-34", "<18", "56+"]
    assert u["zip_region"] == [8, 9, 3, 5, 10, 0]
    assert u["gender"] == [1, 0, 1, 0, 1, 0]  # F < M
    age = np.array([24, 53, 18, 25, 17, 56], dtype=np.float64)
    np.testing.assert_allclose(u["age"], (age - age.mean()) / age.std(), rtol=1e-5)
    it = ds.items.to_pydict()  # raw ids 1, 2, 5, 11, 12, 20
    assert it["release_decade"] == [3, 3, 0, 3, 1, 2]
    year = np.array([1995, 1995, np.nan, 1995, 1922, 1977])
    known = year[~np.isnan(year)]
    want = np.where(np.isnan(year), 0.0, (year - known.mean()) / known.std())
    np.testing.assert_allclose(it["release_year"], want, rtol=1e-5, atol=1e-6)
    vocab = sorted({g for *_, c in ITEMS for g in c.split()})
    assert it["genres"][1] == sorted(vocab.index(g) for g in ("Action", "Adventure", "Thriller"))
    assert it["genres"][2] == [vocab.index("unknown")]
    assert ds.items.column("genres").type == pa.list_(pa.int64())


def test_movielens_accepts_any_prefix_and_genre_column(tmp_path):
    write_recbole(tmp_path, prefix="ml-tiny")
    item = tmp_path / "ml-tiny.item"
    item.write_text(item.read_text().replace("class:token_seq", "genre:token_seq"))
    ds = load_movielens(tmp_path)
    assert ds.name == "ml-tiny" and ds.spec.item_multihot == {"genres": 10}


def _raises(path: Path, *fragments: str) -> None:
    with pytest.raises(DataError) as info:
        load_movielens(path)
    for f in fragments:
        assert f in str(info.value), (f, str(info.value))


def test_missing_header_column_names_file_and_column(tmp_path):
    write_recbole(tmp_path, inter=[r[:3] for r in INTER], inter_header=INTER_HEADER[:3])
    _raises(tmp_path, "ml-100k.inter", "'timestamp'")


def test_non_numeric_rating_names_file_column_and_line(tmp_path):
    inter = list(INTER)
    inter[3] = ("9", "1", "five", "100")
    write_recbole(tmp_path, inter=inter)
    _raises(tmp_path, "ml-100k.inter", "'rating'", "line 5", "'five'")


def test_unknown_user_in_inter_names_file_and_column(tmp_path):
    write_recbole(tmp_path, inter=INTER + [("99", "1", "3", "400")])
    _raises(tmp_path, "ml-100k.inter", "'user_id'", "line 14", "99 is not in ml-100k.user")


def test_unknown_item_in_inter_names_file_and_column(tmp_path):
    write_recbole(tmp_path, inter=INTER + [("1", "404", "3", "400")])
    _raises(tmp_path, "ml-100k.inter", "'item_id'", "404")


def test_truncated_row_names_file_line_and_missing_column(tmp_path):
    write_recbole(tmp_path, inter=INTER[:4] + [("1", "5", "3")] + INTER[4:])
    _raises(tmp_path, "ml-100k.inter", "'timestamp'", "line 6")


def test_duplicate_side_table_id(tmp_path):
    write_recbole(tmp_path, users=USERS + [USERS[0]])
    _raises(tmp_path, "ml-100k.user", "'user_id'", "more than once")


def test_non_integer_age(tmp_path):
    users = list(USERS)
    users[2] = ("9", "", "M", "student", "T8H1N")
    write_recbole(tmp_path, users=users)
    _raises(tmp_path, "ml-100k.user", "'age'", "line 4")


def test_grouplens_errors_name_file_and_column(tmp_path):
    gl = recbole_to_grouplens(write_recbole(tmp_path / "rb"), tmp_path / "gl")
    text = (gl / "u.item").read_text(encoding="latin-1").splitlines()
    text[1] = text[1].rsplit("|", 1)[0] + "|x"  # last flag (Western) not 0/1
    (gl / "u.item").write_text("\n".join(text) + "\n", encoding="latin-1")
    _raises(gl, "u.item", "'Western'", "line 2")
    lines = (gl / "u.user").read_text().splitlines()
    (gl / "u.user").write_text("\n".join(lines[:-1] + ["7|25|F"]) + "\n")
    _raises(gl, "u.user", "'occupation'", f"line {len(lines)}")


def test_not_a_movielens_directory(tmp_path):
    _raises(tmp_path, str(tmp_path), "u.data")
    write_recbole(tmp_path)
    (tmp_path / "ml-100k.user").unlink()
    _raises(tmp_path, "ml-100k.user", "missing")


# ----------------------------------------------------------------------------- generic loader


def _log_table() -> pa.Table:
    return pa.table({
        "uid": ["u1", "u2", "u10", "u1", "u2", "u10", "u1", "u2"],
        "iid": ["b", "a", "c", "a", "c", "b", "c", "b"],
        "t": [10, 10, 10, 20, 20, 30, 30, 40],
        "rating": [5.0, 3.0, 4.0, 1.0, 4.5, 2.0, 5.0, 3.0],
        "click": [1, 0, 1, 0, 1, 0, 1, 1],
        "surface": ["feed", "search", "feed", "feed", "search", "search", "feed", "feed"],
    })


MAPPING = ColumnMapping(
    user="uid", item="iid", timestamp="t", labels={"click": "click", "like": ("rating", 4)}, surface="surface",
    user_features=FeatureColumns(categorical=("country",), continuous=("age",)),
    item_features=FeatureColumns(categorical=("brand",), continuous=("price",),
                                 multihot={"tags": None, "tags_str": "|"}),
)


def _write_generic(root: Path, log: pa.Table, fmt: str) -> tuple[Path, Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    users = pa.table({"uid": ["u2", "u1", "u10", "u3"], "country": ["de", "fr", "de", "us"],
                      "age": [30.0, None, 50.0, 40.0]})
    items = pa.table({"iid": ["c", "a", "b", "d"], "brand": ["x", None, "y", "x"], "price": [1.0, 2.0, None, 3.0],
                      "tags": [["k", "j"], None, ["j"], []], "tags_str": ["j|k", "", "j", None]})
    pacsv.write_csv(users, root / "users.csv")
    pq.write_table(items, root / "items.parquet")
    path = root / f"log.{fmt}"
    pq.write_table(log, path) if fmt == "parquet" else pacsv.write_csv(log, path)
    return path, root / "users.csv", root / "items.parquet"


def test_generic_csv_and_parquet_load_identically(tmp_path):
    a = load_generic(*_with_mapping(_write_generic(tmp_path / "csv", _log_table(), "csv")))
    b = load_generic(*_with_mapping(_write_generic(tmp_path / "pq", _log_table(), "parquet")))
    assert_same(a, b)
    assert a.name == "log" and a.tasks == ("click", "like")


def _with_mapping(paths: tuple[Path, Path, Path]) -> tuple:
    log, users, items = paths
    return log, MAPPING, users, items


def test_generic_mapping_codes_labels_and_features(tmp_path):
    ds = load_generic(*_with_mapping(_write_generic(tmp_path, _log_table(), "parquet")))
    # ids coded in the side tables' row order, never by their values
    assert column(ds.users, "raw_id") == ["u2", "u1", "u10", "u3"]
    assert column(ds.items, "raw_id") == ["c", "a", "b", "d"]
    inter = ds.interactions
    users, items = column(ds.users, "raw_id"), column(ds.items, "raw_id")
    rows = [(t, users[u], items[i]) for t, u, i in zip(column(inter, "ts"), column(inter, "user_id"),
                                                         column(inter, "item_id"))]
    assert rows[:3] == [(10, "u2", "a"), (10, "u1", "b"), (10, "u10", "c")]  # ties by code
    src = _log_table().to_pylist()
    by_key = {(r["t"], r["uid"], r["iid"]): r for r in src}
    labels = zip(column(inter, "like"), column(inter, "click"), column(inter, "surface"))
    for key, (like, click, surf) in zip(rows, labels):
        r = by_key[key]
        assert like == float(r["rating"] >= 4) and click == float(r["click"])
        assert surf == ["feed", "search"].index(r["surface"])
    spec = ds.spec
    assert spec.num_surfaces == 2
    assert spec.user_categorical == {"country": 3} and spec.user_continuous == ("age",)
    assert spec.item_categorical == {"brand": 3}  # x, y, then null's own code
    assert spec.item_multihot == {"tags": 2, "tags_str": 2}
    assert column(ds.items, "brand") == [0, 2, 1, 0]  # c, a, b, d
    assert column(ds.items, "tags") == column(ds.items, "tags_str") == [[0, 1], [], [0], []]
    price = column(ds.items, "price")  # c=1, a=2, b=null, d=3
    np.testing.assert_allclose(price, [-np.sqrt(1.5), 0.0, 0.0, np.sqrt(1.5)], rtol=1e-6)  # null -> the mean
    assert column(ds.users, "age")[1] == 0.0  # u1 has no age


def test_generic_shuffled_rows_give_identical_dataset(tmp_path):
    base = load_generic(*_with_mapping(_write_generic(tmp_path / "a", _log_table(), "csv")))
    perm = np.random.default_rng(0).permutation(_log_table().num_rows)
    other = load_generic(*_with_mapping(_write_generic(tmp_path / "b", _log_table().take(perm), "csv")))
    assert_same(base, other)


def test_generic_without_side_tables_and_label_list(tmp_path):
    path = tmp_path / "log.csv"
    pacsv.write_csv(_log_table(), path)
    ds = load_generic(path, ColumnMapping(user="uid", item="iid", timestamp="t", labels=["click"]))
    assert ds.tasks == ("click",) and ds.num_users == 3 and ds.num_items == 3
    assert ds.spec.num_surfaces == 1 and ds.users.column_names == ["user_id", "raw_id"]


def test_generic_null_label_names_file_column_and_row(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("uid,iid,t,click\nu1,a,1,1\nu2,b,2,\nu3,c,3,0\n")
    with pytest.raises(DataError, match=r"log\.csv: column 'click', line 3"):
        load_generic(path, ColumnMapping(user="uid", item="iid", timestamp="t", labels=["click"]))
    log = _log_table().set_column(4, "click", pa.array([1.0, 0.0, float("nan"), 1, 0, 1, 0, 1]))
    pq.write_table(log, tmp_path / "log.parquet")
    with pytest.raises(DataError, match=r"log\.parquet: column 'click', row 2"):
        load_generic(tmp_path / "log.parquet",
                     ColumnMapping(user="uid", item="iid", timestamp="t", labels=["click"]))


def test_generic_bad_inputs(tmp_path):
    path = tmp_path / "log.csv"
    mapping = ColumnMapping(user="uid", item="iid", timestamp="t", labels=["click"])
    path.write_text("uid,iid,t,click\nu1,a,1,1\nu2,b,yesterday,0\n")
    with pytest.raises(DataError, match=r"log\.csv: column 't', line 3: 'yesterday'"):
        load_generic(path, mapping)
    path.write_text("uid,iid,t,click\nu1,a,1,1\nu2,b,2,3\n")
    with pytest.raises(DataError, match=r"column 'click', line 3.*not 0/1"):
        load_generic(path, mapping)
    path.write_text("uid,iid,t,clicked\nu1,a,1,1\n")
    with pytest.raises(DataError, match=r"log\.csv: column 'click' not found"):
        load_generic(path, mapping)
    path.write_text("uid,iid,t,click\nu1,a,1,1\nu2,zz,2,0\n")
    (tmp_path / "items.csv").write_text("iid,brand\na,x\nb,y\n")
    with pytest.raises(DataError, match=r"log\.csv: column 'iid', line 3: 'zz' is not in items\.csv"):
        load_generic(path, mapping, items=tmp_path / "items.csv")
    (tmp_path / "items.json").write_text("{}")
    with pytest.raises(DataError, match="unsupported file type"):
        load_generic(tmp_path / "items.json", mapping)


def test_column_mapping_from_dict_and_checks():
    m = ColumnMapping.from_dict({
        "user": "uid", "item": "iid", "timestamp": "t", "surface": "surface",
        "labels": {"click": "click", "like": ["rating", 4]},
        "user_features": {"categorical": ["country"], "continuous": ["age"]},
        "item_features": {"categorical": ["brand"], "continuous": ["price"],
                          "multihot": {"tags": None, "tags_str": "|"}},
    })
    assert m == MAPPING
    assert m.label_rules() == (("click", "click", None), ("like", "rating", 4.0))
    with pytest.raises(ConfigError, match="unknown"):
        ColumnMapping.from_dict({"user": "u", "item": "i", "timestamp": "t", "labels": ["y"], "extra": 1})
    with pytest.raises(ConfigError, match="labels"):
        ColumnMapping(user="u", item="i", timestamp="t", labels=[])
    with pytest.raises(ConfigError, match="labels"):
        ColumnMapping(user="u", item="i", timestamp="t", labels={"like": ("rating", "4")})
    with pytest.raises(ConfigError, match="items only"):
        ColumnMapping(user="u", item="i", timestamp="t", labels=["y"],
                      user_features=FeatureColumns(multihot={"tags": "|"}))


# ----------------------------------------------------------------------------- fetch


def _fake_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("recbole/dataset_example/ml-100k/ml-100k.inter", "user_id:token\n")
        zf.writestr("recbole/dataset_example/ml-100k/ml-100k.user", "user_id:token\n")
        zf.writestr("recbole/dataset_example/ml-1m/ml-1m.inter", "no\n")
        zf.writestr("recbole/quick_start.py", "no\n")
    return path


def test_extract_takes_only_the_ml100k_files(tmp_path):
    out = extract_ml100k(_fake_wheel(tmp_path / "recbole-1.2.1-py3-none-any.whl"), tmp_path / "out")
    assert sorted(p.name for p in out.iterdir()) == ["ml-100k.inter", "ml-100k.user"]


def test_fetch_uses_the_cache_without_pip(tmp_path):
    (tmp_path / "ml-100k").mkdir()
    (tmp_path / "ml-100k" / "ml-100k.inter").write_text("x")
    assert fetch_movielens(tmp_path, python=str(tmp_path / "no-such-python")) == tmp_path / "ml-100k"


def test_fetch_failure_raises_fetch_error(tmp_path):
    false = shutil.which("false")
    if false is None:
        pytest.skip("no `false` executable to stand in for a failing pip")
    with pytest.raises(FetchError, match="recbole==1.2.1 failed") as info:
        fetch_movielens(tmp_path, python=false)
    assert isinstance(info.value, DataError)
    with pytest.raises(FetchError, match="cannot run"):
        fetch_movielens(tmp_path, python=str(tmp_path / "no-such-python"))
    assert not (tmp_path / "ml-100k").exists()


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SOLARIS_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("SOLARIS_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "solaris"


def test_generic_yaml_file_and_directory(tmp_path):
    log, _, _ = _write_generic(tmp_path, _log_table(), "parquet")
    (tmp_path / "mapping.yaml").write_text(
        "interactions: log.parquet\nusers: users.csv\nitems: items.parquet\n"
        "mapping:\n  user: uid\n  item: iid\n  timestamp: t\n  surface: surface\n"
        "  labels: {click: click, like: [rating, 4]}\n"
        "  user_features: {categorical: [country], continuous: [age]}\n"
        "  item_features: {categorical: [brand], continuous: [price], multihot: {tags: null, tags_str: '|'}}\n")
    direct = load_generic(log, MAPPING, tmp_path / "users.csv", tmp_path / "items.parquet")
    assert_same(load_generic_yaml(tmp_path / "mapping.yaml"), direct)
    assert_same(load_generic_yaml(tmp_path), direct)
    (tmp_path / "bad.yaml").write_text("interactions: log.parquet\n")
    with pytest.raises(DataError, match="bad.yaml"):
        load_generic_yaml(tmp_path / "bad.yaml")
