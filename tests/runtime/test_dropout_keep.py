"""The runtime's dropout mask (planlang.runtime.local_ops.dropout_keep): each device draws only the piece of
the global mask it holds, and that piece equals the same elements of the whole mask drawn in one process."""
import torch

from planlang.runtime.local_ops import dropout_keep, dropout_mask


def test_a_piece_is_the_same_elements_of_the_whole_mask():
    whole = dropout_mask((4, 6, 8), 0.25, seed=11)
    for piece in [(slice(0, 2), slice(0, 6), slice(0, 8)), (slice(2, 4), slice(3, 6), slice(4, 8)),
                  (slice(1, 2), slice(0, 6), slice(2, 6))]:
        assert torch.equal(dropout_keep((4, 6, 8), piece, 0.25, 11), whole[piece])


def test_the_mask_keeps_one_minus_p_and_depends_on_the_seed():
    a, b = dropout_mask((1 << 18,), 0.1, seed=1), dropout_mask((1 << 18,), 0.1, seed=2)
    assert abs(a.float().mean().item() - 0.9) < 0.005
    assert not torch.equal(a, b) and torch.equal(a, dropout_mask((1 << 18,), 0.1, seed=1))
    assert dropout_mask((1000,), 0.0, 3).all() and not dropout_mask((1000,), 1.0, 3).any()


def test_a_piece_of_an_output_too_large_to_draw_whole():
    # Megatron's 1T attention probabilities for one microbatch: 3072 x 160 x 2048 x 2048 elements (2e12,
    # past 2^32: the high bits of the index count); a tensor-parallel piece of it is drawn alone
    shape = (3072, 160, 2048, 2048)
    piece = (slice(5, 6), slice(20, 21), slice(0, 2048), slice(1024, 1152))
    keep = dropout_keep(shape, piece, 0.1, seed=5)
    assert keep.shape == (1, 1, 2048, 128) and abs(keep.float().mean().item() - 0.9) < 0.01
    # the same elements reached from another piece that overlaps them
    wider = dropout_keep(shape, (slice(5, 7), slice(20, 21), slice(0, 2048), slice(1024, 1152)), 0.1, seed=5)
    assert torch.equal(wider[:1], keep)
