"""Compose files read as Docker Compose reads them, as far as deploy/compose uses it: the
``!reset`` tag and the merge of several files (tests/test_compose.py, tests/test_image.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class Reset:
    """Compose's ``!reset`` tag: the attribute goes back to its default when files merge."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _ComposeLoader(yaml.SafeLoader):
    pass


def _reset(loader: yaml.SafeLoader, node: yaml.Node) -> Reset:
    if isinstance(node, yaml.SequenceNode):
        return Reset(loader.construct_sequence(node))
    if isinstance(node, yaml.MappingNode):
        return Reset(loader.construct_mapping(node))
    return Reset(None)


_ComposeLoader.add_constructor("!reset", _reset)


def load_compose(path: Path) -> dict[str, Any]:
    data = yaml.load(path.read_text(), Loader=_ComposeLoader)  # a SafeLoader subclass
    assert isinstance(data, dict), f"{path}: not a mapping"
    return data


def merge(base: Any, override: Any) -> Any:
    """Compose's merge rules, as far as these files use them: mappings merge, ``!reset``
    replaces with the tagged value, sequences append."""
    if isinstance(override, Reset):
        return override.value
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    if isinstance(base, list) and isinstance(override, list):
        return base + override
    return override
