"""ruff and mypy over `host/`, with the settings in pyproject.toml: CI runs them through the suite.

Skipped where the checkout is not at hand (the tests run against an installed wheel, but lint
reads the source tree next to them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not (ROOT / "host" / "core.py").is_file(),
                                reason="needs the source checkout")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)


def test_ruff_is_clean() -> None:
    result = _run("ruff", "check", "--no-cache", "host")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    # Its cache stays in the checkout (.mypy_cache, ignored by git): later runs take seconds.
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
