"""The release process of docs/release.md, as far as this machine can run it.

``make release-check`` runs in a copy of the checkout's release files made a git repository of
its own, with CHANGELOG.md's Unreleased section turned into the release's dated one as the
process says: it must refuse every inconsistency it names (a version that differs, no dated
section, a leftover Unreleased section, uncommitted changes, another tag on HEAD) before
building anything, and then build the sdist, the wheel from that sdist (``python -m build``),
``twine check`` them and package the chart with its version and appVersion. The image
targets' labels and their multi-arch path are read from ``make -n`` (no buildx here: the
single-arch path is the one built, by tests/imagebuild.py's ``make image``).

The ``image`` test pushes the session's image (``make image-push``, no second build: the layer
cache answers) and the packaged chart (``helm push``) to a real registry, Debian's
``docker-registry`` on loopback, then installs the chart from ``oci://`` with Helm 3 and
Helm 4 (``helm install --dry-run=client``: no cluster here) and reads what it would deploy.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.ports import free_port
from devkit.processes import stop_process

from .conftest import ROOT
from .dockerengine import Engine, skip_or_fail
from .helmreleases import HelmRelease, releases, require
from .imagebuild import IMAGE, Built, make_image, project_version

# What release-check reads and builds from (the sdist's inputs, the chart and the files that
# state the version), copied as git tracks them: no generated stubs, no caches.
RELEASE_FILES = (
    ".gitignore",
    "Makefile",
    "pyproject.toml",
    "MANIFEST.in",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "Dockerfile",
    "enricher",
    "charts",
    "manifests",
    "deploy",
)
GIT = ("git", "-c", "user.name=release", "-c", "user.email=release@localhost")
CHART = "dcgm-enricher"


def make(tree: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``make`` in ``tree``, outside any make that runs the tests (no jobserver, no -k)."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(tree), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def git(tree: Path, *args: str) -> str:
    done = subprocess.run(
        [*GIT, "-C", str(tree), *args], capture_output=True, text=True, check=True
    )
    return done.stdout


def released_changelog(text: str, version: str, day: str) -> str:
    """CHANGELOG.md as the release process leaves it: Unreleased becomes ``version / day``."""
    assert "\n## Unreleased\n" in text, "CHANGELOG.md has no Unreleased section to release"
    return text.replace("\n## Unreleased\n", f"\n## {version} / {day}\n", 1)


@pytest.fixture(scope="session")
def release_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed copy of the release files with the release's CHANGELOG section."""
    tree = tmp_path_factory.mktemp("release") / "src"
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", *RELEASE_FILES],
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        skip_or_fail("the release files are read from git, and this checkout is no git work tree")
    for name in listed.stdout.decode().split("\0"):
        if name:
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    changelog = tree / "CHANGELOG.md"
    today = datetime.date.today().isoformat()
    changelog.write_text(released_changelog(changelog.read_text(), project_version(), today))
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", f"Release {project_version()}")
    return tree


def helm4() -> HelmRelease:
    return require(releases()[-1])


