"""Prometheus text exposition: escaping, value formatting and the upstream rewrite.

Everything here is pure. The rewrite is the hot path: it works line by line on the upstream
text, parses each distinct label block once (blocks repeat across families: one per device),
and regroups lines by family so the output is always valid exposition even when the upstream's
is not (interleaved families, duplicate HELP lines, junk lines). Texts that differ from the
previous one only in their values skip the per-line work through a template (see Rewriter).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

# The text format's grammar, as Prometheus's own parsers read it (the scrape parser of
# model/textparse and the expfmt parser behind ``promtool check metrics``); where the two
# differ, the stricter rule. Python's ``str.split()``, ``str.strip()``, ``str.isdigit()``,
# ``float()`` and ``\s`` accept Unicode spaces and digits, underscores and out-of-range
# numbers that Go's parsers reject, so none of them judges input here.
METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_BLANK = " \t"  # the only separators the format knows
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
_VALID_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_FAMILY_SUFFIXES = {
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

# The labels that identify a device on dcgm-exporter series, in both naming schemes.
UUID_LABELS = ("UUID", "uuid")
GPU_I_ID = "GPU_I_ID"
IDENTITY_LABELS = frozenset(
    {
        "gpu",
        "UUID",
        "uuid",
        "GPU_I_ID",
        "GPU_I_PROFILE",
        "device",
        "modelName",
        "Hostname",
        "hostname",
    }
)
# Labels dcgm-exporter writes about the pod it names, beside the pod labels themselves:
# --kubernetes-enable-pod-uid and the DRA claim of the allocation. They follow the enricher's
# decision; the device-describing dra_* labels (driver, pool, device) stay as they are.
POD_UID_LABEL = "pod_uid"
DRA_CLAIM_LABELS = frozenset({"dra_claim_name", "dra_claim_namespace"})
# (namespace, pod, container) label names per dcgm-exporter naming scheme.
CURRENT_SCHEME = ("namespace", "pod", "container")
OLD_SCHEME = ("pod_namespace", "pod_name", "container_name")
VGPU_LABEL = "vgpu"
# Every upstream series leaves with these labels, empty when no pod is known. Prometheus
# drops empty labels on ingestion, but with honor_labels: true an explicit empty value stops
# the scrape target's own pod/namespace/container (the enricher's pod) from being attached:
# a series about a GPU must never name the monitoring pod.
POD_GUARD_LABELS = ("container", "namespace", "pod")
# Never removed as a stale pod label, even when a pod has a label of that name.
_KEPT_LABELS = (
    IDENTITY_LABELS
    | frozenset(CURRENT_SCHEME)
    | frozenset(OLD_SCHEME)
    | {POD_UID_LABEL, VGPU_LABEL, "dra_driver_name", "dra_pool_name", "dra_device_name"}
)
_GUARD_BLOCK = "{" + ",".join(f'{n}=""' for n in POD_GUARD_LABELS) + "}"

MAX_LABEL_VALUE_LENGTH = 1024
_UNWRITABLE = re.compile("[\ud800-\udfff]")


def escape_label_value(value: str, limit: int = MAX_LABEL_VALUE_LENGTH) -> str:
    """Escape a label value for the text format (backslash, double quote, newline).

    Values are cut to ``limit`` characters first so a hostile annotation cannot blow up a scrape.
    """
    if len(value) > limit:
        value = value[:limit]
    if _UNWRITABLE.search(value) is not None:
        # A lone surrogate (from a JSON escape in pod metadata) is not UTF-8 and has no
        # escape: U+FFFD stands in for it.
        value = _UNWRITABLE.sub("\ufffd", value)
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def written_value(value: str, limit: int = MAX_LABEL_VALUE_LENGTH) -> str:
    """The label value a reader gets back from ``escape_label_value(value)``: cut, and with
    U+FFFD for what cannot be written (the series identity for dedupe)."""
    value = value[:limit]
    return _UNWRITABLE.sub("\ufffd", value) if _UNWRITABLE.search(value) else value


def escape_help(text: str) -> str:
    """Escape HELP text (backslash and newline)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


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
    if block.strip(_BLANK) == "":
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
        elif block[pos:].strip(_BLANK) == "":
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


def _first_blank(line: str) -> int:
    """Index of the first space or tab in ``line`` (its length when there is none)."""
    space, tab = line.find(" "), line.find("\t")
    if tab < 0:
        return space if space >= 0 else len(line)
    return tab if space < 0 else min(space, tab)


# --------------------------------------------------------------------------- rewrite plan


