"""planlang: a declarative language and toolchain for distributed-training plans.

The public API for training scripts is `planlang.apply(model, plan)` (see docs/byom.md): the model
under the plan on this rank; `planlang.save(pm, optimizer, dir)` / `planlang.load(...)` its
distributed checkpoints (docs/runtime.md); `planlang.PlanTrainer` Hugging Face's Trainer under a plan
(docs/hf_trainer.md). They are imported on first use, so `import planlang` stays torch-free and
the language tools (check, lint, fmt, explain, the language server) start without torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from planlang.lang.version import __version__
__all__ = ["apply", "save", "load", "PlanError", "PlanTrainer", "__version__"]

if TYPE_CHECKING:  # for type checkers and editors; at run time these come from __getattr__
    from planlang.runtime.apply import PlanError, apply
    from planlang.runtime.hf_trainer import PlanTrainer
    from planlang.runtime.save_load import load, save

# public name -> the module that defines it (imported when the name is first read)
_LAZY = {"apply": "planlang.runtime.apply", "PlanError": "planlang.runtime.apply",
         "save": "planlang.runtime.save_load", "load": "planlang.runtime.save_load",
         "PlanTrainer": "planlang.runtime.hf_trainer"}  # transformers and accelerate load with it


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'planlang' has no attribute {name!r}")

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
