"""Where the project's fetches go: the machine's own package configuration, never a host
written in the project.

``.ci/debian-mirror`` prints the Debian mirror the machine's apt sources name for its release;
``.ci/prometheus3``, ``.ci/compose`` (through ``.ci/sid-unpack``) and ``.ci/image-base`` take
it from there. It runs here on temporary apt sources (deb822 ``.sources``, one-line
``sources.list``, and none), through the environment variables it reads for that. And no
file of the project names a package registry or mirror host: the hosts looked for are the
ones this machine's own configuration uses (apt's sources, debootstrap's default mirror, pip's
default index, Docker's registry mirrors) plus any URL whose host says ``mirror``, so this
file names none either.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.one_python

MIRROR_SCRIPT = ROOT / ".ci" / "debian-mirror"
# Names under the reserved .test domain (RFC 2606): no machine's sources hold them.
ARCHIVE = "http://archive-one.test/debian"
OTHER = "http://archive-two.test/debian"
_URL_HOST = re.compile(r"\b[a-z][a-z0-9+.-]*://(?:[^@/\s]*@)?([A-Za-z0-9.-]+)")


def run_mirror(
    tmp_path: Path,
    *,
    sources: dict[str, str] | None = None,
    sources_list: str | None = None,
    codename: str = "bookworm",
    env: dict[str, str] | None = None,
    script: Path = MIRROR_SCRIPT,
    args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run a script with the mirror derivation pointed at temporary apt files."""
    parts = tmp_path / "sources.list.d"
    parts.mkdir(exist_ok=True)
    for name, text in (sources or {}).items():
        (parts / name).write_text(text)
    listing = tmp_path / "sources.list"
    if sources_list is not None:
        listing.write_text(sources_list)
    os_release = tmp_path / "os-release"
    os_release.write_text(f"ID=debian\nVERSION_CODENAME={codename}\n" if codename else "ID=x\n")
    full = {k: v for k, v in os.environ.items() if k != "ENRICHER_DEBIAN_MIRROR"}
    full |= {
        "ENRICHER_OS_RELEASE": str(os_release),
        "ENRICHER_APT_SOURCELIST": str(listing),
        "ENRICHER_APT_SOURCEPARTS": str(parts),
        **(env or {}),
    }
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, env=full, timeout=120, check=False
    )


DEB822 = f"""\
Types: deb
URIs: {OTHER}-security
Suites: bookworm-security
Components: main

# Switched off: not a source apt reads.
Types: deb
URIs: {OTHER}
Suites: bookworm
Components: main
Enabled: no

Types: deb deb-src
# a comment inside a stanza does not end it
URIs: {ARCHIVE}/
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""

ONE_LINE = f"""\
# deb {OTHER} bookworm main
deb-src {OTHER} bookworm main
deb {OTHER} bookworm-updates main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {ARCHIVE}/ bookworm main
"""


@pytest.mark.parametrize(
    "sources, sources_list",
    [
        ({"debian.sources": DEB822}, None),
        ({}, ONE_LINE),
        ({"local.list": ONE_LINE}, None),
        ({"debian.sources": DEB822}, f"deb {OTHER}-security bookworm-security main\n"),
    ],
    ids=["deb822", "sources.list", "one-line-in-parts", "both-forms"],
)
def test_mirror_of_the_release_from_the_sources(
    tmp_path: Path, sources: dict[str, str], sources_list: str | None
) -> None:
    """The first source apt would use for the release itself (no -updates or -security, no
    deb-src, no switched-off stanza, no comment), without a trailing slash."""
    done = run_mirror(tmp_path, sources=sources, sources_list=sources_list)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{ARCHIVE}\n"


def test_mirror_from_the_environment_wins(tmp_path: Path) -> None:
    done = run_mirror(
        tmp_path, sources={"debian.sources": DEB822}, env={"ENRICHER_DEBIAN_MIRROR": f"{OTHER}/"}
    )
    assert (done.returncode, done.stdout) == (0, f"{OTHER}\n")


@pytest.mark.parametrize(
    "sources, sources_list, codename",
    [
        ({}, None, "bookworm"),
        (
            {"debian.sources": DEB822.replace("bookworm bookworm-updates", "trixie")},
            None,
            "bookworm",
        ),
        ({}, ONE_LINE, "trixie"),
    ],
    ids=["no-sources", "other-release-only", "release-not-listed"],
)
def test_no_mirror_is_a_clear_error(
    tmp_path: Path, sources: dict[str, str], sources_list: str | None, codename: str
) -> None:
    done = run_mirror(tmp_path, sources=sources, sources_list=sources_list, codename=codename)
    assert done.returncode == 1
    assert done.stdout == ""
    assert f"no apt source names a Debian mirror for '{codename}'" in done.stderr
    assert "ENRICHER_DEBIAN_MIRROR" in done.stderr


def test_no_release_name_is_a_clear_error(tmp_path: Path) -> None:
    done = run_mirror(tmp_path, sources={"debian.sources": DEB822}, codename="")
    assert done.returncode == 1
    assert "names no VERSION_CODENAME" in done.stderr and "ENRICHER_DEBIAN_MIRROR" in done.stderr


@pytest.mark.parametrize(
    "script, args",
    [
        (ROOT / ".ci" / "sid-unpack", ("{tmp}/unpacked", "docker-compose=2.40*")),
        (ROOT / ".ci" / "image-base", ("{tmp}/cache",)),
    ],
    ids=["sid-unpack", "image-base"],
)
def test_fetching_scripts_stop_without_a_mirror(
    tmp_path: Path, script: Path, args: tuple[str, ...]
) -> None:
    """The scripts that fetch from Debian ask .ci/debian-mirror and stop with its message,
    before fetching anything, where the machine names no mirror."""
    if script.name == "image-base" and (
        os.geteuid() != 0
        or not (shutil.which("debootstrap") or Path("/usr/sbin/debootstrap").exists())
    ):
        pytest.skip("image-base stops earlier without root or debootstrap")
    args = tuple(a.format(tmp=tmp_path) for a in args)
    done = run_mirror(tmp_path, script=script, args=args)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no apt source names a Debian mirror for 'bookworm'" in done.stderr
    assert not (tmp_path / "unpacked").exists() and not list(tmp_path.glob("cache/*/*.tar"))


# --------------------------------------------------------------------------- no host names


def _hosts_in(text: str) -> set[str]:
    return {m.group(1).lower().rstrip(".") for m in _URL_HOST.finditer(text)}


def _is_name(host: str) -> bool:
    """A host name, not an address or localhost (a local apt proxy is no public host)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "." in host and host != "localhost"
    return False


