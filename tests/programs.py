"""System programs some tests need (Debian packages), found or failed for in CI."""

from __future__ import annotations

import os
import shutil

import pytest

PACKAGES = {"prometheus": "prometheus", "promtool": "prometheus", "chromium": "chromium"}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def require_binary(name: str) -> str:
    """The path of a program from a Debian package; if it is missing, fail under CI (where
    `make test` installs it first, with `make system-deps`), skip elsewhere."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}")
                                   else None)
    if found is not None:
        return found
    message = (f"{name} is not installed (Debian package `{PACKAGES.get(name, name)}`; "
               "`make system-deps` installs it as root)")
    if in_ci():
        pytest.fail(message + " and CI is set: tests that need it must run in CI")
    pytest.skip(message)
