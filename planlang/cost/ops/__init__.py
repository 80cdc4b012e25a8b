"""Op sharding rules (torch-free). Importing this package registers every rule module."""
from . import rules  # noqa: F401  (registers the rules)
from .base import OpSpec, Strategy, UnknownOp, registry, rule, strategies  # noqa: F401

__all__ = ["OpSpec", "Strategy", "UnknownOp", "registry", "rule", "strategies"]