DeviceKey = tuple[str, str]  # (GPU UUID, GPU_I_ID or "" for a whole GPU)


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a device series names. ``pod`` empty means: clear the pod labels (shared device).

    ``uid`` is the pod's UID when the pod watch knows it (``pod_uid`` on the series)."""

    namespace: str
    pod: str
    container: str
    uid: str = ""

    @property
    def shared(self) -> bool:
        return self.pod == ""


SHARED = Owner("", "", "")


@dataclass(frozen=True, slots=True)
class RewritePlan:
    """What to write on device series: owners by device key; devices absent keep upstream labels."""

    owners: Mapping[DeviceKey, Owner] = field(default_factory=dict)
    # The label names dcgm-exporter copies from each pod it names (--kubernetes-enable-pod-
    # labels), by (namespace, pod), from the pod watch; and the names the user says it copies
    # from any pod (--upstream.pod-labels), for pods the watch does not know.
    pod_labels: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    upstream_pod_labels: frozenset[str] = frozenset()
    # Family names the enricher renders itself; upstream families with these names are dropped.
    reserved_prefixes: tuple[str, ...] = (
        "gpu_container_",
        "gpu_process_",
        "gpu_unattributed_",
        "gpu_pod_info",
        "dcgm_enricher_",
    )


def _stale_pod_labels(plan: RewritePlan, named: tuple[str, str], owner: Owner) -> frozenset[str]:
    """The labels of a device series that describe the pod dcgm-exporter named, when the
    enricher names another one (or none): that pod's own labels and its DRA claim.

    The pod's own labels are known from the pod watch; for a pod it does not know, the names
    the user gave with --upstream.pod-labels. Device and pod identity labels are never among
    them, whatever a pod's labels are called.
    """
    if named == (owner.namespace, owner.pod) or named == ("", ""):
        return frozenset()
    names = plan.pod_labels.get(named, plan.upstream_pod_labels) | plan.upstream_pod_labels
    return (names - _KEPT_LABELS) | DRA_CLAIM_LABELS


@dataclass(slots=True)
class RewriteResult:
    text: str  # the rewritten exposition, newline-terminated (or empty)
    identities: dict[DeviceKey, tuple[tuple[str, str], ...]]  # device -> identity label pairs
    samples: int
    invalid_lines: int
    dropped_duplicates: int
    dropped_reserved: int
    fast: bool = False  # served without the line-by-line pass (template or repeated text)


@dataclass(slots=True)
class _Family:
    name: str
    help: str | None = None
    type: str | None = None
    lines: list[str] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)  # input line number of each sample line


@dataclass(slots=True)
class _Block:
    """A parsed upstream label block and what the current plan makes of it."""

    key: DeviceKey | None
    identity: tuple[tuple[str, str], ...]
    new: str  # the rewritten block text including braces
    # The series identity as Prometheus sees it: labels sorted, empty values dropped (an empty
    # label is an absent one), so two blocks that differ only in order or in empty labels are
    # caught as one series.
    canonical: str


# A value the fast path may copy verbatim: a plain number, NaN or +-Inf, optionally followed
# by a timestamp. Every string it matches is one that ``valid_value`` accepts (Prometheus's
# grammar) and that needs no normalising, so copying it is exactly what the line-by-line path
# does. The digit counts are bounded so that no match can overflow a float64 (Prometheus
# rejects 1e400, Python reads it as inf) or an int64 timestamp; longer numbers take the full
# check. Timestamps are unsigned, as in Prometheus's lexer. Python 3.10 has no possessive
# quantifiers; the alternatives are disjoint, so backtracking stays linear.
_FAST_VALUE = (
    r"(?:[-+]?(?:[0-9]{1,200}(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,2})?|NaN|[-+]?Inf)"
    r"(?: [0-9]{1,18})?"
)
# A value slot: from a closing brace and a space to the end of the line. Finding slots with this
# loose pattern is three times cheaper than with the value grammar in it; whether every slot
# holds a fast value is then checked on all of them at once (_FAST_VALUES_RE).
_SLOT_RE = re.compile(r"\} ([^\n]*)\n")
_FAST_VALUES_RE = re.compile(rf"(?:{_FAST_VALUE}\n)*")
# Most exporters write only these (integers and %f floats): a simpler grammar checks them in
# about half the time; anything it rejects gets the full one.
_COMMON_VALUES_RE = re.compile(r"(?:-?[0-9]{1,200}(?:\.[0-9]+)?\n)*")
_SPACED_VALUE_RE = re.compile(rf" {_FAST_VALUE}")
# After this many templates in a row that never served a scrape, build one only every
# _TEMPLATE_RETRY-th slow rewrite (an upstream whose text changes shape on every scrape).
_TEMPLATE_MISSES = 2
_TEMPLATE_RETRY = 16


