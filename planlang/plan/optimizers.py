"""The arguments each plan optimizer takes, and the values its torch class accepts (torch-free).

`optimizer adamw(lr = 0.001, betas = [0.9, 0.95])` passes its arguments to the torch class the runtime
builds (planlang.runtime.zero.TORCH_OPTIMIZERS; Lion is planlang.runtime.lion). A name the class does not
take, or a value its constructor refuses, would stop every rank after launch; the checker reports both
from this table instead (PL506). tests/model/test_optimizer_arguments.py keeps the table within the torch
classes' signatures and checks that every value it accepts constructs the class.

Implementation switches (`fused`, `capturable`, `differentiable`) are not plan arguments: the runtime
chooses the implementation for the device it runs on.
"""
from __future__ import annotations

from planlang.lang.frozen import value_type



@value_type
class Arg:
    """One argument: `number` (at least `low`; above it when `open_low`; below `high` when given),
    `bool`, or `pair` (two numbers, each within the same bounds)."""

    kind: str
    low: float | None = 0.0
    open_low: bool = False
    high: float | None = None

    def describe(self) -> str:
        if self.kind == "bool":
            return "true or false"
        bound = ""
        if self.low is not None:
            bound = f"{'>' if self.open_low else '>='} {self.low:g}"
        if self.high is not None:
            bound += (" and " if bound else "") + f"< {self.high:g}"
        what = "two numbers" if self.kind == "pair" else "a number"
        return f"{what}{' ' + bound if bound else ''}{' each' if self.kind == 'pair' and bound else ''}"

    def accepts(self, value: object) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "pair":
            return isinstance(value, tuple) and len(value) == 2 and all(self._number(v) for v in value)
        return self._number(value)

    def _number(self, v: object) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if self.low is not None and (v < self.low or (self.open_low and v == self.low)):
            return False
        return self.high is None or v < self.high


NUM = Arg("number")  # >= 0: learning rates, epsilons, decays, momenta (torch refuses negative ones)
POS = Arg("number", open_low=True)
BOOL = Arg("bool")
BETAS = Arg("pair", 0.0, False, 1.0)
_COMMON = {"maximize": BOOL, "foreach": BOOL}

# plan optimizer name -> argument -> what it accepts (torch 2.x's constructors; Lion: planlang.runtime.lion)
ARGUMENTS: dict[str, dict[str, Arg]] = {
    "sgd": {"lr": NUM, "momentum": NUM, "dampening": Arg("number", None), "weight_decay": NUM,
            "nesterov": BOOL, **_COMMON},
    "adam": {"lr": NUM, "betas": BETAS, "eps": NUM, "weight_decay": NUM, "amsgrad": BOOL,
             "decoupled_weight_decay": BOOL, **_COMMON},
    "adamw": {"lr": NUM, "betas": BETAS, "eps": NUM, "weight_decay": NUM, "amsgrad": BOOL, **_COMMON},
    "adagrad": {"lr": NUM, "lr_decay": NUM, "weight_decay": NUM, "initial_accumulator_value": NUM, "eps": NUM,
                **_COMMON},
    "rmsprop": {"lr": NUM, "alpha": NUM, "eps": NUM, "weight_decay": NUM, "momentum": NUM, "centered": BOOL,
                **_COMMON},
    # beta2_decay must be <= 0 and plans write no negative numbers: only its default is possible
    "adafactor": {"lr": NUM, "d": Arg("number", 1.0), "weight_decay": NUM, **_COMMON},
    "lion": {"lr": POS, "betas": BETAS, "weight_decay": NUM},
}
ARGUMENTS["momentum"] = ARGUMENTS["sgd"]  # SGD with momentum 0.9 unless given

# optimizers that cannot step FSDP2's sharded (DTensor) parameters, which ZeRO-2/3 gives them, and why
NO_FSDP: dict[str, str] = {
    "adafactor": "torch's Adafactor updates its factored second moments in place (`pow_`) on the norms of "
                 "a row and a column, which a sharded DTensor parameter holds as partial sums and cannot update "
                 "in place",
}

# optimizers whose update of a matrix reads the whole matrix (not each element on its own), and how: on a
# piece split over its last two dims (tensor parallelism keeps plain local pieces) they read the piece's
WHOLE_MATRIX: dict[str, str] = {
    "adafactor": "Adafactor factors the second moment of a matrix into the mean of its squared gradient "
                 "over each row and over each column; a rank holding a piece averages the piece's rows and "
                 "columns only, so its update differs from one process's (verify: parameter error 5e-4 "
                 "after one step of HF GPT-2 dp2 x tp2)",
}

# arguments the name implies when the plan does not give them (planlang.runtime.zero.TORCH_OPTIMIZERS)
IMPLIED: dict[str, dict[str, object]] = {"momentum": {"momentum": 0.9}}


def argument_problems(name: str, kwargs: tuple[tuple[str, object], ...]) -> list[tuple[str, str]]:
    """(problem, help) for each argument of `name(kwargs)` its torch class would refuse: unknown names,
    values of the wrong kind or out of range, and SGD's Nesterov without momentum or with dampening."""
    table = ARGUMENTS.get(name)
    if table is None:
        return []  # PL216 reports the name
    out = []
    for key, value in kwargs:
        arg = table.get(key)
        if arg is None:
            out.append((f"`{name}` takes no argument `{key}`", f"`{name}` takes {', '.join(table)}"))
        elif not arg.accepts(value):
            shown = "[" + ", ".join(map(str, value)) + "]" if isinstance(value, tuple) else repr(value) \
                if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
            out.append((f"`{name}` argument `{key} = {shown}`: {key} must be {arg.describe()}",
                        f"write `{key}` as {arg.describe()}"))
    given = {**IMPLIED.get(name, {}), **dict(kwargs)}
    if name in ("sgd", "momentum") and given.get("nesterov") is True:
        momentum, dampening = given.get("momentum", 0), given.get("dampening", 0)
        if not (isinstance(momentum, (int, float)) and momentum > 0 and dampening == 0):
            out.append((f"Nesterov momentum needs momentum > 0 and dampening 0 (momentum {momentum}, "
                        f"dampening {dampening})", "give `momentum = 0.9`, or take `nesterov` away"))
    return out
