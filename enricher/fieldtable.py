"""dcgm-exporter's contract, owned in one place: the field table (``dcgm_fields.json``).

Each row is one field the product reads or draws (memory split, power split, energy ledger,
idle, the dashboards, rules and recipes, the simulated exporter, the bench): what it means,
its Prometheus type, and its name and unit in each *naming* (the names a range of
dcgm-exporter releases writes: ``4.8`` up to 4.8.x, ``4.9`` from 4.9.0, ``4.10`` from 4.10.0).
A naming a row does not list keeps the previous naming's name. The labels that changed name
(the host label, the driver version) are listed by the release that renamed them.

Every other module takes names and units from here: no ``DCGM_FI_`` name is written anywhere
else in the product (tests/test_fieldtable.py). The next release's renames are one more naming
and one entry on each renamed row. Pure: the table is package data, read once.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

TABLE_FILE = "dcgm_fields.json"


def release_key(version: str) -> tuple[int, ...]:
    """``"4.10.0"`` -> ``(4, 10, 0)``; a tag of the older ``<dcgm>-<exporter>`` form counts by
    its exporter part (``"4.6.1-4.8.4"`` -> ``(4, 8, 4)``). ValueError for anything else."""
    exporter = version.rsplit("-", 1)[-1]
    parts = exporter.split(".")
    if not parts or not all(p.isdigit() and p.isascii() for p in parts):
        raise ValueError(f"not a dcgm-exporter release: {version!r}")
    return tuple(int(p) for p in parts)


@dataclass(frozen=True, slots=True)
class FieldName:
    """One name of one field: the naming it belongs to, its unit as written, and the scale
    that takes a written value to the field's SI unit (``si``)."""

    field: str
    naming: str
    name: str
    unit: str
    si: str
    scale: float
    type: str
    # The HELP text of this name, where the table gives one ("help" in the name's entry).
    help: str = ""


@dataclass(frozen=True, slots=True)
class Field:
    """One row: a field, what it means, its type, whether the product needs it (a body that
    has it under no known name is reported), and its name in every naming."""

    field: str
    meaning: str
    type: str
    needed: bool
    by_naming: Mapping[str, FieldName]  # every naming, the inherited ones filled in

    def names(self) -> tuple[str, ...]:
        """Every name of the field, newest naming first, each once."""
        return tuple(dict.fromkeys(n.name for n in reversed(list(self.by_naming.values()))))


class FieldTable:
    """The table, with the look-ups its readers need."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.prefix: str = data["prefix"]
        self.namings: tuple[str, ...] = tuple(n["naming"] for n in data["namings"])
        self.naming_first: dict[str, str] = {n["naming"]: n["first"] for n in data["namings"]}
        units = {k: (str(v[0]), float(v[1])) for k, v in data["units"].items()}
        self.fields: dict[str, Field] = {}
        self.by_name: dict[str, list[FieldName]] = {}
        for row in data["fields"]:
            given = row["names"]
            unknown = set(given) - set(self.namings)
            if unknown:
                raise ValueError(f"field {row['field']}: unknown naming(s) {sorted(unknown)}")
            by_naming: dict[str, FieldName] = {}
            current: FieldName | None = None
            for naming in self.namings:
                if naming in given:
                    entry = given[naming]
                    si, scale = units[entry["unit"]]
                    current = FieldName(
                        row["field"],
                        naming,
                        entry["name"],
                        entry["unit"],
                        si,
                        scale,
                        row["type"],
                        entry.get("help", ""),
                    )
                if current is not None:
                    by_naming[naming] = FieldName(
                        current.field,
                        naming,
                        current.name,
                        current.unit,
                        current.si,
                        current.scale,
                        current.type,
                        current.help,
                    )
            sis = {n.si for n in by_naming.values()}
            if len(sis) != 1:
                raise ValueError(f"field {row['field']}: names in different units {sorted(sis)}")
            field = Field(
                row["field"], row["meaning"], row["type"], bool(row.get("needed")), by_naming
            )
            self.fields[field.field] = field
            for fn in by_naming.values():
                self.by_name.setdefault(fn.name, []).append(fn)
        self.labels: dict[str, tuple[tuple[tuple[int, ...], str], ...]] = {
            lab["label"]: tuple((release_key(n["since"]), n["name"]) for n in lab["names"])
            for lab in data["labels"]
        }
        self.label_also: dict[str, tuple[str, ...]] = {
            lab["label"]: tuple(lab.get("also", ())) for lab in data["labels"]
        }

    # ------------------------------------------------------------------ fields

    def field(self, field: str) -> Field:
        return self.fields[field]

    def name(self, field: str, naming: str) -> str | None:
        """The name ``field`` has in ``naming`` (None: that naming does not have it)."""
        fn = self.fields[field].by_naming.get(naming)
        return None if fn is None else fn.name

    def names(self, field: str) -> tuple[str, ...]:
        """Every name of ``field``, newest naming first."""
        return self.fields[field].names()

    def all_names(self, fields: Iterable[str] | None = None) -> tuple[str, ...]:
        """Every name of ``fields`` (all of them when None), in table order, each once."""
        chosen = self.fields if fields is None else fields
        return tuple(dict.fromkeys(n for f in chosen for n in self.fields[f].names()))

    def lookup(self, name: str) -> FieldName | None:
        """What an upstream name is: the field, the newest naming that writes it, its unit."""
        found = self.by_name.get(name)
        return None if not found else found[-1]

    def namings_of(self, name: str) -> frozenset[str]:
        """The namings in which ``name`` is its field's name (empty: not in the table)."""
        return frozenset(fn.naming for fn in self.by_name.get(name, ()))

    def naming_of_release(self, version: str) -> str:
        """The naming a dcgm-exporter release writes."""
        key = release_key(version)
        chosen = self.namings[0]
        for naming in self.namings:
            if release_key(self.naming_first[naming]) <= key:
                chosen = naming
        return chosen

    def needed(self) -> tuple[str, ...]:
        return tuple(f for f, row in self.fields.items() if row.needed)

    def is_upstream_field(self, name: str) -> bool:
        """Whether a family name is one of DCGM's fields (known to the table or not)."""
        return name.startswith(self.prefix)

    # ------------------------------------------------------------------ labels

    def label(self, label: str, version: str) -> str:
        """The name release ``version`` gives the label ``label`` (``host``, ``driver_version``,
        ``gpu_uuid``)."""
        key = release_key(version)
        chosen = self.labels[label][0][1]
        for since, name in self.labels[label]:
            if since <= key:
                chosen = name
        return chosen

    def label_names(self, label: str) -> tuple[str, ...]:
        """Every name the label has had, oldest first, and its other spellings."""
        return tuple(
            dict.fromkeys([n for _, n in self.labels[label]] + list(self.label_also[label]))
        )


def parse_table(text: str) -> FieldTable:
    """The table in ``text`` (JSON); ValueError when it is not a valid table."""
    try:
        return FieldTable(json.loads(text))
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"not a valid field table: {e!r}") from e


@functools.cache
def table() -> FieldTable:
    """The package's table."""
    return parse_table(resources.files("enricher").joinpath(TABLE_FILE).read_text("utf-8"))
