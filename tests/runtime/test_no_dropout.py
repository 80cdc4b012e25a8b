"""planlang.runtime.no_dropout, without processes: every dropout form runs as the identity inside
`dropout_off()` and is counted; attention's `dropout_p` becomes 0; nothing changes outside it, nor for a
dropout that is already off (p = 0, not training)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from planlang.runtime.no_dropout import dropout_off, is_off

aten = torch.ops.aten


def test_every_dropout_form_is_the_identity_and_counted():
    torch.manual_seed(0)
    x = torch.randn(6, 8, requires_grad=True)
    with dropout_off() as seen:
        assert is_off()
        outs = [F.dropout(x, 0.5), F.dropout(x, p=0.2, training=True), torch.nn.Dropout(0.1)(x),
                torch.dropout(x, 0.3, True), aten.dropout.default(x, 0.3, True), F.alpha_dropout(x, 0.2, True),
                aten.native_dropout.default(x, 0.4, True)[0]]
        kept = aten.native_dropout.default(x, 0.4, True)[1]
    assert not is_off()
    assert seen.calls == 8
    assert all(torch.equal(o, x) for o in outs) and bool(kept.all())
    outs[0].sum().backward()  # the identity's gradient
    assert torch.equal(x.grad, torch.ones_like(x))


def test_attention_dropout_probability_becomes_zero():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with dropout_off() as seen:
        by_keyword = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
        by_position = F.scaled_dot_product_attention(q, k, v, None, 0.5, True)
        by_aten = aten.scaled_dot_product_attention.default(q, k, v, None, 0.5, True)
    assert seen.calls == 3
    for got in (by_keyword, by_position, by_aten):
        torch.testing.assert_close(got, plain)


def test_dropout_already_off_and_outside_are_left_alone():
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    with dropout_off() as seen:
        assert torch.equal(F.dropout(x, 0.5, training=False), x)
        assert torch.equal(F.dropout(x, 0.0), x)
    assert seen.calls == 0
    dropped = F.dropout(x, 0.5)  # outside: a real draw
    assert not torch.equal(dropped, x) and bool((dropped == 0).any())
