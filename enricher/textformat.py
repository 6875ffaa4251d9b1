"""The Prometheus text exposition format: its grammar, escaping, value formatting and rendering.

Pure, and independent of what the enricher does with the text: ``rewrite`` and ``labels`` hold
that. Input is judged by Prometheus's own grammar (see below), output is escaped and rendered
so that Prometheus 2 and 3, ``promtool`` and prometheus_client all read it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator

# The text format's grammar, as Prometheus's own parsers read it (the scrape parser of
# model/textparse and the expfmt parser behind ``promtool check metrics``); where the two
# differ, the stricter rule. Python's ``str.split()``, ``str.strip()``, ``str.isdigit()``,
# ``float()`` and ``\s`` accept Unicode spaces and digits, underscores and out-of-range
# numbers that Go's parsers reject, so none of them judges input here.
METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
BLANK = " \t"  # the only separators the format knows
# One label pair inside a block: name, blanks, =, a quoted value whose escapes are the
# format's three (backslash, quote, n). Any other escape, or a lone surrogate (an undecodable
# upstream byte, see upstream.decode_body), makes the block invalid. NUL is an ordinary
# character there (both Prometheus parsers read it; tests/test_prometheus_grammar.py).
_PAIR_RE = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n\ud800-\udfff]|\\[\\"n])*)"'
    r"[ \t]*(,|\Z)"
)
_ESCAPE_RE = re.compile(r"\\(.)")
# HELP text: any character but a lone surrogate; escapes only backslash and n.
_HELP_RE = re.compile(r"(?:[^\\\n\ud800-\udfff]|\\[\\n])*\Z")
VALID_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
FAMILY_SUFFIXES = {
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
}
# A sample's value, as Go's strconv.ParseFloat reads it with Prometheus's restriction (no
# "p", "P" or "_": hex floats and digit separators are out): ASCII decimal with an optional
# exponent, or inf/infinity (signed) and nan, in any case. Out-of-range numbers fail too.
_FLOAT_RE = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)"
    r"|[nN][aA][nN]"
)
# What follows the name or label block: blanks, the value token (Prometheus's lexer takes
# anything up to a blank, newline or brace, then parses it), and an optional timestamp in
# ASCII digits (the scrape lexer takes no sign), each separated by blanks.
_TAIL_RE = re.compile(r"[ \t]*([^{ \t\n]+)(?:[ \t]+([0-9]+))?[ \t]*\Z")
_INT64_MAX = 2**63 - 1

MAX_LABEL_VALUE_LENGTH = 1024
_UNWRITABLE = re.compile("[\ud800-\udfff]")


def escape_label_value(value: str, limit: int = MAX_LABEL_VALUE_LENGTH) -> str:
    """Escape a label value for the text format (backslash, double quote, newline).

    Values are cut to ``limit`` characters first so a hostile annotation cannot blow up a scrape,
    and a lone surrogate (from a JSON escape in pod metadata: not UTF-8, no escape exists)
    becomes U+FFFD (``written_value``).
    """
    value = written_value(value, limit)
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def cut_values(values: tuple[str, str, str]) -> tuple[str, str, str]:
    """(namespace, pod, container) cut as their labels are written: two names that differ only
    past the cut are one."""
    n = MAX_LABEL_VALUE_LENGTH
    return (values[0][:n], values[1][:n], values[2][:n])


def written_value(value: str, limit: int = MAX_LABEL_VALUE_LENGTH) -> str:
    """The label value a reader gets back from ``escape_label_value(value)``: cut, and with
    U+FFFD for what cannot be written (the series identity for dedupe)."""
    value = value[:limit]
    return _UNWRITABLE.sub("\ufffd", value) if _UNWRITABLE.search(value) else value


_BLANKS = re.compile(r"[ \t]+")


def split_comment(line: str) -> list[str]:
    """Split ``# HELP name text`` into at most four parts on blanks (space and tab only).

    ``str.split()`` would also split on Unicode separators (U+2028, U+00A0, ...), which are
    ordinary characters of HELP text in the exposition format.
    """
    return _BLANKS.split(line, maxsplit=3)


def unescape_label_value(raw: str) -> str:
    r"""Undo text-format escaping of a value that ``parse_label_block`` accepted.

    Only ``\\``, ``\"`` and ``\n`` reach here: a block with any other escape is invalid.
    """
    if "\\" not in raw:
        return raw
    return _ESCAPE_RE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), raw)


def format_value(value: float) -> str:
    """Render a sample value as Prometheus does (integers without a fraction)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def render_labels(pairs: Iterable[tuple[str, str]]) -> str:
    """Render ``{a="x",b="y"}`` from (name, unescaped value) pairs; empty string when none."""
    body = ",".join(f'{name}="{escape_label_value(value)}"' for name, value in pairs)
    return "{" + body + "}" if body else ""


