"""The deployment's id map (solaris/ids.py): raw ids coded by appearance, never by value; a
map extended, never renumbered, across logs and FM versions; the wire's raw ids translated,
an unknown one given a stable provisional code."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from solaris.data.columns import appearance_vocab, extend_vocab
from solaris.data.export import export_generic
from solaris.data.generic import ColumnMapping, load_generic, load_generic_yaml
from solaris.errors import DataError, RequestError
from solaris.history import HistoryStore
from solaris.config import HistoryConfig
from solaris.ids import (MAX_CODE, PROVISIONAL_BASE, IdMap, SideIds, deployment_ids,
                         provisional_code)

MAPPING = ColumnMapping(user="uid", item="iid", timestamp="t", labels={"click": "click"})


def log_table(days: range, new_from: int = 99) -> pa.Table:
    """Users u0..u5 (u6, u7 only from day ``new_from``), items i0..i4 (+ i9 then), one
    event per user and day, in an order that is not the ids' sorted order and rotates daily."""
    rows = []
    for d in days:
        base = ["u5", "u0", "u3", "u1", "u4", "u2"]
        users = base[d % 6:] + base[:d % 6] + (["u7", "u6"] if d >= new_from else [])
        for k, u in enumerate(users):
            item = f"i{(d + k) % 5}" if not (d >= new_from and k == 0) else "i9"
            rows.append({"uid": u, "iid": item, "t": d * 100 + k, "click": (d + k) % 2})
    return pa.Table.from_pylist(rows)


def write(tmp_path, table: pa.Table, name: str) -> str:
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path)
    return str(path)


def test_vocabularies_follow_appearance_and_only_grow() -> None:
    assert appearance_vocab(pa.array(["b", "a", "b", "c", "a"])).to_pylist() == ["b", "a", "c"]
    assert extend_vocab(pa.array(["z", "a"]), pa.array(["b", "a", "z", "c"])).to_pylist() \
        == ["z", "a", "b", "c"]
    assert extend_vocab(None, pa.array([3, 1, 3])).to_pylist() == [3, 1]


def test_codes_come_from_the_log_order_not_the_values(tmp_path) -> None:
    ds = load_generic(write(tmp_path, log_table(range(3)), "a"), MAPPING)
    assert ds.users.column("raw_id").to_pylist() == ["u5", "u0", "u3", "u1", "u4", "u2"]
    # a re-key that does not keep the values' order codes every row the same
    rekey = {f"u{k}": f"user-{(7 * k) % 10}" for k in range(8)}
    t = log_table(range(3))
    t = t.set_column(0, "uid", pa.array([rekey[u] for u in t.column("uid").to_pylist()]))
    other = load_generic(write(tmp_path, t, "b"), MAPPING)
    assert other.interactions.equals(ds.interactions)
    assert other.users.column("raw_id").to_pylist() == \
        [rekey[u] for u in ds.users.column("raw_id").to_pylist()]


def test_a_later_log_extends_the_map_and_never_renumbers(tmp_path) -> None:
    """v1 trains on days 0-9; v2 on days 5-14, where u6, u7 and i9 arrive. Without the map
    the window's own first appearances renumber users; with it each old id keeps its code."""
    v1 = load_generic(write(tmp_path, log_table(range(0, 10)), "v1"), MAPPING)
    m1 = IdMap.from_dataset(v1)
    later = write(tmp_path, log_table(range(5, 15), new_from=8), "v2")
    fresh = IdMap.from_dataset(load_generic(later, MAPPING))
    assert fresh.users.raw.to_pylist()[:6] != m1.users.raw.to_pylist()  # renumbered
    v2 = load_generic(later, MAPPING, ids=m1)
    m2 = IdMap.from_dataset(v2)
    m2.check_extends(m1, "v2")  # every code kept
    assert m2.users.raw.to_pylist() == [*m1.users.raw.to_pylist(), "u7", "u6"]
    assert m2.items.raw.to_pylist()[-1] == "i9" and len(m2.items) == len(m1.items) + 1
    with pytest.raises(DataError, match="does not extend the earlier one.*code 0 was 'u5'"):
        fresh.check_extends(m1, "v2")
    # a map of the other kind of id is refused, naming the column
    ints = IdMap.of(pa.array([5, 0, 3]), pa.array([1, 2]))
    with pytest.raises(DataError, match="'uid'.*id map holds int64 ids"):
        load_generic(later, MAPPING, ids=ints)


