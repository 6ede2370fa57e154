"""The typed TP4 profile: TOML layers (presets) merged, parsed into models and validated."""

from tp4.profile.load import Loaded, load_default, load_file, load_text, preset_names, preset_layers

__all__ = ["Loaded", "load_default", "load_file", "load_text", "preset_names", "preset_layers"]
