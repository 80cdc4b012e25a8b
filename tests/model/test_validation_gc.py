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


@pytest.mark.parametrize("before", [True, False])
def test_importing_the_model_layer_leaves_the_collector_as_it_was(before):
    """validation and program_memory load torch with the collector off (parser.no_cycle_collection) and
    leave it as the importer had it."""
    import subprocess
    import sys

    code = ("import gc\n" + ("" if before else "gc.disable()\n")
            + "import planlang.model.validation, planlang.runtime.program_memory\n"
            + f"assert gc.isenabled() is {before}\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
