"""Prometheus text exposition: escaping, value formatting and the upstream rewrite.

Everything here is pure. The rewrite is the hot path: it works line by line on the upstream
text, parses each distinct label block once (blocks repeat across families: one per device),
and regroups lines by family so the output is always valid exposition even when the upstream's
is not (interleaved families, duplicate HELP lines, junk lines).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
# One label pair inside a block: name, optional spaces, =, quoted value with escapes.
_PAIR_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*(,|\Z)')
_ESCAPE_RE = re.compile(r"\\(.)")
_VALID_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_FAMILY_SUFFIXES = {
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
}
_SPECIAL_VALUES = frozenset({"NaN", "+Inf", "-Inf", "Inf", "+inf", "-inf", "inf", "nan"})

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
# (namespace, pod, container) label names per dcgm-exporter naming scheme.
CURRENT_SCHEME = ("namespace", "pod", "container")
OLD_SCHEME = ("pod_namespace", "pod_name", "container_name")
VGPU_LABEL = "vgpu"
# Every upstream series leaves with these labels, empty when no pod is known. Prometheus
# drops empty labels on ingestion, but with honor_labels: true an explicit empty value stops
# the scrape target's own pod/namespace/container (the enricher's pod) from being attached:
# a series about a GPU must never name the monitoring pod.
POD_GUARD_LABELS = ("container", "namespace", "pod")
_GUARD_BLOCK = "{" + ",".join(f'{n}=""' for n in POD_GUARD_LABELS) + "}"

MAX_LABEL_VALUE_LENGTH = 1024


def escape_label_value(value: str, limit: int = MAX_LABEL_VALUE_LENGTH) -> str:
    """Escape a label value for the text format (backslash, double quote, newline).

    Values are cut to ``limit`` characters first so a hostile annotation cannot blow up a scrape.
    """
    if len(value) > limit:
        value = value[:limit]
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def escape_help(text: str) -> str:
    """Escape HELP text (backslash and newline)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def unescape_help(raw: str) -> str:
    r"""Undo HELP escaping (``\\`` and ``\n``); other backslashes stand for themselves."""
    if "\\" not in raw:
        return raw
    return re.sub(r"\\([\\n])", lambda m: "\n" if m.group(1) == "n" else "\\", raw)


def unescape_label_value(raw: str) -> str:
    r"""Undo text-format escaping; unknown escapes keep the character (``\x`` -> ``x``)."""
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
    scrape, so the caller drops that one line instead. Duplicate names are invalid.
    """
    pairs: list[tuple[str, str]] = []
    pos = 0
    end = len(block)
    if block.strip() == "":
        return pairs
    seen: set[str] = set()
    while pos < end:
        m = _PAIR_RE.match(block, pos)
        if m is None:
            return None
        name, raw = m.group(1), m.group(2)
        if name in seen:
            return None
        seen.add(name)
        pairs.append((name, raw))
        pos = m.end()
        if m.group(3) == "" and pos < end:
            return None
    return pairs


def _valid_value(text: str) -> bool:
    parts = text.split()
    if not parts or len(parts) > 2:
        return False
    if parts[0] not in _SPECIAL_VALUES:
        try:
            float(parts[0])
        except ValueError:
            return False
        if "_" in parts[0]:  # Python accepts 1_000, Prometheus does not
            return False
    if len(parts) == 2:
        ts = parts[1]
        if not (ts.lstrip("-").isdigit()):
            return False
    return True


# --------------------------------------------------------------------------- rewrite plan


DeviceKey = tuple[str, str]  # (GPU UUID, GPU_I_ID or "" for a whole GPU)


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a device series names. ``pod`` empty means: clear the pod labels (shared device)."""

    namespace: str
    pod: str
    container: str

    @property
    def shared(self) -> bool:
        return self.pod == ""


SHARED = Owner("", "", "")


@dataclass(frozen=True, slots=True)
class RewritePlan:
    """What to write on device series: owners by device key; devices absent keep upstream labels."""

    owners: Mapping[DeviceKey, Owner] = field(default_factory=dict)
    # Family names the enricher renders itself; upstream families with these names are dropped.
    reserved_prefixes: tuple[str, ...] = (
        "gpu_container_",
        "gpu_process_",
        "gpu_unattributed_",
        "gpu_pod_info",
        "dcgm_enricher_",
    )


