"""SOLARIS frames (``solaris.wire``): every field comes back with its dtype, shape and bits;
foreign bytes, another kind and truncated frames are refused by name; the structured frames
(impressions, history windows, leases, score requests) round-trip; and no module on a path
between the project's processes imports pickle."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from solaris import wire
from solaris.cache.query import Slots
from solaris.config import HistoryConfig
from solaris.errors import RequestError
from solaris.history import WINDOW_KEYS, HistoryStore
from solaris.precompute.pqueue import Group, Lease
from solaris.online.scoring import (PackedSlots, ScoreRequest, decode_score_request, decode_scores,
                             encode_score_request, encode_scores)

ROOT = Path(__file__).resolve().parents[2]

arrays = st.sampled_from(wire.DTYPES).flatmap(lambda dt: hnp.arrays(
    dt, hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=5)))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                    st.floats(allow_nan=True), st.text(max_size=12))


@settings(max_examples=150, deadline=None, database=None)
@given(fields=st.lists(st.one_of(arrays, scalars), max_size=8))
def test_any_fields_round_trip_bit_for_bit(fields):
    back = wire.decode(wire.encode("pairs", fields), "pairs", len(fields))
    assert len(back) == len(fields)
    for f, b in zip(fields, back):
        if isinstance(f, np.ndarray):
            assert b.dtype == f.dtype and b.shape == f.shape
            assert b.tobytes() == np.ascontiguousarray(f).tobytes()  # NaNs and -0.0 too
            assert not b.flags.writeable
        elif isinstance(f, float):
            assert type(b) is float and np.float64(b).tobytes() == np.float64(f).tobytes()
        else:
            assert type(b) is type(f) and b == f


def test_non_contiguous_and_big_endian_arrays_keep_their_values():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]
    b = np.arange(3, dtype=">f8")
    x, y = wire.decode(wire.encode("pairs", [a, b]), "pairs")
    assert np.array_equal(x, a) and np.array_equal(y, b) and y.dtype == np.dtype("<f8")


@pytest.mark.parametrize("field, message", [
    (np.zeros((2, 2, 2)), "pairs field 0: ndarray float64 cannot go in a frame"),
    (np.array(["a"]), "pairs field 0: ndarray <U1 cannot go in a frame"),
    (np.zeros(2, np.uint64), "ndarray uint64 cannot go in a frame"),
    ({"a": 1}, "pairs field 0: dict"),
])
def test_what_cannot_go_in_a_frame_is_named(field, message):
    with pytest.raises(TypeError, match=message):
        wire.encode("pairs", [field])


def test_foreign_other_kind_and_truncated_frames_are_refused():
    frame = wire.encode("labels", (3, np.arange(4), np.ones((4, 1), np.int8), 5.0))
    with pytest.raises(RequestError, match="impressions: got a labels frame"):
        wire.decode(frame, "impressions")
    with pytest.raises(RequestError, match="labels: 4 fields, expected 5"):
        wire.decode(frame, "labels", 5)
    with pytest.raises(RequestError, match="labels: truncated frame"):
        wire.decode(frame[:-8], "labels")
    with pytest.raises(RequestError, match="not a SOLARIS frame"):
        wire.decode(b"\x01" * 64, "labels")
    with pytest.raises(RequestError, match="expected a frame \\(bytes\\), got dict"):
        wire.decode({"a": 1}, "labels")
    with pytest.raises(ValueError, match="frame kind 'nope'"):
        wire.encode("nope", [])


def test_the_frame_layout_is_fixed_byte_for_byte():
    """The layout of the module docstring, spelled out: a faster encoder may not change it."""
    i64 = lambda *v: np.array(v, "<i8").tobytes()  # noqa: E731
    frame = wire.encode("labels", (np.array([[1, 2, 3]], np.int8), 2.5, "ab", None, True, 7))
    assert frame == b"".join([
        i64(wire.MAGIC, wire.KINDS["labels"], 6),
        i64(4, 2, 1, 3), i64(102, 0, int(np.float64(2.5).view("<i8")), 0), i64(100, 1, 2, 0),
        i64(0, -1, 0, 0), i64(103, 0, 1, 0), i64(101, 0, 7, 0),
        bytes([1, 2, 3]) + b"\0" * 5, b"ab" + b"\0" * 6])


def test_writable_buffers_decode_to_read_only_views_and_bad_specs_are_refused():
    frame = wire.encode("pairs", (np.arange(3), "text", np.zeros((0, 4), np.float32)))
    for buf in (bytearray(frame), memoryview(frame), memoryview(bytearray(frame))):
        a, t, e = wire.decode(buf, "pairs", 3)
        assert a.tolist() == [0, 1, 2] and t == "text" and e.shape == (0, 4)
        assert not a.flags.writeable and not e.flags.writeable
    head = np.frombuffer(frame, "<i8").copy()
    head[3 + 2] = -1  # the first array's length
    with pytest.raises(RequestError, match="pairs: bad field spec"):
        wire.decode(head.tobytes(), "pairs")
    head = np.frombuffer(frame, "<i8").copy()
    head[3 + 4 + 2] = 10 ** 6  # the text's length, past the frame's end
    with pytest.raises(RequestError, match="pairs: truncated frame"):
        wire.decode(head.tobytes(), "pairs")


def test_impressions_frame_round_trips_many_requests():
    records = [(3, np.array([5, 6, 7]), np.array(2), 10.0),  # one surface for all
               (4, np.array([], np.int64), 1, 11.0),
               (3, np.array([8]), np.array([0]), 12.5)]
    back = wire.decode_impressions(wire.encode_impressions(records))
    assert [(u, i.tolist(), s.tolist(), t) for u, i, s, t in back] == [
        (3, [5, 6, 7], [2, 2, 2], 10.0), (4, [], [], 11.0), (3, [8], [0], 12.5)]
    assert wire.decode_impressions(wire.encode_impressions([])) == []


def test_history_window_frame_round_trips_a_real_window():
    h = HistoryStore(HistoryConfig())
    h.record_impressions(1, np.array([4, 5]), 2, 100.0)
    h.record_labels(1, np.array([5]), np.array([[1, 0]]), 101.0)
    w = h.window(np.array([1, 9]), np.array([200.0, 200.0]), 3)
    back = wire.decode_window(wire.encode_window(w, WINDOW_KEYS), WINDOW_KEYS)
    assert list(back) == list(WINDOW_KEYS)
    for k in WINDOW_KEYS:
        assert back[k].dtype == w[k].dtype and np.array_equal(back[k], w[k]), k


def test_lease_frame_round_trips_its_groups():
    lease = Lease("L7", [Group(3, 100.0, 1, "fm1", np.array([9, 4]), np.array([0.9, 0.5]), 7.5),
                         Group(5, 101.0, 0, "fm2", np.array([2]), np.array([0.1]))], 400.0)
    back = Lease.from_frame(lease.to_frame())
    assert (back.lease_id, back.deadline, back.num_pairs) == ("L7", 400.0, 3)
    for a, b in zip(lease.groups, back.groups):
        assert (a.user, a.now, a.surface, a.version) == (b.user, b.now, b.surface, b.version)
        assert np.array_equal(a.items, b.items) and np.array_equal(a.priorities, b.priorities)
        assert np.float64(a.queued_at).tobytes() == np.float64(b.queued_at).tobytes()  # NaN too
        assert b.items.flags.writeable  # as the queue leases them
    assert back.read_at is None
    assert Lease.from_frame(Lease("L0", [], 1.0).to_frame()).groups == []
    assert Lease.from_frame(Lease("L1", lease.groups, 1.0, 460.0).to_frame()).read_at == 460.0


def test_score_request_frame_carries_the_slots_exactly():
    rng = np.random.default_rng(0)
    c, d = 6, 4
    present = np.array([1, 0, 1, 0, 0, 1], bool)
    slots = Slots(pair_emb=rng.random((c, d)).astype(np.float32) * present[:, None],
                  pair_present=present, pair_tier=np.array([1, 0, 2, 0, 0, 3]),
                  pair_age_s=rng.random(c) * present, agg_emb=np.tile(
                      rng.random(d).astype(np.float32), (c, 1)), agg_present=np.ones(c, bool),
                  missing=~present)
    slots.agg_emb[2] += 1  # one candidate's aggregate differs
    req = ScoreRequest(7, np.arange(c) * 3, 2, PackedSlots.pack(slots), np.ones((2, 4)))
    version, back = decode_score_request(encode_score_request("v1", req))
    assert (version, back.user, back.surface) == ("v1", 7, 2)
    assert np.array_equal(back.items, req.items) and np.array_equal(back.scales, req.scales)
    a, b = req.slots.unpack(), back.slots.unpack()
    for name in a.__dataclass_fields__:
        assert getattr(a, name).dtype == getattr(b, name).dtype, name
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    _, alone = decode_score_request(encode_score_request("v1", ScoreRequest(7, req.items, 2,
                                                                            None, None)))
    assert alone.slots is None and alone.scales is None  # the VM alone stays the VM alone
    s = rng.random((2, c))
    assert np.array_equal(decode_scores(encode_scores(s)), s)


# the modules whose code runs on either side of a call between the project's processes
CROSSING = ["serve_app.py", *sorted(str(p.relative_to(ROOT)) for d in ("serve", "actors")
                                    for p in (ROOT / d).glob("*.py")),
            "solaris/wire.py", "solaris/cache/wire.py", "solaris/online/scoring.py"]


@pytest.mark.parametrize("path", CROSSING)
def test_no_pickle_between_processes(path):
    """Nothing the project sends between its processes is pickled by the project itself:
    no module on either side of a call imports pickle (or cloudpickle)."""
    tree = ast.parse((ROOT / path).read_text(), path)
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            assert "pickle" not in name, f"{path}:{node.lineno} imports {name}"
