"""The package metadata (issue 24, item 24): ``license`` in the SPDX expression form of
PEP 639 (the ``{ text = ... }`` table is deprecated), with a setuptools that reads it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.licenses import canonicalize_license_expression
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_license_is_an_spdx_expression_and_setuptools_can_read_it() -> None:
    data = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    license_ = data["project"]["license"]
    assert isinstance(license_, str), "license = { text = ... } is deprecated (PEP 639)"
    assert canonicalize_license_expression(license_) == license_
    assert not any(c.startswith("License ::") for c in data["project"].get("classifiers", ()))
    (setuptools,) = [
        Requirement(r) for r in data["build-system"]["requires"] if r.startswith("setuptools")
    ]
    # setuptools reads an SPDX expression in project.license from version 77
    floor = min(Version(s.version) for s in setuptools.specifier if s.operator == ">=")
    assert floor >= Version("77")
