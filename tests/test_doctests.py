"""Every example in conveyor's docstrings runs, and shows what it says.

The modules are found by their text (a line whose first non-blank characters are ``>>>``),
not listed by hand, so a module that gains examples is tested without anyone adding it.
"""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

import conveyor

_PACKAGE = Path(conveyor.__file__).parent
_EXAMPLE = re.compile(r"^\s*>>> ", re.MULTILINE)


def _modules_with_examples() -> list[str]:
    found = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        if _EXAMPLE.search(path.read_text(encoding="utf-8")):
            parts = path.relative_to(_PACKAGE.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = _modules_with_examples()


def test_the_modules_with_examples_are_found() -> None:
    assert len(MODULES) >= 17
    assert {"conveyor.core.retry", "conveyor.store.sqlite._errors"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has '>>>' outside its docstrings' examples"
    assert result.failed == 0
