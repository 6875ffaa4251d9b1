"""PromQL that reads one of dcgm-exporter's fields in its SI unit whatever release wrote it,
built from the field table (``enricher/dcgm_fields.json``): what the dashboards' source
(grafana/boards), the recipes, the bench and the tests ask Prometheus instead of a name.

``read("fb_used", 'node=~"$node"')`` is every name the field has had, newest first, each with
the same matchers and scaled to the field's SI unit, joined by ``or`` (4.9's name in bytes,
4.8's in MiB)::

    (<4.9 name>{node=~"$node"} or <4.8 name>{node=~"$node"} * 1048576)

``or`` matches on every label but ``__name__``, so each device contributes the series of
whichever naming its node's exporter writes (a fleet in the middle of an upgrade has both
namings, never both on one device at one instant), with no record and no series added; a name
that nothing writes costs Prometheus one empty postings lookup.

A range function over a counter (rate, increase, changes) is ``summed``: the device whose
exporter was upgraded within the range has a part of it under each name, and its rate is the
sum of the two parts, not either one (each alone reads low, as rate() of a short series does)::

    sum without (dcgm_naming) (rate(NEW{...}[5m])
      or label_replace(rate(OLD{...}[5m]), "dcgm_naming", "1", "", ""))

A unit below the SI one divides by the inverse (``/ 100`` for percent, ``/ 1000`` for mJ),
which is exact where ``* 0.01`` is not: 97 % reads 0.97, the same double as the 4.9 naming's
ratio.

The mixin's jsonnet builds the same text from its copy of the table
(mixin/lib/fields.libsonnet, tests/test_mixin.py holds the two equal). Pure.
"""

from __future__ import annotations

from collections.abc import Callable

from enricher.fieldtable import FieldTable, table

# The label that keeps each name's answer apart in a summed read, until the sum drops it.
SUMMED_LABEL = "dcgm_naming"


def names_and_scales(field: str, fields: FieldTable | None = None) -> list[tuple[str, float]]:
    """Each name of ``field``, newest naming first, once, with the scale that takes its value
    to the field's SI unit."""
    row = (fields or table()).field(field)
    out: dict[str, float] = {}
    for fn in list(row.by_naming.values())[::-1]:
        out.setdefault(fn.name, fn.scale)
    return list(out.items())


def scaled(expr: str, scale: float) -> str:
    """``expr`` times ``scale`` as PromQL: nothing for 1, a division by the inverse for a scale
    under 1 (exact for the table's 0.01 and 0.001), else a product."""
    if scale == 1:
        return expr
    if scale < 1:
        return f"{expr} / {round(1 / scale)}"
    return f"{expr} * {round(scale) if scale == round(scale) else scale!r}"


def read(
    field: str,
    *matchers: str,
    over: Callable[[str], str] | None = None,
    unitless: bool = False,
    summed: bool = False,
    fields: FieldTable | None = None,
) -> str:
    """PromQL for ``field`` in its SI unit under every name it has had (see the module).

    ``matchers`` go in each selector's braces, in order (no braces without one). ``over``
    wraps each selector (``lambda s: f"rate({s}[5m])"``) before its scale applies, which holds
    for functions linear in the value (rate, increase, max_over_time, last_over_time, ...);
    ``unitless`` leaves the scale off for those that count (changes, resets,
    count_over_time). ``summed`` adds up the names' answers per series instead of taking the
    newest (see the module)."""
    wrap = over or (lambda s: s)
    braces = "{" + ", ".join(matchers) + "}" if matchers else ""
    found = names_and_scales(field, fields)
    terms = [
        wrap(name + braces) if unitless else scaled(wrap(name + braces), scale)
        for name, scale in found
    ]
    if len(terms) == 1 and terms[0] == wrap(found[0][0] + braces):
        return terms[0]
    if not summed:
        return "(" + " or ".join(terms) + ")"
    labelled = [terms[0]] + [
        f'label_replace({t}, "{SUMMED_LABEL}", "{i}", "", "")' for i, t in enumerate(terms[1:], 1)
    ]
    return f"sum without ({SUMMED_LABEL}) (" + " or ".join(labelled) + ")"


# The aggregation that combines each name's aggregate into the group's.
_COMBINE = {"sum": "sum", "count": "sum", "max": "max", "min": "min"}


def aggregate(
    field: str,
    op: str,
    by: str,
    *matchers: str,
    over: Callable[[str], str] | None = None,
    unitless: bool = False,
    fields: FieldTable | None = None,
) -> str:
    """``op by (by) (field)`` in the field's SI unit (``op``: sum, max, min or count): each
    name aggregated on its own and then scaled, once per group and step instead of once per
    series (``sum(... / 100)`` over every GPU costs several times ``sum(...)``; the scale of a
    sum, max or min is the scaled aggregate's), the names' aggregates combined per group by
    ``op``'s combiner (a group may hold devices of both namings: a cluster mid-upgrade).
    ``over`` wraps each selector, ``unitless`` as in :func:`read`; no ``by``: one group."""
    wrap = over or (lambda s: s)
    braces = "{" + ", ".join(matchers) + "}" if matchers else ""
    head = f"{op} by ({by})" if by else op
    terms = []
    for i, (name, scale) in enumerate(names_and_scales(field, fields)):
        term = f"{head} ({wrap(name + braces)})"
        if not unitless and op != "count":
            term = scaled(term, scale)
        if i:
            term = f'label_replace({term}, "{SUMMED_LABEL}", "{i}", "", "")'
        terms.append(term)
    if len(terms) == 1:
        return terms[0]
    return f"{_COMBINE[op]} without ({SUMMED_LABEL}) (" + " or ".join(terms) + ")"


def names_regex(*field_names: str, fields: FieldTable | None = None) -> str:
    """A ``__name__`` regex for every name of ``field_names`` (a selector or a
    prometheus-adapter seriesQuery that finds the series whatever their naming)."""
    names = [n for f in field_names for n, _ in names_and_scales(f, fields)]
    return "|".join(dict.fromkeys(names))
