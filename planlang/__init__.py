"""planlang: a declarative language and toolchain for distributed-training plans."""
__version__ = "0.1.0"
