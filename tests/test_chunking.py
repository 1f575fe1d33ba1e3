"""Index arithmetic on hand-worked examples (spec section 1.5)."""

import torch

from rltok.model.chunking import chunk_indices, gather_up, mean_pool, select

B_SPEC = [1, 0, 0, 1, 0, 0, 0, 1, 0, 1]


def test_spec_example_indices():
    c = chunk_indices(torch.tensor([B_SPEC]))
    assert c.positions.tolist() == [[0, 3, 7, 9]]
    assert c.up.tolist() == [[0, 0, 0, 1, 1, 1, 1, 2, 2, 3]]
    assert c.down.tolist() == [[0, 1, 1, 1, 2, 2, 2, 2, 3, 3]]
    assert c.counts.tolist() == [4]
    assert c.valid.tolist() == [[True] * 4]


def test_select_and_gather_up_values():
    h = torch.arange(10, dtype=torch.float32).view(1, 10, 1)
    c = chunk_indices(torch.tensor([B_SPEC]))
    z = select(h, c)
    assert z.view(-1).tolist() == [0.0, 3.0, 7.0, 9.0]
    back = gather_up(z * 10, c)  # bytes 0-2 get chunk 0, 3-6 chunk 1, 7-8 chunk 2, 9 chunk 3
    assert back.view(-1).tolist() == [0, 0, 0, 30, 30, 30, 30, 70, 70, 90]


def test_mean_pool_by_hand():
    h = torch.arange(10, dtype=torch.float32).view(1, 10, 1)
    c = chunk_indices(torch.tensor([B_SPEC]))
    pooled = mean_pool(h, c).view(-1).tolist()
    assert pooled == [0.0, (1 + 2 + 3) / 3, (4 + 5 + 6 + 7) / 4, (8 + 9) / 2]


def test_ragged_batch_is_right_padded():
    b = torch.tensor([[1, 0, 0, 0, 0, 1], [1, 1, 0, 1, 1, 1]])
    c = chunk_indices(b)
    assert c.counts.tolist() == [2, 5]
    assert c.positions.shape == (2, 5)
    assert c.positions[0, :2].tolist() == [0, 5] and c.valid[0].tolist() == [True, True, False, False, False]
    assert c.positions[1].tolist() == [0, 1, 3, 4, 5]
    h = torch.randn(2, 6, 3)
    z = select(h, c)
    assert torch.all(z[0, 2:] == 0)  # padding chunks are zero vectors
    assert torch.equal(z[1, 2], h[1, 3])


def test_all_boundaries_and_only_forced():
    all_b = torch.ones(1, 7, dtype=torch.long)
    c = chunk_indices(all_b)
    assert c.positions.tolist() == [list(range(7))] and c.up.tolist() == [list(range(7))]
    only = torch.tensor([[1, 0, 0, 0, 0, 0, 1]])
    c = chunk_indices(only)
    assert c.positions.tolist() == [[0, 6]] and c.up.tolist() == [[0, 0, 0, 0, 0, 0, 1]]


def test_pad_multiple_rounds_chunk_count():
    c = chunk_indices(torch.tensor([B_SPEC]), pad_multiple=8)
    assert c.positions.shape == (1, 8) and c.counts.tolist() == [4]
    assert c.valid.sum().item() == 4


def test_boundary_counts_by_hand():
    """Rate, whitespace recall/precision and word-start recall on a hand-worked string."""
    from rltok.objectives import boundary_counts, ratios

    text = b"ab cd  ef"
    ids = torch.tensor([list(text)])
    # boundaries:   a b _ c d _ _ e f   (forced first and last)
    b = torch.tensor([[1, 0, 1, 1, 0, 0, 1, 0, 1]], dtype=torch.bool)
    valid = torch.ones_like(b)
    decided = valid.clone()
    decided[:, 0] = decided[:, -1] = False
    r = ratios(boundary_counts(ids, b, valid, decided))
    assert r["rate"] == 5 / 9
    assert r["whitespace_recall"] == 2 / 3  # spaces at 2, 5, 6; boundaries at 2 and 6
    assert r["whitespace_precision"] == 2 / 3  # decided boundaries at 2, 3, 6
    assert r["word_start_recall"] == 1 / 2  # word starts: c (3) yes, e (7) no
