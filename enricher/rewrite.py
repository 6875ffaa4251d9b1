"""The upstream rewrite: dcgm-exporter's exposition in, the same samples with the plan's pod
labels out. The hot path.

It works line by line on the upstream text, parses each distinct label block once (blocks
repeat across families: one per device), and regroups lines by family so the output is always
valid exposition even when the upstream's is not (interleaved families, duplicate HELP lines,
junk lines). Texts that differ from the previous one only in their values skip the per-line
work through a template (see Rewriter). What a label block becomes is ``labels.relabel``'s.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .labels import (
    POD_UID_LABEL,
    VGPU_LABEL,
    DeviceKey,
    RewritePlan,
    device_identity,
    device_key,
    relabel,
)
from .textformat import (
    BLANK,
    FAMILY_SUFFIXES,
    METRIC_NAME_RE,
    VALID_TYPES,
    WatchedLine,
    first_blank,
    parse_label_block,
    render_labels,
    split_comment,
    split_sample_line,
    valid_help,
    valid_value,
    watched_lines,
    watched_spans,
    written_value,
)


@dataclass(slots=True)
class RewriteResult:
    text: str  # the rewritten exposition, newline-terminated (or empty)
    identities: dict[DeviceKey, tuple[tuple[str, str], ...]]  # device -> identity label pairs
    samples: int
    invalid_lines: int
    dropped_duplicates: int
    dropped_reserved: int
    fast: bool = False  # served without the line-by-line pass (template or repeated text)
    # The input's sample lines of the watched names (Rewriter(watch=...)), each name's in input
    # order, names in watch order, split (textformat.WatchedLine): what a reader of those
    # families needs, without searching the whole text again.
    watched: tuple[WatchedLine, ...] = ()
    # The same number on every result whose input has the same lines as the one the template
    # was built from but for the values (the template's proof obligation), so the families it
    # declares are the same; 0 where no template vouches for that.
    shape: int = 0


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
    # The watched lines: (name, head, tail before the value, slot) per line; slot -1: the
    # line is (name, head, tail) as it is. The heads are the same strings on every apply.
    watch_parts: list[tuple[str, str, str, int]] = field(default_factory=list)
    hits: int = 0
    shape: int = 0  # numbers the template (RewriteResult.shape)

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
            watched=tuple(
                (name, head, tail + values[slot] if slot >= 0 else tail)
                for name, head, tail, slot in self.watch_parts
            ),
            shape=self.shape,
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
        watched=result.watched,
        shape=result.shape,
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


def _watch_parts(
    text: str,
    spans: list[tuple[str, int, int]],
    slot_of_line: dict[int, int],
    values: list[str],
) -> list[tuple[str, str, str, int]] | None:
    """Each watched line as (name, head, the tail before the value, its slot), or as its
    WatchedLine with slot -1 when it has no value slot (the template proves such a line
    unchanged); None if a slot line does not split before its value (it always does: a
    value slot runs from the line's first "} " to its end, and holds no brace)."""
    lines = [0] * len(spans)  # each span's input line number, as text.split("\n") numbers them
    pos = count = 0
    for i in sorted(range(len(spans)), key=lambda i: spans[i][1]):
        start = spans[i][1]
        count += text.count("\n", pos, start)
        pos = start
        lines[i] = count
    parts: list[tuple[str, str, str, int]] = []
    for (name, start, stop), line_no in zip(spans, lines, strict=True):
        name, head, tail = split_sample_line(name, text[start:stop])
        slot = slot_of_line.get(line_no)
        if slot is None:
            parts.append((name, head, tail, -1))
            continue
        value = values[slot]
        if not value or not tail.endswith(value):
            return None
        parts.append((name, head, tail[: len(tail) - len(value)], slot))
    return parts


def _build_template(
    text: str,
    plan: RewritePlan,
    result: RewriteResult,
    out_lines: list[str],
    out_sources: list[int],
    watched: list[tuple[str, int, int]],
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
    watch_parts = _watch_parts(text, watched, slot_of_line, values)
    if watch_parts is None:
        return None
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
        watch_parts=watch_parts,
    )


class Rewriter:
    """Rewrites upstream exposition according to a plan, caching per distinct label block.

    One instance lives as long as the server. Its caches hold what the last text needed: the
    rewritten blocks (dropped when the plan changes; their parse survives that), one template
    and the last result, so memory follows the payload, not the uptime.

    Consecutive scrapes of dcgm-exporter differ only in their values, so after each
    line-by-line rewrite the rewriter keeps one template (input and output with the values
    cut out). The next text that differs from the previous one only in its values is
    rewritten by one regex pass that finds the values, one that checks them, one comparison
    that proves the rest is unchanged, and one join: no Python code per line. The same text
    and plan as the previous call (the exporter has not collected since) return the previous
    result. Anything else takes the line-by-line path, which is the reference: the tests
    compare both paths with it and with prometheus_client's parser. ``templates=False``
    keeps to that path (and no result cache) for comparison. The template earns its code in
    ``python -m bench --only rewrite``: the line-by-line path alone misses the target of at
    most 4 limit passes on ``mig56`` (bench/README.md), the template meets it.
    """

    def __init__(
        self, cache_limit: int = 200_000, *, templates: bool = True, watch: tuple[str, ...] = ()
    ) -> None:
        """``watch``: metric names whose sample lines each result also hands over as they came
        (``RewriteResult.watched``)."""
        self._watch = watch
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
        self._shapes = itertools.count(1)

    def _parse(self, block: str) -> tuple[list[tuple[str, str]], DeviceKey | None] | None:
        hit = self._parsed.get(block, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        if len(self._parsed) >= self._cache_limit:
            self._parsed.clear()
        pairs = parse_label_block(block)
        result = None if pairs is None else (pairs, device_key(pairs))
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
            new_pairs = relabel(pairs, key, plan)
            # On a device the plan gives an owner, a pod's copy (dcgm-exporter 4.8.2 on,
            # --kubernetes-virtual-gpus, with pod_uid) and the device's own series (without)
            # name the same pod once relabelled: one series, the first (the device's, which
            # dcgm-exporter writes first), not a share beside the device to be summed with it.
            # Copies marked vgpu keep their labels and stay apart.
            ignored = (
                POD_UID_LABEL
                if key is not None and key in plan.owners and all(n != VGPU_LABEL for n, _ in pairs)
                else ""
            )
            # The output cuts values (render_labels), so the identity is that of the cut ones:
            # two values that agree in their first MAX_LABEL_VALUE_LENGTH characters are one.
            canonical = "\xff".join(
                f"{n}\xfe{written_value(v)}" for n, v in sorted(new_pairs) if v and n != ignored
            )
            out = _Block(key, device_identity(pairs), render_labels(new_pairs), canonical)
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
            spans = watched_spans(text, self._watch)
            result.watched = tuple(watched_lines(text, self._watch, spans))
            if self._templates:
                self._slow_since_build += 1
                if self._wasted < _TEMPLATE_MISSES or self._slow_since_build >= _TEMPLATE_RETRY:
                    self._slow_since_build = 0
                    self.templates_built += 1
                    self._template = _build_template(
                        text, plan, result, out_lines, out_sources, spans
                    )
                    if self._template is not None:
                        self._template.shape = next(self._shapes)
                        result.shape = self._template.shape
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
        # What a series the upstream wrote without labels leaves with (the guards, the node).
        bare = render_labels(relabel((), None, plan))

        def family_for(name: str) -> _Family:
            fam = families.get(name)
            if fam is None:
                fam = families[name] = _Family(name)
            return fam

        for index, line in enumerate(text.split("\n")):
            if not line:
                continue
            if line[0] in BLANK:
                line = line.lstrip(BLANK)
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
                    typ = rest.strip(BLANK)
                    if typ not in VALID_TYPES:
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
                cut = first_blank(line)
                name, value = line[:cut], line[cut:]
                raw_block = ""
            if name != cur_name or cur_fam is None:
                name = name.rstrip(BLANK)
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
                series = name + bare
                identity_key = name + "\xff"
            # Dedupe on the series identity Prometheus sees (sorted, empty labels dropped).
            if identity_key in seen:
                dup += 1
                continue
            seen.add(identity_key)
            cur_fam.lines.append(f"{series} {value}")
            cur_fam.sources.append(index)
            samples += 1

        # Both caches keep the blocks of this text only (a block of a pod that left is not
        # kept for a return that may never come): under pod churn a bound of a fixed size
        # would fill with departed pods' blocks over hours and show as growth.
        self._blocks = used
        if len(self._parsed) > len(used):
            parsed = self._parsed
            self._parsed = {k: parsed[k] for k in used if k in parsed}

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
        for typ, suffixes in FAMILY_SUFFIXES.items():
            for suffix in suffixes:
                if name.endswith(suffix):
                    base = families.get(name[: -len(suffix)])
                    if base is not None and base.type == typ:
                        return base
        fam = families[name] = _Family(name)
        return fam