@dataclass(slots=True)
class _Template:
    """The rewrite of one upstream text, reusable for any text that differs only in values.

    ``frame`` holds the input around its value slots (``frame[0] + v0 + frame[1] + ...`` is the
    input), ``pieces`` the output around the same values in output order ``order`` (None: input
    order). The counts and identities of the rewrite do not depend on the values.
    """

    plan: RewritePlan
    frame: list[str]  # interleaved with "" placeholders at the odd indexes
    pieces: list[str]  # likewise
    order: Callable[[list[str]], Iterable[str]] | None
    identities: dict[DeviceKey, tuple[tuple[str, str], ...]]
    samples: int
    invalid_lines: int
    dropped_duplicates: int
    dropped_reserved: int
    hits: int = 0

    def apply(self, text: str, plan: RewritePlan) -> RewriteResult | None:
        """The rewrite of ``text``, or None when ``text`` does not fit this template.

        Proof obligation: ``text`` is accepted only when it equals the template's input with
        each value slot replaced by a fast-path value; those lines then go through the
        line-by-line rewrite exactly as before (same head, same valid value copied after the
        rewritten block), and every other line is byte-identical.
        """
        if plan is not self.plan and plan != self.plan:
            return None
        values = _SLOT_RE.findall(text)
        frame = self.frame
        if 2 * len(values) + 1 != len(frame) or not _all_fast_values(values):
            return None
        check = frame.copy()
        check[1::2] = values
        if "".join(check) != text:
            return None
        out = self.pieces.copy()
        out[1::2] = values if self.order is None else self.order(values)
        self.hits += 1
        return RewriteResult(
            text="".join(out),
            identities=dict(self.identities),
            samples=self.samples,
            invalid_lines=self.invalid_lines,
            dropped_duplicates=self.dropped_duplicates,
            dropped_reserved=self.dropped_reserved,
            fast=True,
        )


def _copy_result(result: RewriteResult, fast: bool) -> RewriteResult:
    """A result the caller may keep and change without touching the cached one."""
    return RewriteResult(
        text=result.text,
        identities=dict(result.identities),
        samples=result.samples,
        invalid_lines=result.invalid_lines,
        dropped_duplicates=result.dropped_duplicates,
        dropped_reserved=result.dropped_reserved,
        fast=fast,
    )


def _all_fast_values(values: list[str]) -> bool:
    """Whether every slot holds a value the fast path may copy (one regex pass for all)."""
    joined = "\n".join(values) + "\n"
    return (
        _COMMON_VALUES_RE.fullmatch(joined) is not None
        or _FAST_VALUES_RE.fullmatch(joined) is not None
    )


def _interleave(outer: list[str]) -> list[str]:
    """``[a, b, c]`` -> ``[a, "", b, "", c]``: a join buffer whose odd slots take the values."""
    buf = [""] * (2 * len(outer) - 1)
    buf[0::2] = outer
    return buf


def _build_template(
    text: str,
    plan: RewritePlan,
    result: RewriteResult,
    out_lines: list[str],
    out_sources: list[int],
) -> _Template | None:
    """A template from one line-by-line rewrite, or None when this text cannot have one.

    Every value slot must be the value of a sample line that the rewrite kept (its output
    line then ends with that value); anything else (a slot inside a comment, a dropped line)
    would make the output depend on a value in a way the template cannot replay.
    """
    parts = _SLOT_RE.split(text)
    n = len(parts) // 2
    if n == 0 or not _all_fast_values(parts[1::2]):
        return None
    # Input line number of each slot, as ``text.split("\n")`` numbers them.
    slot_of_line: dict[int, int] = {}
    line = 0
    for i in range(n):
        line += parts[2 * i].count("\n")
        slot_of_line[line] = i
        line += 1
    frame = [parts[0] + "} "]
    frame += ["\n" + parts[2 * i] + "} " for i in range(1, n)]
    frame.append("\n" + parts[2 * n])
    values = parts[1::2]

    pieces: list[str] = []
    order: list[int] = []
    pending: list[str] = []
    for out_line, src in zip(out_lines, out_sources, strict=True):
        slot = slot_of_line.get(src) if src >= 0 else None
        if slot is None:
            pending.append(out_line)
            pending.append("\n")
            continue
        value = values[slot]
        if not out_line.endswith(" " + value):
            return None
        pending.append(out_line[: len(out_line) - len(value)])
        pieces.append("".join(pending))
        pending = ["\n"]
        order.append(slot)
    if len(order) != n:
        return None  # a slot line was dropped (or, impossibly, kept twice)
    pieces.append("".join(pending))
    if sorted(order) != list(range(n)):
        return None
    picker: Callable[[list[str]], Iterable[str]] | None = None
    if order != list(range(n)):  # families were regrouped (so n > 1: a tuple comes back)
        picker = operator.itemgetter(*order)
    return _Template(
        plan=plan,
        frame=_interleave(frame),
        pieces=_interleave(pieces),
        order=picker,
        identities=dict(result.identities),
        samples=result.samples,
        invalid_lines=result.invalid_lines,
        dropped_duplicates=result.dropped_duplicates,
        dropped_reserved=result.dropped_reserved,
    )


