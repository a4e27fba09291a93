"""Every hook a plugin can implement is documented (a hook missing from the docs fails here)."""

from pathlib import Path

from host.plugins import spec

DOC = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"


def test_every_hook_is_documented():
    text = DOC.read_text()
    hooks = [name for name in dir(spec) if name.startswith("modelhost_")]
    assert hooks, "no hook specifications found"
    missing = [name for name in hooks if f"### `{name}(" not in text]
    assert not missing, f"hooks missing from docs/plugins.md: {missing}"


def test_documented_hooks_exist():
    import re

    documented = re.findall(r"^### `(modelhost_\w+)\(", DOC.read_text(), flags=re.M)
    assert documented and all(hasattr(spec, name) for name in documented)
