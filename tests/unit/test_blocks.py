"""``blockwise``: fixed-size blocks give the rows' results in order, every call the same shape."""

from __future__ import annotations

import torch

from solaris.models.blocks import blockwise


def test_blocks_keep_the_rows_in_order_and_every_call_one_shape():
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3)
    x = torch.randn(23, 6)
    ids = torch.arange(23)
    shapes: list[int] = []

    def fn(b):
        shapes.append(b["x"].shape[0])
        return {"id": b["id"], "y": lin(b["x"])}

    with torch.no_grad():
        d = blockwise(fn, {"x": x, "id": ids}, 8)
        assert shapes == [8, 8, 8]  # 23 rows: two full blocks and one padded
        assert torch.equal(d["id"], ids)
        torch.testing.assert_close(d["y"], lin(x), rtol=1e-6, atol=1e-6)
        a, b = blockwise(lambda b: (b["x"] * 2, b["id"]), {"x": x, "id": ids}, 8)  # a tuple
        assert torch.equal(a, x * 2) and torch.equal(b, ids)
        # a row's result is the same wherever it sits
        shifted = blockwise(lambda b: lin(b["x"]), {"x": x[5:]}, 8)
        rows = blockwise(lambda b: lin(b["x"]), {"x": x}, 8)
        assert shifted.shape == (18, 3) and torch.equal(shifted, rows[5:])
        shapes.clear()
        blockwise(fn, {"x": x, "id": ids}, 0)  # 0: one call as given
        assert shapes == [23]