class Rewriter:
    """Rewrites upstream exposition according to a plan, caching per distinct label block.

    One instance lives as long as the server. Its caches hold what the last text needed: the
    rewritten blocks (dropped when the plan changes; the parse of a block survives), one
    template and the last result, so memory follows the payload, not the uptime.

    Consecutive scrapes of dcgm-exporter differ only in their values, so after each
    line-by-line rewrite the rewriter keeps one template (input and output with the values
    cut out). The next text that differs from the previous one only in its values is
    rewritten by one regex pass that finds the values, one that checks them, one comparison
    that proves the rest is unchanged, and one join: no Python code per line. The same text
    and plan as the previous call (the exporter has not collected since) return the previous
    result. Anything else takes the line-by-line path, which is the reference: the tests
    compare both paths with it and with prometheus_client's parser. ``templates=False``
    keeps to that path (and no result cache) for comparison.
    """

    def __init__(self, cache_limit: int = 200_000, *, templates: bool = True) -> None:
        self._parsed: dict[str, tuple[list[tuple[str, str]], DeviceKey | None] | None] = {}
        self._blocks: dict[str, _Block | None] = {}
        self._plan: RewritePlan | None = None
        self._cache_limit = cache_limit
        self._templates = templates
        self._template: _Template | None = None
        self._wasted = 0  # templates in a row that served no scrape
        self._slow_since_build = 0
        self._last: tuple[str, RewritePlan, RewriteResult] | None = None
        self.fast_rewrites = 0  # served by the template
        self.slow_rewrites = 0  # line by line
        self.repeated_rewrites = 0  # the same text and plan as the previous call
        self.templates_built = 0

    def cache_sizes(self) -> tuple[int, int]:
        """(rewritten blocks, parsed blocks) held: both follow the last text's blocks."""
        return len(self._blocks), len(self._parsed)

    def _parse(self, block: str) -> tuple[list[tuple[str, str]], DeviceKey | None] | None:
        hit = self._parsed.get(block, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        if len(self._parsed) >= self._cache_limit:
            self._parsed.clear()
        pairs = parse_label_block(block)
        result: tuple[list[tuple[str, str]], DeviceKey | None] | None = None
        if pairs is not None:
            labels = dict(pairs)
            uuid = labels.get("UUID", labels.get("uuid"))
            key = None
            if uuid is not None:
                key = (unescape_label_value(uuid), unescape_label_value(labels.get(GPU_I_ID, "")))
            result = (pairs, key)
        self._parsed[block] = result
        return result

    def _block(self, block: str, plan: RewritePlan) -> _Block | None:
        hit = self._blocks.get(block, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        if len(self._blocks) >= self._cache_limit:
            self._blocks.clear()
        parsed = self._parse(block)
        out: _Block | None = None
        if parsed is not None:
            pairs, key = parsed
            identity = tuple((n, unescape_label_value(v)) for n, v in pairs if n in IDENTITY_LABELS)
            owner = plan.owners.get(key) if key is not None else None
            names = {n for n, _ in pairs}
            if owner is None or VGPU_LABEL in names:
                # Idle or unknown device, or dcgm-exporter's per-pod vGPU copies: keep as is
                # (re-rendered so escapes are normalised).
                new_pairs = [(n, unescape_label_value(v)) for n, v in pairs]
            else:
                scheme = (
                    OLD_SCHEME if ("pod_name" in names and "pod" not in names) else (CURRENT_SCHEME)
                )
                values = dict(
                    zip(scheme, (owner.namespace, owner.pod, owner.container), strict=True)
                )
                labels = dict(pairs)
                named = (
                    unescape_label_value(labels.get(scheme[0], "")),
                    unescape_label_value(labels.get(scheme[1], "")),
                )
                drop = _stale_pod_labels(plan, named, owner)
                if POD_UID_LABEL in names and (owner.uid or named != (owner.namespace, owner.pod)):
                    # The owner's UID; empty with the pod (shared) or when the watch does not
                    # know the owner. The upstream's stays only when it named the same pod
                    # and the owner's UID is unknown.
                    values[POD_UID_LABEL] = owner.uid
                new_pairs = [
                    (n, values.pop(n) if n in values else unescape_label_value(v))
                    for n, v in pairs
                    if n not in drop
                ]
                values.pop(POD_UID_LABEL, None)
                # Labels the upstream lacked are added in dcgm-exporter's order.
                for name in (scheme[2], scheme[0], scheme[1]):
                    if name in values:
                        new_pairs.append((name, values[name]))
            present = {n for n, _ in new_pairs}
            new_pairs.extend((n, "") for n in POD_GUARD_LABELS if n not in present)
            # The output cuts values (render_labels), so the identity is that of the cut ones:
            # two values that agree in their first MAX_LABEL_VALUE_LENGTH characters are one.
            canonical = "\xff".join(f"{n}\xfe{written_value(v)}" for n, v in sorted(new_pairs) if v)
            out = _Block(key, identity, render_labels(new_pairs), canonical)
        self._blocks[block] = out
        return out

    def rewrite(self, text: str, plan: RewritePlan) -> RewriteResult:
        """Rewrite ``text`` (upstream exposition) under ``plan``."""
        last = self._last
        if last is not None and (text is last[0] or text == last[0]) and plan == last[1]:
            # The upstream has not collected since the previous scrape: same answer.
            self.repeated_rewrites += 1
            return _copy_result(last[2], fast=True)
        template = self._template
        result: RewriteResult | None = None
        if template is not None:
            result = template.apply(text, plan)
            if result is not None:
                self.fast_rewrites += 1
                self._wasted = 0
            else:
                if template.hits == 0:
                    self._wasted += 1
                self._template = None
        if result is None:
            self.slow_rewrites += 1
            result, out_lines, out_sources = self._rewrite_lines(text, plan)
            if self._templates:
                self._slow_since_build += 1
                if self._wasted < _TEMPLATE_MISSES or self._slow_since_build >= _TEMPLATE_RETRY:
                    self._slow_since_build = 0
                    self.templates_built += 1
                    self._template = _build_template(text, plan, result, out_lines, out_sources)
        if self._templates:
            self._last = (text, plan, result)
            return _copy_result(result, fast=result.fast)
        return result

    def _rewrite_lines(
        self, text: str, plan: RewritePlan
    ) -> tuple[RewriteResult, list[str], list[int]]:
        """The line-by-line rewrite (the reference); also returns the output lines and, for
        each, the input line it came from (-1 for HELP and TYPE)."""
        if plan != self._plan:
            self._blocks.clear()
            self._plan = plan
        families: dict[str, _Family] = {}
        identities: dict[DeviceKey, tuple[tuple[str, str], ...]] = {}
        seen: set[str] = set()
        invalid = dup = reserved = samples = 0
        reserved_prefixes = plan.reserved_prefixes
        cur_name = ""
        cur_fam: _Family | None = None
        # Blocks of this text only: the cache handed to the next call holds no block that the
        # upstream stopped sending (pods come and go), so its size follows the payload's.
        used: dict[str, _Block | None] = {}
        spaced_value = _SPACED_VALUE_RE.fullmatch

        def family_for(name: str) -> _Family:
            fam = families.get(name)
            if fam is None:
                fam = families[name] = _Family(name)
            return fam

        for index, line in enumerate(text.split("\n")):
            if not line:
                continue
            if line[0] in _BLANK:
                line = line.lstrip(_BLANK)
                if not line:
                    continue
            if line[0] == "#":
                parts = split_comment(line)
                if len(parts) < 3 or parts[0] != "#" or parts[1] not in ("HELP", "TYPE"):
                    continue  # other comments carry nothing we need
                name = parts[2]
                if METRIC_NAME_RE.match(name) is None:
                    invalid += 1
                    continue
                if name.startswith(reserved_prefixes):
                    reserved += 1
                    continue
                rest = parts[3] if len(parts) > 3 else ""
                if parts[1] == "HELP":
                    if not valid_help(rest):
                        invalid += 1
                        continue
                    fam = family_for(name)
                    if fam.help is None:
                        fam.help = rest
                else:
                    typ = rest.strip(_BLANK)
                    if typ not in _VALID_TYPES:
                        invalid += 1
                        continue
                    fam = family_for(name)
                    if fam.type is None and not fam.lines:
                        fam.type = typ
                continue
            brace = line.find("{")
            if brace >= 0:
                name = line[:brace]
                close = line.rfind("}")
                if close < brace:
                    invalid += 1
                    continue
                raw_block = line[brace + 1 : close]
                value = line[close + 1 :]
            else:
                cut = _first_blank(line)
                name, value = line[:cut], line[cut:]
                raw_block = ""
            if name != cur_name or cur_fam is None:
                name = name.rstrip(_BLANK)
                if METRIC_NAME_RE.match(name) is None:
                    invalid += 1
                    continue
                if name.startswith(reserved_prefixes):
                    reserved += 1
                    continue
                cur_fam = self._sample_family(name, families)
                cur_name = name
            # The common value (" 123") is checked by one regex; anything else the long way.
            if spaced_value(value) is not None:
                value = value[1:]
            else:
                checked = valid_value(value)
                if checked is None:
                    invalid += 1
                    continue
                value = checked
            if raw_block:
                blk = used.get(raw_block)
                if blk is None:
                    blk = used[raw_block] = self._block(raw_block, plan)
                    if blk is None:
                        invalid += 1
                        continue
                if blk.key is not None and blk.key not in identities:
                    identities[blk.key] = blk.identity
                series = name + blk.new
                identity_key = name + "\xff" + blk.canonical
            else:
                series = name + _GUARD_BLOCK
                identity_key = name + "\xff"
            # Dedupe on the series identity Prometheus sees (sorted, empty labels dropped).
            if identity_key in seen:
                dup += 1
                continue
            seen.add(identity_key)
            cur_fam.lines.append(f"{series} {value}")
            cur_fam.sources.append(index)
            samples += 1

        self._blocks = used
        if len(self._parsed) > 2 * len(used) + 1024:
            self._parsed = {k: self._parsed[k] for k in used if k in self._parsed}

        out: list[str] = []
        sources: list[int] = []
        for fam in families.values():
            if fam.help is None and fam.type is None and not fam.lines:
                continue
            if fam.help is not None:
                out.append(f"# HELP {fam.name} {fam.help}" if fam.help else f"# HELP {fam.name}")
                sources.append(-1)
            if fam.type is not None:
                out.append(f"# TYPE {fam.name} {fam.type}")
                sources.append(-1)
            out.extend(fam.lines)
            sources.extend(fam.sources)
        body = "\n".join(out)
        result = RewriteResult(
            text=body + "\n" if body else "",
            identities=identities,
            samples=samples,
            invalid_lines=invalid,
            dropped_duplicates=dup,
            dropped_reserved=reserved,
        )
        return result, out, sources

    @staticmethod
    def _sample_family(name: str, families: dict[str, _Family]) -> _Family:
        fam = families.get(name)
        if fam is not None:
            return fam
        for typ, suffixes in _FAMILY_SUFFIXES.items():
            for suffix in suffixes:
                if name.endswith(suffix):
                    base = families.get(name[: -len(suffix)])
                    if base is not None and base.type == typ:
                        return base
        fam = families[name] = _Family(name)
        return fam


# --------------------------------------------------------------------------- rendering


@dataclass(slots=True)
class FamilyWriter:
    """Collects the enricher's own families and renders them as text exposition."""

    _families: dict[str, tuple[str, str, list[str]]] = field(default_factory=dict)

    def family(self, name: str, help_text: str, typ: str = "gauge") -> None:
        if name not in self._families:
            self._families[name] = (help_text, typ, [])

    def sample(
        self,
        name: str,
        labels: Iterable[tuple[str, str]],
        value: float,
        sample_name: str | None = None,
    ) -> None:
        self._families[name][2].append(
            f"{sample_name or name}{render_labels(labels)} {format_value(value)}"
        )

    def render(self, sort_key: Callable[[str], str] | None = None) -> str:
        out: list[str] = []
        for name, (help_text, typ, lines) in self._families.items():
            out.append(f"# HELP {name} {escape_help(help_text)}")
            out.append(f"# TYPE {name} {typ}")
            out.extend(sorted(lines, key=sort_key) if sort_key else lines)
        return "\n".join(out) + "\n" if out else ""