def parse_label_block(block: str) -> list[tuple[str, str]] | None:
    """Parse the text between ``{`` and ``}`` into (name, raw escaped value) pairs.

    Returns None for anything that is not valid: a strict reader would reject the whole
    scrape, so the caller drops that one line instead. Duplicate names are invalid, and so
    are names starting with ``__``, which Prometheus reserves for its own use.
    """
    pairs: list[tuple[str, str]] = []
    pos = 0
    end = len(block)
    if block.strip(BLANK) == "":
        return pairs
    seen: set[str] = set()
    while pos < end:
        m = _PAIR_RE.match(block, pos)
        if m is None:
            return None
        name, raw = m.group(1), m.group(2)
        if name in seen or name.startswith("__"):
            return None
        seen.add(name)
        pairs.append((name, raw))
        pos = m.end()
        if m.group(3) == "":
            if pos < end:
                return None
        elif block[pos:].strip(BLANK) == "":
            break  # a trailing comma (and blanks) before the closing brace
    return pairs


def valid_float(token: str) -> bool:
    """Whether Prometheus parses ``token`` as a sample value (Go's ParseFloat, no p or _)."""
    if _FLOAT_RE.fullmatch(token) is None:
        return False
    # ParseFloat fails with ErrRange where Python's float() quietly gives inf (1e400).
    return not math.isinf(float(token)) or token.lstrip("+-")[:1] in "iI"


def valid_value(tail: str) -> str | None:
    """The value part of a sample line (after the name or ``}``), normalised to
    ``value[ timestamp]``, or None when Prometheus would reject it.

    Normalising only drops blanks: the value and timestamp tokens are copied as they came.
    """
    m = _TAIL_RE.match(tail)
    if m is None:
        return None
    value, ts = m.group(1), m.group(2)
    if not valid_float(value):
        return None
    if ts is None:
        return value
    if int(ts) > _INT64_MAX:  # ParseInt's range
        return None
    return f"{value} {ts}"


def valid_help(raw: str) -> bool:
    """Whether HELP text is valid: escapes only ``\\`` and ``\n``, valid UTF-8."""
    return _HELP_RE.match(raw) is not None


def first_blank(line: str) -> int:
    """Index of the first space or tab in ``line`` (its length when there is none)."""
    space, tab = line.find(" "), line.find("\t")
    if tab < 0:
        return space if space >= 0 else len(line)
    return tab if space < 0 else min(space, tab)


# A sample line of a watched family, split for its reader: (name, head, tail), where
# head + tail is the line without a trailing carriage return, cut after its last "}" (head ""
# when it has none): the label block and the value part, without parsing either.
WatchedLine = tuple[str, str, str]


def split_sample_line(name: str, line: str) -> WatchedLine:
    """``line`` (a sample of ``name``) as a WatchedLine (pure)."""
    line = line.rstrip("\r")
    close = line.rfind("}") + 1
    return name, line[:close], line[close:]


def watched_spans(text: str, names: Iterable[str]) -> list[tuple[str, int, int]]:
    """(name, start, end) of the sample lines of ``names`` in ``text``, each name's in text
    order, names in the order given (pure)."""
    return [(name, *span) for name in names for span in sample_line_spans(text, name)]


def watched_lines(
    text: str, names: Iterable[str], spans: list[tuple[str, int, int]] | None = None
) -> list[WatchedLine]:
    """The sample lines of ``names`` in ``text`` (at ``spans``, when the caller has found
    them with :func:`watched_spans`), split (pure)."""
    found = watched_spans(text, names) if spans is None else spans
    return [split_sample_line(name, text[start:stop]) for name, start, stop in found]


def sample_line_spans(text: str, name: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each line of ``text`` that starts with the metric name ``name`` followed
    by ``{`` or a blank (a sample of ``name``, not of a longer name), ``end`` at its newline (or
    the end of ``text``). Found with ``str.find``, so the other lines cost nothing."""
    start = 0 if text.startswith(name) else _next_line_of(text, name, 0)
    size = len(name)
    while start >= 0:
        end = text.find("\n", start)
        stop = len(text) if end < 0 else end
        if text[start + size : start + size + 1] in ("{", " ", "\t"):
            yield start, stop
        if end < 0:
            return
        start = _next_line_of(text, name, end)


def _next_line_of(text: str, name: str, pos: int) -> int:
    found = text.find("\n" + name, pos)
    return found + 1 if found >= 0 else -1
