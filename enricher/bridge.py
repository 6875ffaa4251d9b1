"""The naming bridge (opt-in, ``--bridge.naming``): the rewritten upstream body served in one
naming of dcgm-exporter's fields (enricher.fieldtable), whatever release wrote it.

Behind a 4.9+ exporter, ``4.8`` serves 4.8's names and units to what still reads them; behind
an older one, ``4.9`` or ``4.10`` serves the new ones so that queries can move first. Each
family the table knows is renamed to its field's name in that naming and its values converted
exactly (through the units' scales), with that name's HELP and TYPE; the driver-version label
takes that naming's name. A field the body has under two names is served once: under the
target name if the body has it, else under the first. Families the table does not know, a
field the target naming has no name for, and every label but the driver's pass through as
they came.

Pure: ``Bridge.apply`` takes the rewritten body (enricher.rewrite: each family's HELP, TYPE and
samples together, one space between the parts, labels escaped) and returns the one served.
It runs once per collection on the whole body, so it works on families, not lines: a family
is found with two string searches (between header lines) and, left alone, copied as one slice;
a rename is one ``str.replace``; a unit change one regex split of the family's values and one
join; the driver label one ``str.replace`` over the body where that is exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from .fieldtable import FieldName, FieldTable, table
from .textformat import parse_label_block, render_labels, unescape_label_value

OFF = "off"

# The sample lines of one family as enricher.rewrite writes them: a run of lines that start
# with the same metric name followed by "{" or a space (the name is group 1).
_NAME_RE = re.compile(r"[^ {\n#][^ {\n]*(?=[ {])")
_RUN_RE = re.compile(r"([^ {\n#][^ {\n]*)[ {][^\n]*\n(?:\1[ {][^\n]*\n)*")
# A sample's value (group 2) and timestamp (group 3, with its space) in such a run, after its
# label block's "} " (group 1): the only "} " followed by a token that runs to the end of the
# line (or to a timestamp there) without a space or a "}", since a "} " inside a label value
# is followed by the block's own "}" before the line ends. The literal start keeps the search
# in C's fast scan.
_VALUE_RE = re.compile(r"(\} )([^ \n}]+)((?: [0-9]+)?)(?=\n)")
_INT64 = 2**63
# Units without a dimension: their HELP says no "(in ...)".
_PLAIN_UNITS = frozenset({"count", "code", "state"})


def naming_of_setting(value: str, fields: FieldTable | None = None) -> str | None:
    """The naming ``--bridge.naming`` asks for: None for ``off``; a naming of the table
    (``4.8``, ``4.9``, ``4.10``) as it is; a dcgm-exporter release (``4.8.4``, ``4.10.0``) as
    the naming it writes. ValueError for anything else."""
    t = fields or table()
    value = value.strip()
    if value.lower() in (OFF, ""):
        return None
    if value in t.namings:
        return value
    try:
        if value.count(".") >= 2 or "-" in value:
            return t.naming_of_release(value)
    except ValueError:
        pass
    raise ValueError(
        f"{value!r} is not a naming: {OFF}, {', '.join(t.namings)} "
        "or a dcgm-exporter release such as 4.8.4"
    )


def _scale(fn: FieldName) -> Fraction:
    # The table's scales are decimal (0.01, 0.001, 1048576): their shortest repr is that decimal.
    return Fraction(repr(fn.scale))


def _help(fn: FieldName, meaning: str) -> str:
    text = fn.help or (f"{meaning}." if fn.unit in _PLAIN_UNITS else f"{meaning} (in {fn.unit}).")
    return text.replace("\\", "\\\\").replace("\n", "\\n")


@dataclass(frozen=True, slots=True)
class _Move:
    """What the family of one upstream name becomes."""

    field: str
    target: str  # the field's name in the bridge's naming
    num: int  # a written value times num / den is the target unit's value
    den: int
    header: str  # the target's HELP and TYPE lines


class Bridge:
    """Serves the rewritten upstream body in ``naming`` (one of the table's namings)."""

    def __init__(self, naming: str, fields: FieldTable | None = None) -> None:
        t = fields or table()
        if naming not in t.namings:
            raise ValueError(f"not a naming of the field table: {naming!r}")
        self.naming = naming
        self._moves: dict[str, _Move] = {}
        for field in t.fields.values():
            target = field.by_naming.get(naming)
            if target is None:
                continue  # a field this naming never had: served under the name it came with
            header = (
                f"# HELP {target.name} {_help(target, field.meaning)}\n"
                f"# TYPE {target.name} {field.type}\n"
            )
            for name in field.names():
                if name == target.name:
                    continue
                source = t.lookup(name)
                assert source is not None
                factor = _scale(source) / _scale(target)
                self._moves[name] = _Move(
                    field.field, target.name, factor.numerator, factor.denominator, header
                )
        # The driver-version label: its name in this naming, and the others it replaces.
        label = "driver_version"
        self.label = t.label(label, t.naming_first[naming])
        self._other_labels = tuple(n for n in t.label_names(label) if n != self.label)

    def apply(self, text: str) -> str:
        """``text`` (a rewritten upstream body) in the bridge's naming (pure)."""
        if not text:
            return text
        terminated = text.endswith("\n")
        if not terminated:
            text += "\n"
        families = _families(text)
        moves = self._moves
        # Which family of each field is served: the one already in the target name, else
        # the first; every other name of that field is dropped.
        present = {name for name, _, _, _ in families}
        chosen: dict[str, str] = {}
        for name, _, _, typ in families:
            move = moves.get(name)
            if move is None or typ in ("histogram", "summary"):
                continue
            if move.target not in present and move.field not in chosen:
                chosen[move.field] = name
        out: list[str] = []
        keep = 0  # the start of the pending slice of families passed through
        for name, start, samples, typ in families:
            move = moves.get(name)
            if move is None or typ in ("histogram", "summary"):
                continue
            if keep < start:
                out.append(text[keep:start])
            keep = samples[1]
            if chosen.get(move.field) != name:
                continue  # the same field under another name is served
            out.append(move.header)
            out.append(_moved_samples(text[samples[0] : samples[1]], name, move))
        if keep:
            out.append(text[keep:])
            body = "".join(out)
        else:  # nothing to move
            body = text
        for other in self._other_labels:
            if other + '="' in body:
                body = _relabel(body, other, self.label, text, families)
        return body if terminated else body[:-1]


def _families(text: str) -> list[tuple[str, int, tuple[int, int], str]]:
    """Each family of ``text`` (a rewritten body, newline-terminated) in order: its name,
    where it starts (its HELP or TYPE line, else its first sample), where its samples start
    and end, and its TYPE ("" when it has none). A line of neither kind is a family of its own
    with the name "".

    enricher.rewrite writes each family's lines together, so the samples between two header
    lines whose first and last lines have one name are all of that name (found by two
    searches); only where they are not (a family without HELP and TYPE follows) are the lines
    matched one by one."""
    families: list[tuple[str, int, tuple[int, int], str]] = []
    pos, size = 0, len(text)
    header = -1  # the start of the next header line at or after pos (size: none)
    while pos < size:
        start = pos
        name = typ = ""
        while text.startswith(("# HELP ", "# TYPE "), pos):
            end = text.find("\n", pos)
            line_name, _, rest = text[pos + 7 : end].partition(" ")
            if name and line_name != name:
                break
            name = line_name
            if text[pos + 2] == "T":
                typ = rest
            pos = end + 1
        m = _NAME_RE.match(text, pos)
        if m is not None and (not name or m.group() == name):
            name = m.group()
            if header < pos:
                found = text.find("\n#", pos)
                header = size if found < 0 else found + 1
            last = text.rfind("\n", pos, header - 1) + 1
            if text.startswith(name, last) and text[last + len(name)] in " {":
                end = header
            else:
                end = _RUN_RE.match(text, pos).end()  # type: ignore[union-attr]
            families.append((name, start, (pos, end), typ))
            pos = end
        elif pos > start:
            families.append((name, start, (pos, pos), typ))
        else:  # not a line the rewrite writes: passed through
            pos = text.find("\n", pos) + 1
            families.append(("", start, (pos, pos), ""))
    return families


def _moved_samples(chunk: str, name: str, move: _Move) -> str:
    """The sample lines ``chunk`` (each of ``name``) under the move's name and unit."""
    target = move.target
    if not chunk:
        return ""  # HELP and TYPE without samples
    # Every line starts with the name, and a label value holds no newline.
    chunk = target + chunk[len(name) :].replace("\n" + name, "\n" + target)
    if move.num == move.den:
        return chunk
    num, den = move.num, move.den
    converted: dict[str, str] = {}
    if chunk.startswith(target + " ") or "\n" + target + " " in chunk:
        # A series without labels (enricher.rewrite writes one only where no node is known).
        size = len(target)
        lines = chunk.split("\n")[:-1]
        out = []
        for line in lines:
            close = line.rfind("}")
            head = close + 1 if close >= 0 else size
            value, sep, stamp = line[head + 1 :].partition(" ")
            new = converted.get(value)
            if new is None:
                new = converted[value] = convert_value(value, num, den)
            out.append(f"{line[:head]} {new}{sep}{stamp}\n")
        return "".join(out)
    parts = _VALUE_RE.split(chunk)
    values = parts[2::4]
    for i, value in enumerate(values):
        new = converted.get(value)
        if new is None:
            new = converted[value] = convert_value(value, num, den)
        values[i] = new
    parts[2::4] = values
    return "".join(parts)


def convert_value(token: str, num: int, den: int) -> str:
    """The sample value ``token`` (valid in the text format) times ``num / den`` (> 0),
    written so that Prometheus reads the float64 nearest the exact product: an integer
    exactly, any other number as the shortest text of that float; NaN and infinities kept."""
    sign = token[:1] in ("+", "-")
    whole, _, frac = token[sign:].partition(".")
    digits = whole + frac
    if digits.isdigit() and digits.isascii() and len(digits) < 400:
        # A plain decimal (the exporter's integers and %f floats): digits / 10**len(frac),
        # so the product is one fraction of integers, divided once.
        product = int(digits) * num * (-1 if token[0] == "-" else 1)
        below = den * 10 ** len(frac)
        q, r = divmod(product, below)
        return _integer(q) if not r else _float_text(product, below)
    tail = token[sign:].lower()
    if tail == "nan":
        return "NaN"
    if tail in ("inf", "infinity"):
        return "-Inf" if token[0] == "-" else "+Inf"
    exact = Fraction(token) * num / den  # an exponent
    if exact.denominator == 1:
        return _integer(exact.numerator)
    return _float_text(exact.numerator, exact.denominator)


def _float_text(num: int, den: int) -> str:
    """``num / den`` as the shortest text of the nearest float64 (int / int rounds
    correctly); an infinity beyond float64's range, which Prometheus would refuse as digits."""
    try:
        return repr(num / den)
    except OverflowError:
        return "-Inf" if (num < 0) != (den < 0) else "+Inf"


def _integer(value: int) -> str:
    if -_INT64 < value < _INT64:
        return str(value)
    return _float_text(value, 1)  # beyond int64 Prometheus reads a float anyway


def _relabel(
    body: str,
    other: str,
    label: str,
    text: str,
    families: list[tuple[str, int, tuple[int, int], str]],
) -> str:
    """``body`` (the bridge's output of ``text``, whose families are ``families``) with the
    label ``other`` renamed ``label``.

    In one ``str.replace`` when that is exact: ``other="`` is then always a label's name and
    its opening quote. Elsewhere it could only be inside a HELP text (the families' headers
    are looked at) or at the end of a label value, the quote closing it, where a ``,`` or a
    ``}`` follows (enricher.rewrite writes labels so); a line with both labels needs one of
    them left out. Any of these takes the slow way, line by line."""
    quoted = other + '="'
    if (
        label + '="' not in body
        and quoted + "," not in body
        and quoted + "}" not in body
        and not any(quoted in text[start : samples[0]] for _, start, samples, _ in families)
    ):
        return body.replace(quoted, label + '="')
    return _relabel_lines(body, other, label)


def _relabel_lines(body: str, other: str, label: str) -> str:
    """``body`` with the label ``other`` renamed ``label`` on every line, the slow way for a
    body that has both: a series with both keeps ``label``'s value, and a series that then
    equals one before it is left out."""
    out = []
    seen: set[str] = set()
    for line in body.split("\n"):
        brace = line.find("{")
        close = line.rfind("}")
        if line.startswith("#") or brace < 0:
            out.append(line)
            continue
        series = line[: close + 1]
        if other + '="' in series:
            pairs = parse_label_block(line[brace + 1 : close])
            if pairs is not None:
                names = {n for n, _ in pairs}
                series = line[:brace] + render_labels(
                    (label if n == other else n, unescape_label_value(v))
                    for n, v in pairs
                    if not (n == other and label in names)
                )
        if series in seen:
            continue
        seen.add(series)
        out.append(series + line[close + 1 :])
    return "\n".join(out)
