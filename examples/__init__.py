"""Example models and plans of planlang.

Each subpackage with a ``model.py`` holds a plain PyTorch model with a ``build(**kwargs)`` factory,
an ``example_inputs(...)`` helper and a ``loss(output, *targets)`` helper; plans refer to the
factories as ``"examples.<name>.model:build"``.
"""
