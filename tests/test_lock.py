"""requirements/lock.txt and lock-lang.txt (written by scripts/lock.sh) agree with pyproject.toml.

The README's install and CI install exactly the locks; people who install planlang into their own
environment get pyproject.toml's ranges. These tests fail when the two drift apart: a dependency
added to pyproject.toml but not locked, a pin outside its declared range, a lock without hashes, or
the language lock picking a version the full lock does not have."""
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
REQ = ROOT / "requirements"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
META = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins(path: Path) -> dict[str, Version]:
    pins = {}
    for line in path.read_text().splitlines():
        m = PIN.match(line)
        if m:
            pins[canonicalize_name(m[1])] = Version(m[2])
    return pins


def _declared(*extras: str) -> list[Requirement]:
    reqs = list(META["project"]["dependencies"]) + list(META["build-system"]["requires"])
    for extra in extras:
        reqs += META["project"]["optional-dependencies"][extra]
    return [Requirement(r) for r in reqs]


ALL_EXTRAS = tuple(META["project"]["optional-dependencies"])
LOCKS = {"lock.txt": ALL_EXTRAS, "lock-lang.txt": ("dev",)}  # lock -> the extras it installs


@pytest.mark.parametrize("lock, req", [(lock, r) for lock, extras in LOCKS.items() for r in _declared(*extras)],
                         ids=str)
def test_every_declared_dependency_is_pinned_within_its_range(lock, req):
    pins = _pins(REQ / lock)
    name = canonicalize_name(req.name)
    assert name in pins, f"{req} is declared in pyproject.toml but not pinned in {lock}: run ./scripts/lock.sh"
    assert req.specifier.contains(pins[name], prereleases=True), (
        f"{lock} pins {name}=={pins[name]}, outside pyproject.toml's {req}: run ./scripts/lock.sh")


def test_the_language_lock_has_no_torch_and_agrees_with_the_full_lock():
    full, lang = _pins(REQ / "lock.txt"), _pins(REQ / "lock-lang.txt")
    assert "torch" not in lang and "numpy" not in lang
    assert {n: v for n, v in lang.items() if full.get(n) != v} == {}


def test_lock_constraints_are_what_the_lock_pins():
    full = _pins(REQ / "lock.txt")
    for name, version in _pins(REQ / "lock-constraints.txt").items():
        assert full.get(name) == version, f"{name}: lock-constraints says {version}, the lock {full.get(name)}"


@pytest.mark.parametrize("lock", LOCKS)
def test_every_pin_carries_a_hash_and_nothing_is_unpinned(lock):
    # pip install --require-hashes refuses a lock where any requirement lacks one; say which here.
    text = (REQ / lock).read_text()
    blocks = [b for b in re.split(r"\n(?=[^\s#])", text) if b.strip() and not b.startswith("#")]
    assert blocks and all(PIN.match(b) and "--hash=sha256:" in b for b in blocks), blocks
    assert text.startswith("#") and "./scripts/lock.sh" in text[:400]  # pip-compile's header names the command
