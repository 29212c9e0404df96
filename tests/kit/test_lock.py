"""The node environment's lock (app/requirements/node.lock, `make lock`): every package pinned with its hashes, and
every requirement of node.in in it at a version node.in allows."""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.cluster import staging

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "app" / "requirements"


def direct_requirements(path: Path) -> Iterator[Requirement]:
    """A pip requirements file's requirements, those of the files it includes with `-r` too."""
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            yield from direct_requirements(path.parent / line[3:].strip())
        elif line:
            yield Requirement(line)


def locked() -> dict[str, tuple[Requirement, list[str]]]:
    entries = [(Requirement(requirement), options) for requirement, options in staging.read_lock()]
    names = [canonicalize_name(req.name) for req, _ in entries]
    assert len(set(names)) == len(names), "a package locked twice"
    return dict(zip(names, entries))


def test_every_locked_package_is_pinned_to_one_version_with_its_hashes() -> None:
    entries = locked()
    assert "torch" in entries and "nvidia-cudnn-cu12" in entries and "triton" in entries
    for name, (req, options) in entries.items():
        assert [spec.operator for spec in req.specifier] == ["=="] and not req.extras and not req.url, name
        assert options and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", option) for option in options), name


def test_the_direct_requirements_are_locked_at_versions_they_allow() -> None:
    entries = locked()
    for req in direct_requirements(REQUIREMENTS / "node.in"):
        name = canonicalize_name(req.name)
        assert name in entries, f"{req.name} is in node.in but not in node.lock: run `make lock`"
        version = str(next(iter(entries[name][0].specifier)).version)
        assert req.specifier.contains(version), f"node.lock has {req.name} {version}, node.in wants {req.specifier}"


def test_the_lock_has_none_of_the_excluded_packages() -> None:
    excluded = [req.name for req in direct_requirements(REQUIREMENTS / "node-excluded.txt")]
    assert excluded
    assert not set(excluded) & set(locked())