@pytest.fixture(scope="session")
def release_dist(release_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make release-check``'s dist folder (built once: the registry test pushes its chart)."""
    version = project_version()
    git(release_tree, "tag", f"v{version}")
    dist = tmp_path_factory.mktemp("dist")
    done = make(
        release_tree,
        "release-check",
        f"TOOLS={Path(sys.executable).parent}",
        f"HELM={helm4().helm}",
        f"DIST={dist}",
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "PASSED" in done.stdout  # twine check's verdict, one per file
    return dist


# --------------------------------------------------------------------------- release-check


def test_release_check_builds_the_release(release_dist: Path) -> None:
    """The sdist builds the wheel (python -m build builds it from the sdist), both pass
    twine check, and the chart is packaged with the version as its appVersion."""
    v = project_version()
    names = sorted(p.name for p in release_dist.iterdir())
    assert names == [
        f"{CHART}-{v}.tgz",
        f"dcgm_enricher-{v}-py3-none-any.whl",
        f"dcgm_enricher-{v}.tar.gz",
    ]
    with tarfile.open(release_dist / f"dcgm_enricher-{v}.tar.gz") as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    # What the wheel's build step needs, and none of what it generates.
    assert {"enricher/proto/api.proto", "enricher/_build/protostubs.py"} <= members
    assert not [m for m in members if m.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"))]
    with zipfile.ZipFile(release_dist / f"dcgm_enricher-{v}-py3-none-any.whl") as wheel:
        files = set(wheel.namelist())
    assert "enricher/proto/api_pb2_grpc.py" in files  # generated by the build from the sdist
    assert not [f for f in files if f.startswith("enricher/_build")]
    with tarfile.open(release_dist / f"{CHART}-{v}.tgz") as chart:
        member = chart.extractfile(f"{CHART}/Chart.yaml")
        assert member is not None
        meta = yaml.safe_load(member.read())
    assert (meta["version"], meta["appVersion"]) == (v, v)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} has no {old!r}"
    path.write_text(text.replace(old, new, 1))


REFUSALS = {
    "changelog-unreleased": "CHANGELOG.md has no section '## {v} / YYYY-MM-DD'",
    "changelog-leftover": "CHANGELOG.md still has an Unreleased section",
    "chart-app-version": "charts/dcgm-enricher/Chart.yaml's appVersion is not {v}",
    "chart-version": "charts/dcgm-enricher/Chart.yaml's version is not {v}",
    "dockerfile": "the Dockerfile's ARG VERSION is not {v}",
    "manifest-tag": "manifests/ or deploy/ pin the image as dcgm-enricher:9.9.9, not {v}",
    "package": "enricher/__init__.py's __version__ is not {v}",
    "not-semver": "pyproject.toml's version '{v}.dev1' is not X.Y.Z",
    "uncommitted": "the work tree has uncommitted changes",
    "other-tag": "HEAD is tagged v0.0.1, not v{v}",
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_release_check_refuses(release_tree: Path, case: str, tmp_path: Path) -> None:
    """Each inconsistency stops release-check with its message, before anything is built."""
    v = project_version()
    day = datetime.date.today().isoformat()
    tree = release_tree
    if case == "changelog-unreleased":
        _edit(tree / "CHANGELOG.md", f"\n## {v} / {day}\n", "\n## Unreleased\n")
    elif case == "changelog-leftover":
        _edit(tree / "CHANGELOG.md", f"\n## {v} / {day}\n", f"\n## Unreleased\n\n## {v} / {day}\n")
    elif case == "chart-app-version":
        _edit(tree / "charts/dcgm-enricher/Chart.yaml", f'appVersion: "{v}"', 'appVersion: "9.9.9"')
    elif case == "chart-version":
        _edit(tree / "charts/dcgm-enricher/Chart.yaml", f"\nversion: {v}", "\nversion: 9.9.9")
    elif case == "dockerfile":
        _edit(tree / "Dockerfile", f"ARG VERSION={v}", "ARG VERSION=9.9.9")
    elif case == "manifest-tag":
        sidecar = tree / "manifests/overlays/sidecar/daemonset.yaml"
        _edit(sidecar, f"image: dcgm-enricher:{v}", "image: dcgm-enricher:9.9.9")
    elif case == "package":
        _edit(tree / "enricher/__init__.py", f'"{v}"', '"9.9.9"')
    elif case == "not-semver":
        _edit(tree / "pyproject.toml", f'version = "{v}"', f'version = "{v}.dev1"')
    elif case == "uncommitted":
        (tree / "notes.txt").write_text("not committed\n")
    elif case == "other-tag":
        git(tree, "tag", "v0.0.1")
    try:
        done = make(tree, "release-check", "HELM=false", "TOOLS=/nonexistent", f"DIST={tmp_path}")
        assert done.returncode != 0
        assert done.stderr.splitlines()[0] == "release-check: " + REFUSALS[case].format(v=v)
        assert not list(tmp_path.iterdir())  # refused before building anything
    finally:
        git(tree, "checkout", "-q", "--", ".")
        git(tree, "clean", "-fdq")
        if case == "other-tag":
            git(tree, "tag", "-d", "v0.0.1")


# --------------------------------------------------------------------------- the image targets


@pytest.mark.parametrize(
    "origin, source",
    [
        pytest.param(None, None, id="no-origin"),
        pytest.param("/srv/git/dcgm-enricher", None, id="local-path"),
        pytest.param("file:///srv/git/dcgm-enricher.git", None, id="file-url"),
        pytest.param(
            "https://ci:s3cret@git.example.com/gpu/dcgm-enricher.git",
            "https://git.example.com/gpu/dcgm-enricher",
            id="https-credentials-dropped",
        ),
        pytest.param(
            "git@git.example.com:gpu/dcgm-enricher.git",
            "https://git.example.com/gpu/dcgm-enricher",
            id="scp-like-ssh",
        ),
        pytest.param(
            "ssh://git@git.example.com:2222/gpu/dcgm-enricher/",
            "https://git.example.com/gpu/dcgm-enricher",
            id="ssh-url",
        ),
    ],
)
def test_image_labels(tmp_path: Path, origin: str | None, source: str | None) -> None:
    """``make image`` labels the version, the commit and, only from a URL, the source."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    git(tmp_path, "init", "-q")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "x")
    if origin is not None:
        git(tmp_path, "remote", "add", "origin", origin)
    head = git(tmp_path, "rev-parse", "HEAD").strip()
    done = make(tmp_path, "-n", "image")
    assert done.returncode == 0, done.stderr
    argv = done.stdout.split()
    tag = f"dcgm-enricher:{project_version()}"  # the Makefile's default IMAGE
    assert argv[:2] == ["docker", "build"] and argv[-3:] == ["--tag", tag, "."]
    labels = [argv[i + 1] for i, a in enumerate(argv) if a == "--label"]
    want = [f"org.opencontainers.image.revision={head}"]
    if source is not None:
        want.append(f"org.opencontainers.image.source={source}")
    assert labels == want
    assert f"VERSION={project_version()}" in argv
    assert "s3cret" not in done.stdout


def test_image_push_paths(tmp_path: Path) -> None:
    """image-push wants a REGISTRY; with PLATFORMS both targets go through buildx, and the
    multi-arch push is one ``buildx build --push`` (a multi-platform image cannot be loaded
    into the engine's image store to be tagged and pushed)."""
    v = project_version()
    refused = make(ROOT, "image-push")
    assert refused.returncode != 0
    assert "make image-push: say where, e.g. REGISTRY=" in refused.stderr
    plain = make(ROOT, "-n", "image-push", "REGISTRY=registry.example.com/gpu").stdout
    assert f"docker tag dcgm-enricher:{v} registry.example.com/gpu/dcgm-enricher:{v}" in plain
    assert f"docker push registry.example.com/gpu/dcgm-enricher:{v}" in plain
    platforms = "PLATFORMS=linux/amd64,linux/arm64"
    out = make(ROOT, "-n", "image-push", "REGISTRY=r.example.com/gpu", platforms).stdout
    multi = out.splitlines()[-1].split()  # after the REGISTRY check
    assert multi[:5] == ["docker", "buildx", "build", "--platform", "linux/amd64,linux/arm64"]
    assert multi[-4:] == ["--tag", f"r.example.com/gpu/dcgm-enricher:{v}", "--push", "."]
    built = make(ROOT, "-n", "image", platforms).stdout.split()
    assert built[:3] == ["docker", "buildx", "build"] and "--push" not in built


# --------------------------------------------------------------------------- docs/release.md


def enricher_pod(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The DaemonSet's pod spec and its enricher container."""
    (ds,) = [d for d in objects if d["kind"] == "DaemonSet" and d["metadata"]["name"] == CHART]
    spec = ds["spec"]["template"]["spec"]
    (enricher,) = [c for c in spec["containers"] if c["name"] == "dcgm-enricher"]
    return spec, enricher


def test_documented_ways_to_your_image(tmp_path: Path) -> None:
    """docs/release.md's kustomization (kustomize's ``images:`` and the pull secret's patch)
    and its ``helm install`` with ``image.repository`` and ``imagePullSecrets``, as written,
    deploy the image pushed to your registry: the real kubectl kustomize and Helm 4 build them."""
    text = (ROOT / "docs" / "release.md").read_text()
    (block,) = [b for b in re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S) if "images:" in b]
    kustomization = yaml.safe_load(block)
    (entry,) = kustomization["images"]
    pushed = f"{entry['newName']}:{entry['newTag']}"
    assert entry["newTag"] == project_version()
    # "Beside your checkout": here the checkout is ROOT, the kustomization a sibling of it.
    (resource,) = kustomization["resources"]
    assert resource == "../dcgm-enricher/manifests/overlays/sidecar"
    overlay = ROOT / resource.removeprefix("../dcgm-enricher/")
    kustomization["resources"] = [os.path.relpath(overlay, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        skip_or_fail("no kubectl: apt-get install kubectl (.ci/system-deps)")
        return
    built = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, built.stderr
    spec, enricher = enricher_pod([d for d in yaml.safe_load_all(built.stdout) if d])
    assert enricher["image"] == pushed
    assert spec["imagePullSecrets"] == [{"name": "registry-login"}]

    (install,) = [
        shlex.split(c)
        for block in re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)
        for c in re.sub(r"\\\n\s*", " ", block).splitlines()
        if c.startswith("helm install") and "./charts/dcgm-enricher" in c
    ]
    rendered = subprocess.run(
        [helm4().helm, "template", *install[2:]],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    spec, enricher = enricher_pod([d for d in yaml.safe_load_all(rendered.stdout) if d])
    assert enricher["image"] == pushed  # image.tag empty: the chart's appVersion
    assert spec["imagePullSecrets"] == [{"name": "registry-login"}]


# --------------------------------------------------------------------------- an OCI registry


@contextlib.contextmanager
def oci_registry(folder: Path) -> Iterator[str]:
    """Debian's docker-registry (the CNCF Distribution registry) on loopback, plain HTTP,
    storing in ``folder``: its host:port."""
    binary = shutil.which("docker-registry")
    if binary is None:
        skip_or_fail("no docker-registry: apt-get install docker-registry (.ci/system-deps)")
        raise AssertionError  # not reached: skip_or_fail raises
    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(folder / "data")}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "test-only"},
    }
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    log = (folder / "registry.log").open("wb")
    proc = subprocess.Popen([binary, "serve", str(folder / "config.yml")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        "docker-registry did not start:\n" + (folder / "registry.log").read_text()
                    )
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc)
        log.close()


def registry_get(url: str, accept: str = "application/json") -> tuple[dict[str, Any], str]:
    """A registry API document and its Docker-Content-Digest header."""
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read()), response.headers.get("Docker-Content-Digest", "")


def run_helm(release: HelmRelease, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Helm with its cache, config, data and registry login in ``home``, and no cluster."""
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "HELM_REGISTRY_CONFIG": str(home / "registry.json"),
        "KUBECONFIG": str(home / "no-kubeconfig"),
    }
    return subprocess.run(
        [release.helm, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


@pytest.mark.image
def test_image_and_chart_through_an_oci_registry(
    real_docker: Engine, built_image: Built, release_dist: Path, tmp_path: Path
) -> None:
    v = project_version()
    with oci_registry(tmp_path) as registry:
        # The session's image, pushed as a user pushes it: make image-push REGISTRY=...
        pushed = make_image(real_docker, "image-push", f"REGISTRY={registry}")
        ref = f"{registry}/dcgm-enricher:{v}"
        assert f"docker push {ref}" in pushed
        tags, _ = registry_get(f"http://{registry}/v2/dcgm-enricher/tags/list")
        assert tags["tags"] == [v]
        manifest, digest = registry_get(
            f"http://{registry}/v2/dcgm-enricher/manifests/{v}",
            "application/vnd.docker.distribution.manifest.v2+json",
        )
        # The registry holds the image the session built: same config, same labels.
        image_id = real_docker.docker("image", "inspect", "--format", "{{.Id}}", IMAGE).strip()
        assert manifest["config"]["digest"] == image_id
        repo_digests = real_docker.docker(
            "image", "inspect", "--format", "{{json .RepoDigests}}", ref
        )
        assert f"{registry}/dcgm-enricher@{digest}" in json.loads(repo_digests)
        config, _ = registry_get(
            f"http://{registry}/v2/dcgm-enricher/blobs/{manifest['config']['digest']}"
        )
        assert config["config"]["Labels"]["org.opencontainers.image.version"] == v

        # The packaged chart, pushed and installed from oci:// by each Helm major.
        for release in releases():
            helm = require(release)
            home = tmp_path / release.id
            repo = f"oci://{registry}/{release.id}"
            push = run_helm(
                helm, home, "push", str(release_dist / f"{CHART}-{v}.tgz"), repo, "--plain-http"
            )
            assert push.returncode == 0, push.stderr
            # Helm 4 installs with --dry-run=client and no cluster; Helm 3's install asks a
            # cluster even then, so it renders from oci:// with template, as install would.
            verb = ["install", "--dry-run=client"] if release.id == "helm4" else ["template"]
            install = run_helm(
                helm,
                home,
                *verb,
                CHART,
                f"{repo}/{CHART}",
                "--version",
                v,
                "--plain-http",
                "--namespace",
                "gpu-monitoring",
                "--set",
                f"image.repository={registry}/dcgm-enricher",
                "--set",
                "imagePullSecrets[0].name=registry-login",
            )
            assert install.returncode == 0, install.stderr
            manifest_text = install.stdout
            if "MANIFEST:" in manifest_text:  # install's report: the objects after MANIFEST
                manifest_text = manifest_text.split("MANIFEST:", 1)[1].split("\nNOTES:", 1)[0]
            spec, enricher = enricher_pod([d for d in yaml.safe_load_all(manifest_text) if d])
            # The tag defaults to the chart's appVersion: the image just pushed.
            assert enricher["image"] == ref, release.id
            assert spec["imagePullSecrets"] == [{"name": "registry-login"}]