def package_hosts() -> dict[str, str]:
    """The package registry and mirror hosts this machine's configuration uses: host -> where
    it was found."""
    found: dict[str, str] = {}
    apt = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in apt:
        if path.is_file():
            for host in _hosts_in(path.read_text(errors="replace")):
                found.setdefault(host, str(path))
    debootstrap = Path("/usr/sbin/debootstrap")
    if debootstrap.is_file():
        for line in debootstrap.read_text(errors="replace").splitlines():
            if line.startswith("DEF_") and "MIRROR=" in line:
                for host in _hosts_in(line):
                    found.setdefault(host, f"{debootstrap} (its default mirror)")
    try:
        from pip._internal.models.index import PyPI  # pip's default index and file host
    except ImportError:
        pass
    else:
        for host in (PyPI.netloc, PyPI.file_storage_domain):
            found.setdefault(host, "pip's default index")
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        for host in _hosts_in(os.environ.get(key, "")):
            found.setdefault(host, key)
    daemon = Path("/etc/docker/daemon.json")
    if daemon.is_file():
        try:
            mirrors = json.loads(daemon.read_text()).get("registry-mirrors") or []
        except (ValueError, AttributeError):
            mirrors = []
        for host in _hosts_in(" ".join(map(str, mirrors))):
            found.setdefault(host, f"{daemon} registry-mirrors")
    return {host: where for host, where in found.items() if _is_name(host)}


def project_files() -> Iterator[Path]:
    """Every file of the project: tracked, and new ones not ignored (others' work in progress)."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    for name in sorted(set(filter(None, listing.split("\0")))):
        path = ROOT / name
        if path.is_file() and not path.is_symlink():
            yield path


def test_no_package_host_is_written_in_the_project() -> None:
    if not (ROOT / ".git").exists() or not shutil.which("git"):
        pytest.skip("not a git checkout: no list of the project's files")
    hosts = package_hosts()
    assert hosts, "this machine's configuration names no package host (pip's default at least)"
    pattern = re.compile(
        r"(?<![A-Za-z0-9.-])(" + "|".join(map(re.escape, sorted(hosts))) + r")(?![A-Za-z0-9-])",
        re.IGNORECASE,
    )
    problems = []
    for path in project_files():
        text = path.read_bytes().decode("utf-8", errors="replace")
        rel = path.relative_to(ROOT)
        for number, line in enumerate(text.splitlines(), 1):
            for match in pattern.finditer(line):
                host = match.group(1).lower()
                problems.append(f"{rel}:{number}: {host} (this machine's {hosts[host]})")
            for host in _hosts_in(line):
                if "mirror" in host:
                    problems.append(f"{rel}:{number}: {host} (a mirror's URL)")
    assert not problems, (
        "package hosts belong to the machine's configuration, not the project "
        "(.ci/debian-mirror reads apt's):\n" + "\n".join(problems)
    )
