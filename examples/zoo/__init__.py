"""Architectures people bring, built from small configs (no downloads), for the model-zoo conformance
tests (tests/model/test_zoo.py, tests/runtime/test_zoo_gloo.py) and bench/model_zoo.py. One module per
loss: planlang takes a model's loss from its factory module's `loss`."""
