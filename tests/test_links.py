"""Links that resolve: a LICENSE, and no placeholder URL in anything the project ships.

The project names no public home, so nothing may point at one that does not exist
(``example.invalid``, ``example.com/org``, ``github.com/your-org``): every tracked file but the
tests' own fixtures, and what users install, as the real Helm renders the chart (every values
profile, and with prometheusRule.runbookUrl set) and the real kubectl builds the overlays.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .helmreleases import HelmRelease, releases, require
from .test_chart import PROFILES, render_text
from .test_manifests import ENTRY_POINTS, MANIFESTS, kustomize, needs_kubectl

# Checks a real part against what does not depend on the Python running the tests: `make test`
# runs this file in the highest Python's suite only (the marker's text in pyproject.toml).
pytestmark = pytest.mark.one_python

ROOT = Path(__file__).resolve().parent.parent
RUNBOOK_BASE = "https://git.corp.lan/gpu/dcgm-enricher/blob/v0.1.0/docs/runbook.md"
# Not shipped: the tests' fixtures name example domains on purpose (device vendors, e-mail
# addresses), and the changelog may quote what a release removed.
NOT_SHIPPED = ("tests/", "CHANGELOG.md")

_URL = re.compile(
    r"""\b[a-z][a-z0-9+.-]*://(?:[^/\s@"'<>]*@)?([^/\s:"'<>)\]`]+)(/[^\s"'<>)\]`]*)?"""
)
# Domains reserved for examples and tests (RFC 2606, RFC 6761), and the placeholders of Git
# hosting URLs that documentation templates leave behind.
_RESERVED_HOST = re.compile(r"(^|\.)(example\.(com|net|org)|example|invalid|test)$", re.I)
_PLACEHOLDER_PATH = re.compile(r"^/(org|your-?org|owner|user|username|your-?name)(/|$)", re.I)
_GIT_HOSTS = ("github.com", "gitlab.com", "bitbucket.org")


def placeholder_urls(text: str) -> list[str]:
    """The URLs in ``text`` that point at an example domain or a Git host's placeholder."""
    found = []
    for m in _URL.finditer(text):
        host, path = m.group(1).lower(), m.group(2) or ""
        if _RESERVED_HOST.search(host) or (host in _GIT_HOSTS and _PLACEHOLDER_PATH.match(path)):
            found.append(m.group(0))
    found += [f"(bare) {m}" for m in re.findall(r"\bexample\.invalid\b[^\s]*", text)]
    return sorted(set(found))


@pytest.mark.parametrize(
    ("text", "found"),
    [
        pytest.param(
            "runbook_url: https://example.invalid/dcgm-enricher/blob/main/docs/runbook.md#x",
            [
                "(bare) example.invalid/dcgm-enricher/blob/main/docs/runbook.md#x",
                "https://example.invalid/dcgm-enricher/blob/main/docs/runbook.md#x",
            ],
            id="example-invalid",
        ),
        pytest.param(
            "see https://example.com/org/repo.", ["https://example.com/org/repo."], id="example-com"
        ),
        pytest.param("http://docs.example.org", ["http://docs.example.org"], id="subdomain"),
        pytest.param(
            "git+https://github.com/your-org/x",
            ["git+https://github.com/your-org/x"],
            id="your-org",
        ),
        pytest.param(
            "https://gitlab.com/org/dcgm-enricher",
            ["https://gitlab.com/org/dcgm-enricher"],
            id="org",
        ),
        pytest.param("Source = 'https://ci.test/x'", ["https://ci.test/x"], id="dot-test"),
        pytest.param("https://prometheus.io/docs/ and http://localhost:9401/", [], id="real"),
        pytest.param("url=https://<host>/<path>/docs/runbook.md", [], id="template"),
        pytest.param("alice@example.com, example.com/fpga", [], id="not-urls"),
        pytest.param("https://github.com/NVIDIA/dcgm-exporter", [], id="real-repo"),
    ],
)
def test_placeholder_urls(text: str, found: list[str]) -> None:
    assert placeholder_urls(text) == found


def shipped_files() -> list[str]:
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    return [p for p in tracked.split("\0") if p and not p.startswith(NOT_SHIPPED)]


def test_no_shipped_file_holds_a_placeholder_url() -> None:
    files = shipped_files()
    assert {"LICENSE", "pyproject.toml", "Dockerfile", "docs/alerts.md"} <= set(files)
    bad = {}
    for name in files:
        path = ROOT / name
        if path.is_symlink() or not path.is_file():
            continue  # the chart's files/ link to the rules and the dashboard, scanned there
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        urls = placeholder_urls(data.decode("utf-8", "replace"))
        if urls:
            bad[name] = urls
    assert bad == {}


@pytest.fixture(params=releases(), ids=lambda r: r.id)
def helm(request: pytest.FixtureRequest) -> HelmRelease:
    return require(request.param)


@pytest.mark.parametrize("runbook_url", [None, RUNBOOK_BASE], ids=["default", "runbookUrl"])
def test_no_chart_render_holds_a_placeholder_url(
    helm: HelmRelease, runbook_url: str | None
) -> None:
    extra = () if runbook_url is None else ("--set", f"prometheusRule.runbookUrl={runbook_url}")
    for profile in PROFILES:
        text = render_text(helm, profile, *extra)
        assert placeholder_urls(text) == [], profile
        assert ("runbook_url:" in text) == (
            runbook_url is not None and "kind: PrometheusRule" in text
        )


@needs_kubectl
def test_no_kustomize_build_holds_a_placeholder_url() -> None:
    for entry in ENTRY_POINTS:
        text = "\n".join(str(d) for d in kustomize(MANIFESTS / entry.path))
        assert placeholder_urls(text) == [], entry.path
        assert "runbook_url" not in text  # set only from components/runbook-url


def test_license_is_the_apache_license_2_0() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    sections = [
        "Definitions",
        "Grant of Copyright License",
        "Grant of Patent License",
        "Redistribution",
        "Submission of Contributions",
        "Trademarks",
        "Disclaimer of Warranty",
        "Limitation of Liability",
        "Accepting Warranty or Additional Liability",
    ]
    for n, title in enumerate(sections, 1):
        assert re.search(rf"^\s+{n}\. {title}\.", text, re.M), title
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text
    # Where the machine has Debian's copy of the text (base-files), it is the same text.
    debian = Path("/usr/share/common-licenses/Apache-2.0")
    if debian.is_file():
        assert text == debian.read_text()
    # (a regex: tomllib is 3.11+)
    assert re.search(r'^license = "Apache-2.0"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "Dockerfile").read_text()
