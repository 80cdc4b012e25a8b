"""planlang.plan.optimizers (the torch-free table PL506 checks optimizer arguments with) against the torch
classes the runtime builds: every name the table accepts is in the class's signature, every value it
accepts constructs the class, and values just outside its bounds are refused by the class too."""
from __future__ import annotations

import inspect

import pytest
import torch

from planlang.plan.optimizers import ARGUMENTS, IMPLIED, argument_problems
from planlang.plan.types import OPTIMIZERS
from planlang.runtime.zero import TORCH_OPTIMIZERS, optimizer_class


def test_every_plan_optimizer_has_a_table_and_a_class():
    assert set(ARGUMENTS) == set(OPTIMIZERS) == set(TORCH_OPTIMIZERS)
    for name, implied in IMPLIED.items():
        assert TORCH_OPTIMIZERS[name][1] == implied


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_table_names_are_in_the_class_signature(name):
    cls, _ = optimizer_class(name)
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    assert set(ARGUMENTS[name]) <= accepted, set(ARGUMENTS[name]) - accepted


def _build(name, kwargs):
    """The class over one parameter, stepped twice (some values pass the constructor and fail a step:
    SGD reads `dampening` from its second step on)."""
    cls, defaults = optimizer_class(name)
    p = torch.nn.Parameter(torch.ones(2))
    opt = cls([p], **{**defaults, **kwargs})
    for _ in range(2):
        p.grad = torch.ones(2)
        opt.step()
    return opt


def _samples(arg):
    """Values the table accepts (the bound itself, a value inside) and values just outside its bounds."""
    if arg.kind == "bool":
        return [True, False], [1, "yes"]
    low = 0.0 if arg.low is None else arg.low
    inside = [low + 0.5] if arg.high is None else [low, (low + arg.high) / 2]
    if not arg.open_low:
        inside.append(low)
    outside = ["fast"]
    if arg.low is not None:
        outside.append(low if arg.open_low else low - 0.5)
    if arg.high is not None:
        outside.append(arg.high)
    if arg.kind == "pair":
        return [(v, v) for v in inside], [inside[0]] + [(v, inside[0]) for v in outside[1:]]
    return inside, outside


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_accepted_values_construct_and_refused_ones_do_not(name):
    for key, arg in ARGUMENTS[name].items():
        if key == "nesterov":
            continue  # depends on momentum and dampening: the test below
        good, bad = _samples(arg)
        extra = {"momentum": 0.9} if key == "dampening" else {}  # read only with momentum
        for v in good:
            assert not argument_problems(name, ((key, v),)), (key, v)
            _build(name, {**extra, key: v})
        for v in bad:  # (negative ones too: plans cannot write them, but the bounds are torch's)
            assert argument_problems(name, ((key, v),)), (key, v)
            if arg.kind != "bool":  # torch takes 1 for a flag; the table asks for true/false
                with pytest.raises((ValueError, TypeError, IndexError)):
                    _build(name, {**extra, key: v})


def test_unknown_argument_and_nesterov_without_momentum():
    assert "takes no argument `momentum`" in argument_problems("adamw", (("momentum", 0.9),))[0][0]
    assert argument_problems("sgd", (("nesterov", True),))
    assert not argument_problems("momentum", (("nesterov", True),))  # momentum 0.9 implied
    assert argument_problems("momentum", (("nesterov", True), ("dampening", 0.1)))
    with pytest.raises(ValueError):
        _build("sgd", {"nesterov": True})
    _build("momentum", {"nesterov": True})
