"""requirements/lock.txt (written by scripts/lock.sh) agrees with pyproject.toml.

The README's install and CI install exactly the lock; people who install planlang into their own
environment get pyproject.toml's ranges. These tests fail when the two drift apart: a dependency
added to pyproject.toml but not locked, a pin outside its declared range, a lock without hashes."""
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def _pins(path: Path) -> dict[str, Version]:
    pins = {}
    for line in path.read_text().splitlines():
        m = PIN.match(line)
        if m:
            pins[canonicalize_name(m[1])] = Version(m[2])
    return pins


def _declared() -> list[Requirement]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(meta["project"]["dependencies"]) + list(meta["build-system"]["requires"])
    for extra in meta["project"].get("optional-dependencies", {}).values():
        reqs += extra
    return [Requirement(r) for r in reqs]


LOCKED = _pins(LOCK)


@pytest.mark.parametrize("req", _declared(), ids=str)
def test_every_declared_dependency_is_pinned_within_its_range(req):
    name = canonicalize_name(req.name)
    assert name in LOCKED, f"{req} is declared in pyproject.toml but not pinned: run ./scripts/lock.sh"
    assert req.specifier.contains(LOCKED[name], prereleases=True), (
        f"the lock pins {name}=={LOCKED[name]}, outside pyproject.toml's {req}: run ./scripts/lock.sh")


def test_lock_constraints_are_what_the_lock_pins():
    for name, version in _pins(ROOT / "requirements" / "lock-constraints.txt").items():
        assert LOCKED.get(name) == version, f"{name}: lock-constraints says {version}, the lock {LOCKED.get(name)}"


def test_every_pin_carries_a_hash():
    # pip install --require-hashes refuses a lock where any pin lacks one; say which here.
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text())
    missing = [b.split()[0] for b in blocks if PIN.match(b) and "--hash=sha256:" not in b]
    assert not missing


def test_the_lock_is_written_by_the_script():
    assert "./scripts/lock.sh" in LOCK.read_text()[:400]  # pip-compile's header names the command
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert "--require-hashes -r requirements/lock.txt" in install
