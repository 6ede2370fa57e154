"""The typed TP4 profile: TOML layers (presets) merged, parsed into models and validated."""

import sys
import types


def _get_no_plugins() -> tuple[()]:
    return ()


def _no_pydantic_plugins() -> None:
    """tp4 loads no pydantic plugins, and does not pay for looking for them.

    pydantic looks its plugins up when it builds the first model: its plugin loader imports
    importlib.metadata (with email, zipfile, csv, socket) and scans every installed distribution's
    entry points, ~14 ms of a ~175 ms `tp4 plan` (bench/bench_plan.py); PYDANTIC_DISABLE_PLUGINS
    skips the scan, not the import. tp4's models run under no plugin, so the loader module
    (private: pydantic/plugin/_loader.py, used only as `from ._loader import get_plugins`) is
    stood in for by one that has none, unless something already imported the real one.
    tests/test_cli_speed.py fails if a pydantic upgrade makes this stand-in miss."""
    name = "pydantic.plugin._loader"
    if name not in sys.modules:
        loader = types.ModuleType(name, "tp4: no pydantic plugins (tp4/line/profile/__init__.py)")
        loader.get_plugins = _get_no_plugins  # type: ignore[attr-defined]
        sys.modules[name] = loader


_no_pydantic_plugins()

from tp4.line.profile.load import Loaded, load_default, load_file, load_text, preset_names, preset_layers  # noqa: E402

__all__ = ["Loaded", "load_default", "load_file", "load_text", "preset_names", "preset_layers"]
