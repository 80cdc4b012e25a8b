"""validation.collector_paused: the cyclic collector is off during a validation's model work and back as the
caller had it afterwards, also when the work raises."""
from __future__ import annotations

import gc

import pytest

from planlang.model.validation import collector_paused


def test_the_collector_is_off_inside_and_restored_after():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("the model's code failed")
    assert gc.isenabled()


def test_a_caller_that_turned_it_off_keeps_it_off():
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