@dataclass(slots=True)
class RewriteResult:
    text: str  # the rewritten exposition, newline-terminated (or empty)
    identities: dict[DeviceKey, tuple[tuple[str, str], ...]]  # device -> identity label pairs
    samples: int
    invalid_lines: int
    dropped_duplicates: int
    dropped_reserved: int


@dataclass(slots=True)
class _Family:
    name: str
    help: str | None = None
    type: str | None = None
    lines: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Block:
    """A parsed upstream label block and what the current plan makes of it."""

    key: DeviceKey | None
    identity: tuple[tuple[str, str], ...]
    new: str  # the rewritten block text including braces


class Rewriter:
    """Rewrites upstream exposition according to a plan, caching per distinct label block.

    One instance lives as long as the server; the caches are bounded and reset when the plan
    changes (the parse of a block never changes, so that part of the cache survives).
    """

    def __init__(self, cache_limit: int = 200_000) -> None:
        self._parsed: dict[str, tuple[list[tuple[str, str]], DeviceKey | None] | None] = {}
        self._blocks: dict[str, _Block | None] = {}
        self._plan: RewritePlan | None = None
        self._cache_limit = cache_limit

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
                new_pairs = [
                    (n, values.pop(n) if n in values else unescape_label_value(v)) for n, v in pairs
                ]
                # Labels the upstream lacked are added in dcgm-exporter's order.
                for name in (scheme[2], scheme[0], scheme[1]):
                    if name in values:
                        new_pairs.append((name, values[name]))
            present = {n for n, _ in new_pairs}
            new_pairs.extend((n, "") for n in POD_GUARD_LABELS if n not in present)
            out = _Block(key, identity, render_labels(new_pairs))
        self._blocks[block] = out
        return out

    def rewrite(self, text: str, plan: RewritePlan) -> RewriteResult:
        """Rewrite ``text`` (upstream exposition) under ``plan``."""
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
        block_cache = self._blocks

        def family_for(name: str) -> _Family:
            fam = families.get(name)
            if fam is None:
                fam = families[name] = _Family(name)
            return fam

        for line in text.split("\n"):
            if not line:
                continue
            if line[0] == "#":
                parts = line.split(None, 3)
                if len(parts) < 3 or parts[0] != "#" or parts[1] not in ("HELP", "TYPE"):
                    continue  # other comments carry nothing we need
                name = parts[2]
                if METRIC_NAME_RE.match(name) is None:
                    invalid += 1
                    continue
                if name.startswith(reserved_prefixes):
                    reserved += 1
                    continue
                fam = family_for(name)
                rest = parts[3] if len(parts) > 3 else ""
                if parts[1] == "HELP":
                    if fam.help is None:
                        fam.help = escape_help(unescape_help(rest))
                else:
                    typ = rest.strip()
                    if fam.type is None and typ in _VALID_TYPES and not fam.lines:
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
                name, _, value = line.partition(" ")
                raw_block = ""
            if name != cur_name or cur_fam is None:
                name = name.strip()
                if METRIC_NAME_RE.match(name) is None:
                    invalid += 1
                    continue
                if name.startswith(reserved_prefixes):
                    reserved += 1
                    continue
                cur_fam = self._sample_family(name, families)
                cur_name = name
            if not _valid_value(value):
                invalid += 1
                continue
            if raw_block:
                blk = block_cache.get(raw_block)
                if blk is None:
                    blk = self._block(raw_block, plan)
                    if blk is None:
                        invalid += 1
                        continue
                if blk.key is not None and blk.key not in identities:
                    identities[blk.key] = blk.identity
                new_line = f"{name}{blk.new} {value.strip()}"
                series = name + blk.new
            else:
                new_line = f"{name}{_GUARD_BLOCK} {value.strip()}"
                series = name
            if series in seen:
                dup += 1
                continue
            seen.add(series)
            cur_fam.lines.append(new_line)
            samples += 1

        out: list[str] = []
        for fam in families.values():
            if fam.help is None and fam.type is None and not fam.lines:
                continue
            if fam.help is not None:
                out.append(f"# HELP {fam.name} {fam.help}" if fam.help else f"# HELP {fam.name}")
            if fam.type is not None:
                out.append(f"# TYPE {fam.name} {fam.type}")
            out.extend(fam.lines)
        body = "\n".join(out)
        return RewriteResult(
            text=body + "\n" if body else "",
            identities=identities,
            samples=samples,
            invalid_lines=invalid,
            dropped_duplicates=dup,
            dropped_reserved=reserved,
        )

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
