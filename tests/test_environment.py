"""environment.yml must stay consistent with pyproject.toml (the source of truth).

conda cannot solve here (no channel is reachable), so this is the static check the facts call possible:
the same packages, conda-forge names where they differ, pins that admit the same versions.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"kubernetes": "python-kubernetes"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _env() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def _conda_specs(env: dict) -> dict[str, SpecifierSet]:
    out: dict[str, SpecifierSet] = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str):
            match = re.match(r"^([A-Za-z0-9_.-]+)\s*(.*)$", dep)
            assert match, dep
            name, spec = match.groups()
            spec = spec.strip()
            if spec.startswith("=") and not spec.startswith("=="):
                spec = "==" + spec[1:] + ".*"
            out[name] = SpecifierSet(spec)
    return out


def test_environment_has_only_known_top_level_keys():
    assert set(_env()) <= {"name", "channels", "dependencies", "variables", "prefix"}


def test_conda_forge_channel_and_explicit_pip():
    env = _env()
    assert env["channels"][0] == "conda-forge"
    assert "pip" in env["dependencies"], (
        "list pip explicitly, or conda warns and may not install the pip section"
    )


def test_project_installed_editable_with_dev_extra_through_pip():
    env = _env()
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert any(re.fullmatch(r"-e \.\[([a-z,]+)\]", p) and "dev" in p for p in pip_section)


def test_python_version_matches_requires_python():
    requires = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert "3.11" in _conda_specs(_env())["python"] or "3.11.0" in _conda_specs(_env())["python"]
    assert "3.11.0" in requires


def test_every_runtime_dependency_is_in_the_environment_with_the_same_pins():
    conda = _conda_specs(_env())
    project = _pyproject()["project"]
    runtime = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["lab"]]
    for req in runtime:
        name = CONDA_NAMES.get(req.name, req.name)
        assert name in conda, f"{req.name} (conda-forge: {name}) missing from environment.yml"
        assert str(conda[name]) == str(req.specifier), (
            f"{name}: environment.yml {conda[name]} != pyproject {req.specifier}"
        )
    extra = set(conda) - {CONDA_NAMES.get(r.name, r.name) for r in runtime} - {"python", "pip"}
    assert not extra, f"environment.yml has packages pyproject.toml does not: {sorted(extra)}"


def test_kubernetes_client_pinned_to_37():
    req = next(Requirement(r) for r in _pyproject()["project"]["dependencies"] if r.startswith("kubernetes"))
    assert "37.0.2" in req.specifier and "38.0.0" not in req.specifier and "36.1.0" not in req.specifier
