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


def test_public_api_is_documented():
    """Every name of `host.api.__all__` exists and is named in docs/plugins.md."""
    from host import api

    text = DOC.read_text()
    assert all(hasattr(api, name) for name in api.__all__)
    missing = [name for name in api.__all__ if f"`{name}`" not in text]
    assert not missing, f"host.api names missing from docs/plugins.md: {missing}"


def test_registration_hooks_go_through_pluggy():
    """A hook wrapper sees the registration calls: they are made by pluggy, not around it."""
    from host.api import hookimpl
    from host.plugins import get_plugin_manager

    seen = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def modelhost_register_backends(self, registry):
            seen.append(registry.current_plugin)
            return (yield)

    class Mine:
        @hookimpl
        def modelhost_register_backends(self, registry):
            registry.add_backend("mine-test", lambda name: None)

    plugins = get_plugin_manager(extra=[Wrapper(), Mine()])
    assert plugins.registry.backends["mine-test"].plugin == "Mine"
    assert "Mine" in seen and "python" in seen
