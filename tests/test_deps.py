"""The dependency floors sit past known advisories, and constraints.txt (what CI and the
README install through) both satisfies them and is what this environment runs."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version

from conftest import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, ver = line.partition("==")
            out[canonicalize_name(name)] = ver
    return out


def requirements() -> list[Requirement]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = doc["project"]["optional-dependencies"]
    reqs = doc["project"]["dependencies"] + extras["test"] + extras["ray"]
    return [Requirement(r) for r in reqs]


def test_every_requirement_is_pinned_inside_its_range() -> None:
    pinned = pins()
    for req in requirements():
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is not in constraints.txt"
        assert req.specifier.contains(pinned[name], prereleases=True), (req, pinned[name])


def test_floors_are_past_the_known_advisories() -> None:
    floors = {canonicalize_name(r.name): r.specifier for r in requirements()}
    for name, vulnerable in {"jinja2": "3.1.5", "aiohttp": "3.12.13", "h11": "0.15.0",
                             "requests": "2.32.3", "urllib3": "2.4.0"}.items():
        assert not floors[name].contains(vulnerable), f"{name} {vulnerable} still allowed"


def test_this_environment_runs_the_pinned_versions() -> None:
    drift = {}
    for name, ver in pins().items():
        try:
            got = version(name)
        except PackageNotFoundError:
            continue  # e.g. a platform-only dependency
        if got != ver:
            drift[name] = (ver, got)
    assert drift == {}