def test_a_rollover_hands_no_users_history_or_neighbours_to_another(tmp_path) -> None:
    """The history store and the KNN tables are keyed by codes: filled under v1's map, read
    under v2's (new users and items arrived), each raw user finds their own events, and
    their neighbours decode to the same raw users."""
    m1 = IdMap.from_dataset(load_generic(write(tmp_path, log_table(range(0, 10)), "v1"),
                                         MAPPING))
    v2 = load_generic(write(tmp_path, log_table(range(5, 15), new_from=8), "v2"), MAPPING,
                      ids=m1)
    m2 = deployment_ids([("v1", m1), ("v2", IdMap.from_dataset(v2))])
    store = HistoryStore(HistoryConfig(max_users=100, max_events=16))
    for k, raw in enumerate(m1.users.raw.to_pylist()):  # each user saw item k at t=10+k
        user = int(m1.users.codes([raw], "user_id")[0])
        item = m1.items.codes([f"i{k % 5}"], "items")
        store.record_impressions(user, item, 0, 10.0 + k)
    # neighbours published under v1: each user's next user in v1's code order
    nbr_v1 = {c: (c + 1) % len(m1.users) for c in range(len(m1.users))}
    for k, raw in enumerate(m1.users.raw.to_pylist()):
        code = int(m2.users.codes([raw], "user_id")[0])
        win = store.window(np.array([code]), np.array([1e6]), 4)
        assert win["item"][0, 0] == m2.items.codes([f"i{k % 5}"], "items")[0]
        assert win["ts"][0, 0] == 10.0 + k
        assert m2.raw_user(nbr_v1[code]) == m1.raw_user(nbr_v1[code])
    for raw in ("u6", "u7"):  # the new users have codes past v1's and no history yet
        code = int(m2.users.codes([raw], "user_id")[0])
        assert code >= len(m1.users)
        assert not store.window(np.array([code]), np.array([1e6]), 4)["valid"].any()
    with pytest.raises(DataError, match="codes would change hands"):
        deployment_ids([("v2", IdMap.from_dataset(v2)), ("v1", IdMap.of(
            pa.array(["u0", "u5"]), m1.items.raw))])


def test_wire_ids_translate_and_unknown_ids_get_stable_provisional_codes() -> None:
    m = IdMap.of(pa.array(["b", "a"]), pa.array([30, 10, 20]))
    assert m.users.codes(["a", "b"], "user_id").tolist() == [1, 0]
    assert m.items.codes([20, 30], "candidates").tolist() == [2, 0]
    unknown = m.users.codes(["new-user", "other"], "user_id")
    assert (unknown >= PROVISIONAL_BASE).all() and (unknown < MAX_CODE).all()
    assert unknown[0] != unknown[1] and unknown[0] == provisional_code("new-user")
    assert m.items.codes([7], "items")[0] == provisional_code(7) != provisional_code("7")
    for bad, field, match in ((["a", 1], "user_id", "users ids here are strings, got int"),
                              ([""], "user_id", "1..256 characters")):
        with pytest.raises(RequestError, match=f"^{field}: .*{match}"):
            m.users.codes(bad, field)
    with pytest.raises(RequestError, match="^items: items ids here are integers, got str"):
        m.items.codes(["30"], "items")
    # the identity (the synthetic default, artifacts without a map): integers pass through
    ident = IdMap.identity(3, 4)
    assert ident.users.identity and ident.users.codes([2, 10**12], "user_id").tolist() == \
        [2, 10**12]
    with pytest.raises(RequestError, match="in \\[0, 2\\*\\*62\\]"):
        ident.items.codes([-5], "candidates")
    assert ident.raw_items(np.array([3, 0])) == [3, 0]
    assert m.raw_items(np.array([2, 0])) == [20, 30] and m.raw_user(1) == "a"


def test_the_map_saves_and_loads_beside_artifacts(tmp_path) -> None:
    m = IdMap.of(pa.array(["b", "a"]), pa.array([30, 10, 20]))
    m.save(tmp_path)
    back = IdMap.load(tmp_path)
    assert back.users.raw.equals(m.users.raw) and back.items.raw.equals(m.items.raw)
    assert IdMap.load(tmp_path / "ids").users.raw.equals(m.users.raw)
    assert IdMap.load(tmp_path / "nothing") is None
    with pytest.raises(DataError, match="id map holds an id twice"):
        SideIds("users", pa.array(["a", "a"])).codes(["a"], "user_id")


def test_an_exported_dataset_reads_back_with_its_codes(tmp_path) -> None:
    """``solaris export``'s side tables list ids in code order, so its log reads back with
    the native codes; a string re-key of it (rows kept) reads back the same rows."""
    ds = load_generic(write(tmp_path, log_table(range(4)), "x"), MAPPING)
    path = export_generic(ds, tmp_path / "export")
    back = load_generic_yaml(path)
    assert back.interactions.equals(ds.interactions)
    assert back.users.column("raw_id").equals(ds.users.column("raw_id"))


def test_keeping_an_earlier_versions_vms_needs_its_codes_and_no_new_ids(tmp_path) -> None:
    """``--keep-vm-alone``: the kept VMs alone have rows for the earlier version's ids only,
    so a log whose map renumbers them, or that brought new ids, is refused before training."""
    from types import SimpleNamespace

    from solaris.errors import ConfigError
    from solaris.train.artifacts import check_keeps

    m1 = IdMap.from_dataset(load_generic(write(tmp_path, log_table(range(0, 10)), "v1"),
                                         MAPPING))
    base = SimpleNamespace(root=tmp_path / "v1", ids=lambda: m1, num_users=len(m1.users),
                           num_items=len(m1.items))
    same = load_generic(write(tmp_path, log_table(range(3, 12)), "same"), MAPPING, ids=m1)
    check_keeps(base, same, IdMap.from_dataset(same), tmp_path / "v2")  # no new ids: kept
    grown = load_generic(write(tmp_path, log_table(range(5, 15), new_from=8), "v2"), MAPPING,
                         ids=m1)
    with pytest.raises(ConfigError, match="rows for 6 users and 5 items, the data 8 and 6"):
        check_keeps(base, grown, IdMap.from_dataset(grown), tmp_path / "v2")
    fresh = load_generic(write(tmp_path, log_table(range(5, 15)), "v3"), MAPPING)
    with pytest.raises(DataError, match="codes would change hands"):
        check_keeps(base, fresh, IdMap.from_dataset(fresh), tmp_path / "v3")
