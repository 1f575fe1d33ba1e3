"""The stage parts (model/dc.py) on hand-worked examples: each part's ``step`` and its prefill
state agree with its ``forward``, position by position."""

import pytest
import torch

from rltok.boundaries.base import BoundaryOutput
from rltok.model.chunking import chunk_indices
from rltok.model.dc import AddLatest, EMASmooth, MeanPool, SelectLast, ema_loop

B_EX = [1, 0, 0, 1, 0, 0, 0, 1, 0, 1]  # model/chunking.py's example: chunks {0},{1,2,3},{4..7},{8,9}


def _out(b, probs=None):
    b = torch.tensor([b], dtype=torch.bool)
    return BoundaryOutput(hard=b.float(), decided=torch.ones_like(b), probs=probs), chunk_indices(b)


def test_mean_pool_by_hand_and_its_steps():
    h = torch.arange(10.0)[None, :, None]  # h_t = t
    out, ch = _out(B_EX)
    z = MeanPool()(h, out, ch)
    assert z[0, :, 0].tolist() == [0.0, 2.0, 5.5, 8.5]  # means of {0}, {1,2,3}, {4..7}, {8,9}
    state, got = None, []
    for t, bt in enumerate(B_EX):
        zt, state = MeanPool().step(h[:, t], torch.tensor([bool(bt)]), state)
        if bt:
            got.append(float(zt[0, 0]))
    assert got == [0.0, 2.0, 5.5, 8.5]
    # after 6 positions the open chunk is {4, 5}: sum 9, count 2
    st = MeanPool().prefill_state(h, out, torch.tensor([6]))
    assert float(st.total[0, 0]) == 9.0 and float(st.count[0]) == 2.0
    zt, _ = MeanPool().step(h[:, 6], torch.tensor([True]), st)  # closing at 6 would give mean(4,5,6)
    assert float(zt[0, 0]) == 5.0


def test_select_last_and_add_latest_by_hand():
    h = torch.arange(10.0)[None, :, None]
    out, ch = _out(B_EX)
    assert SelectLast()(h, out, ch)[0, :, 0].tolist() == [0.0, 3.0, 7.0, 9.0]
    zhat = torch.tensor([[[100.0], [200.0], [300.0], [400.0]]])
    u = AddLatest()(h, zhat, out, ch)[0, :, 0]
    # up = [0,0,0,1,1,1,1,2,2,3]: byte t reads the latest chunk ended at or before t
    assert u.tolist() == [100.0, 101.0, 102.0, 203.0, 204.0, 205.0, 206.0, 307.0, 308.0, 409.0]
    assert AddLatest().prefill_pending(zhat, out, ch, torch.tensor([5]))[0, 0] == 200.0
    assert AddLatest(deviation=True).chunk_output(zhat, zhat - 1)[0, 0, 0] == 1.0


def test_ema_smooth_steps_equal_its_forward():
    """merge at each closing chunk reproduces the EMA over chunks; prefill_pending is the EMA at
    the chunk the last prefilled byte reads."""
    g = torch.Generator().manual_seed(0)
    probs = torch.rand(1, 10, generator=g)
    out, ch = _out(B_EX, probs)
    zhat = torch.randn(1, 4, 3, generator=g)
    P = probs[0, [0, 3, 7, 9]].clamp(1e-4, 1 - 1e-4)
    ref = ema_loop(zhat, P[None])
    dech = EMASmooth(block=2)
    u = dech(torch.zeros(1, 10, 3), zhat, out, ch)
    torch.testing.assert_close(u[0, [0, 3, 7, 9]], ref[0], atol=1e-6, rtol=1e-5)
    pending = torch.zeros(1, 3)
    for c, t in enumerate([0, 3, 7, 9]):
        pending = dech.merge(pending, zhat[:, c], probs[:, t])
        torch.testing.assert_close(pending, ref[:, c], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(dech.prefill_pending(zhat, out, ch, torch.tensor([8])), ref[:, 2], atol=1e-6, rtol=1e-5)


def test_row_helpers_on_a_nested_state_by_hand():
    import dataclasses

    from rltok.boundaries.base import assign_rows, select_rows, where_rows

    @dataclasses.dataclass
    class St:
        a: torch.Tensor
        rest: dict
        tag: str = "kept"

    state = St(a=torch.arange(3.0), rest={"l": [torch.arange(6).view(3, 2), None]})
    rows = torch.tensor([2, 0])
    sub = select_rows(state, rows)
    assert sub.a.tolist() == [2.0, 0.0] and sub.rest["l"][0].tolist() == [[4, 5], [0, 1]]
    assert sub.rest["l"][1] is None and sub.tag == "kept"
    back = assign_rows(state, rows, St(a=torch.tensor([20.0, 0.5]), rest={"l": [-sub.rest["l"][0], None]}))
    assert back.a.tolist() == [0.5, 1.0, 20.0]
    assert back.rest["l"][0].tolist() == [[0, -1], [2, 3], [-4, -5]]
    assert state.a.tolist() == [0.0, 1.0, 2.0]  # not in place
    mask = torch.tensor([True, False, True])
    mixed = where_rows(mask, back, state)
    assert mixed.a.tolist() == [0.5, 1.0, 20.0] and mixed.rest["l"][0].tolist() == [[0, -1], [2, 3], [-4, -5]]
    mixed = where_rows(~mask, back, state)
    assert mixed.a.tolist() == [0.0, 1.0, 2.0] and mixed.rest["l"][0][1].tolist() == [2, 3]
    assert where_rows(mask, back, None) is back and assign_rows(state, rows, None) is state
    # rows for a part the state lacks are refused, not dropped: at the top and nested alike
    with pytest.raises(ValueError, match="does not exist"):
        assign_rows(None, rows, sub)
    with pytest.raises(ValueError, match="does not exist"):
        assign_rows(state, rows, St(a=sub.a, rest={"l": [sub.rest["l"][0], torch.zeros(2, 1)]}))
