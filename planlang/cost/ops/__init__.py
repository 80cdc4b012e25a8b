"""The op registry (torch-free): every op kind's sharding rule and its memory and cost facts (`OpKind`).
Importing this package registers every rule module."""
from . import rules, tensor_ops  # noqa: F401  (registers the rules)
from .base import OpKind, OpSpec, Strategy, Targets, UnknownOp, on, op_kind, registry, rule, strategies  # noqa: F401

__all__ = ["OpKind", "OpSpec", "Strategy", "Targets", "UnknownOp", "on", "op_kind", "registry", "rule", "strategies"]
