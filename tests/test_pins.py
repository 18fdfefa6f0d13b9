"""Dependency ranges and the lock.

pyproject.toml declares compatible ranges; constraints.txt (the lock: the whole dependency tree,
`make lock`) holds the exact versions memstream was verified against, and every install of the
project uses it (`pip install -c constraints.txt ...`: Makefile, Dockerfile). Checked here:
every line of the lock is an exact pin, every direct dependency (runtime and test extras) is
pinned within its range, and the installed versions are the pins.

The Faust and aiokafka internals memstream relies on (docs/state-and-failures.md, streams/runtime/checkpoint.py,
streams/runtime/rebalance.py) were read in, and verified against, exactly the pinned versions: another
installed version must fail loudly here, before anything subtler fails elsewhere.
"""

from __future__ import annotations

import tomllib
from importlib import metadata

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from .conftest import ROOT

CONSTRAINTS = ROOT / "constraints.txt"
# whose internals the worker uses: a different version needs a re-read, not just a green suite
INTERNALS = {"faust-streaming", "aiokafka", "rocksdict", "confluent-kafka", "fastavro"}


class LockError(ValueError):
    """A constraints.txt line that is not one exact pin; the message names the line."""


def read_pins(text: str, source: str = "constraints.txt") -> dict[NormalizedName, Version]:
    """The exact pins of a constraints file: `name==version` per line, comments and blank lines
    allowed; a range, a wildcard, extras, a marker, a URL or a name pinned twice is an error."""
    pins: dict[NormalizedName, Version] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise LockError(f"{source}:{n}: {exc}") from None
        specs = list(req.specifier)
        if (req.extras or req.marker or req.url or len(specs) != 1 or specs[0].operator != "=="
                or "*" in specs[0].version):
            raise LockError(f"{source}:{n}: not one exact pin (name==version): {line}")
        name = canonicalize_name(req.name)
        if name in pins:
            raise LockError(f"{source}:{n}: {req.name} pinned twice")
        pins[name] = Version(specs[0].version)
    return pins


def direct_requirements() -> list[Requirement]:
    """Every requirement pyproject.toml declares: the runtime dependencies and every extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return [Requirement(r) for r in [*project["dependencies"], *(r for group in extras.values() for r in group)]]


PINS = read_pins(CONSTRAINTS.read_text())
DIRECT = direct_requirements()


@pytest.mark.parametrize("line", [
    "fastavro>=1.13,<2", "fastavro", "fastavro==1.*", "confluent-kafka[avro]==2.16.1",
    "numpy==2.4.6; python_version < '3.12'", "not a requirement", "x==1 @ y",
])
def test_a_lock_line_that_is_not_one_exact_pin_is_refused_naming_the_line(line):
    with pytest.raises(LockError, match=r"^c\.txt:2: "):
        read_pins(f"# header\n{line}\n", "c.txt")


def test_a_name_pinned_twice_is_refused_whatever_its_spelling():
    with pytest.raises(LockError, match=r"c\.txt:2: Faust_Streaming pinned twice"):
        read_pins("faust-streaming==0.15.3\nFaust_Streaming==0.15.3\n", "c.txt")


def test_a_lock_reads_as_normalized_names_and_versions():
    assert read_pins("# lock\n\nFaust_Streaming==0.15.3  # comment\nnumpy==2.4.6\n") == {
        "faust-streaming": Version("0.15.3"), "numpy": Version("2.4.6")}


def test_the_lock_pins_the_whole_tree_not_only_the_direct_dependencies():
    direct = {canonicalize_name(r.name) for r in DIRECT}
    transitive = set(PINS) - direct
    # e.g. Faust's own dependencies (mode-streaming, ...): present so an install is repeatable
    assert "mode-streaming" in transitive, sorted(transitive)


@pytest.mark.parametrize("req", DIRECT, ids=lambda r: r.name)
def test_every_direct_dependency_is_pinned_within_its_range(req):
    name = canonicalize_name(req.name)
    assert str(req.specifier), f"{req.name} has no version range in pyproject.toml"
    assert name in PINS, f"{req.name} ({req}) has no pin in constraints.txt: run `make lock`"
    assert req.specifier.contains(PINS[name], prereleases=True), (
        f"constraints.txt pins {req.name}=={PINS[name]}, outside its range in pyproject.toml ({req.specifier})")


@pytest.mark.parametrize("dist", sorted(PINS))
def test_installed_version_is_the_pinned_one(dist):
    try:
        installed = Version(metadata.version(dist))
    except metadata.PackageNotFoundError:
        pytest.fail(f"{dist} is pinned in constraints.txt but not installed: `make` installs with `-c constraints.txt`")
    why = (" its internals (rebalance, commit, changelog and store behaviour) may differ; re-read them before "
           "changing the pin" if dist in INTERNALS else
           " install with `pip install -c constraints.txt`, or record an upgrade with `make lock`")
    assert installed == PINS[dist], f"{dist} {installed} is installed but constraints.txt pins {PINS[dist]}:{why}"


def test_every_install_of_the_project_uses_the_lock():
    """The Makefile's venv (so `make test`, `.ci/run`) and the Docker image install with the lock;
    the image installs the built wheel, not an editable checkout."""
    makefile = (ROOT / "Makefile").read_text()
    stamp = makefile.split("\n$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert "constraints.txt" in stamp.splitlines()[0], "the venv must be rebuilt when the lock changes"
    assert "pip install --quiet -c constraints.txt -e '.[test,bench]'" in stamp
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-cache-dir -c /tmp/constraints.txt /tmp/wheels/memstream-*.whl" in dockerfile
    assert " -e " not in dockerfile
