"""The project's image, built once per test session by the real Docker Engine
(tests/dockerengine.py), for every test that runs it (tests/test_image.py,
tests/test_compose_real.py, tests/test_release.py): the fixture ``built_image``. It is built by
``make image``, as a user builds it (the labels of the version, the commit and the repository
come from the Makefile), only pointed at the session's engine and the stand-in base.

The base: no registry is reachable here, so the Dockerfile's ``PYTHON_IMAGE`` is a stand-in
built from Debian's packages by ``.ci/image-base`` (``make test`` runs it), imported as
``BASE_IMAGE``. The build takes minutes on the vfs driver, so the tests that take the fixture
carry the ``image`` mark. Its figures (seconds, image size) go to ``.cache/image/figures.json``.

The build starts in the background as soon as a run has collected a test marked ``image``
(``pytest_collection_finish``), on the session's Docker Engine, and the ``image`` tests run
last: the minutes of the build (mostly pip and the vfs driver's copies, a second core's work)
pass while the rest of the suite runs. ``built_image`` waits for it and raises what it raised.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import ROOT
from .dockerengine import Engine, EngineUnavailable, docker_daemon, skip_or_fail

BASE_TARBALL = ROOT / ".cache" / "image-base" / "bookworm-python.tar"
FIGURES = ROOT / ".cache" / "image" / "figures.json"
BASE_IMAGE = "enricher-test/python-standin:bookworm"
IMAGE = "enricher-test/dcgm-enricher:test"


def project_version() -> str:
    """pyproject.toml's version, which every release artifact carries."""
    match = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert match, "pyproject.toml has no version"
    return match.group(1)


def head_revision(root: Path = ROOT) -> str | None:
    """The commit checked out at ``root`` (None outside a git work tree)."""
    done = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--verify", "-q", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or None


@dataclass(frozen=True)
class Built:
    image: str
    base: str


def make_image(engine: Engine, target: str, *assignments: str, timeout: float = 300) -> str:
    """``make TARGET`` of the Makefile's image targets (``image``, ``image-push``), run as a
    user runs it, against ``engine`` and on the stand-in base; its output."""
    env = {k: v for k, v in engine.env.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    argv = ["make", "--no-print-directory", "-C", str(ROOT), target]
    argv += [f"DOCKER={engine.cli}", f"IMAGE={IMAGE}", f"PYTHON_IMAGE={BASE_IMAGE}"]
    argv += ["DOCKER_BUILD_FLAGS=--network=host"]  # pip in the builder stage reaches the index
    done = subprocess.run(
        [*argv, *assignments], capture_output=True, text=True, timeout=timeout, env=env
    )
    if done.returncode != 0:
        raise EngineUnavailable(
            f"make {target} exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}"
        )
    return done.stdout


def build_image(engine: Engine) -> Built:
    """The image of this checkout's Dockerfile on the stand-in base (both in ``engine``)."""
    if not BASE_TARBALL.is_file():
        skip_or_fail(
            f"no stand-in base image at {BASE_TARBALL}: run .ci/image-base (make test does)"
        )
    with BASE_TARBALL.open("rb") as tar:
        engine.docker("import", "-", BASE_IMAGE, input=tar.read(), timeout=300)
    started = time.monotonic()
    make_image(engine, "image", timeout=900)
    seconds = time.monotonic() - started
    size = int(engine.docker("image", "inspect", "--format", "{{.Size}}", IMAGE))
    base = int(engine.docker("image", "inspect", "--format", "{{.Size}}", BASE_IMAGE))
    built = Built(IMAGE, BASE_IMAGE)
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(
        json.dumps(
            {
                "build_seconds": round(seconds, 1),
                "image_bytes": size,
                "base_bytes": base,
                "added_bytes": size - base,
                "base": "debootstrap bookworm minbase + python3 (stand-in for PYTHON_IMAGE)",
                "storage_driver": "vfs",
            },
            indent=1,
        )
        + "\n"
    )
    return built


@dataclass
class Background:
    """The session's engine and the image build, started in a thread of their own."""

    engine_ready: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    engine: Engine | None = None
    built: Built | None = None
    error: BaseException | None = None
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def run(self) -> None:
        try:
            self.engine = self.stack.enter_context(docker_daemon())
            self.engine_ready.set()
            self.built = build_image(self.engine)
        except BaseException as exc:  # a skip or a failure too: the tests that wait raise it
            self.error = exc
        finally:
            self.engine_ready.set()
            self.done.set()

    def wait_engine(self) -> Engine:
        self.engine_ready.wait()
        if self.engine is None:
            assert self.error is not None
            raise self.error
        return self.engine

    def wait_built(self) -> Built:
        self.done.wait()
        if self.built is None:
            assert self.error is not None
            raise self.error
        return self.built


_BACKGROUND = pytest.StashKey[Background]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``image`` tests last, so that the build has the rest of the run to finish."""
    items.sort(key=lambda item: item.get_closest_marker("image") is not None)


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return  # under pytest-xdist the worker that runs the image tests builds at first use
    if any(item.get_closest_marker("image") for item in session.items):
        background = Background()
        session.config.stash[_BACKGROUND] = background
        threading.Thread(target=background.run, name="image-build", daemon=True).start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    background = session.config.stash.get(_BACKGROUND, None)
    if background is not None:
        # A run cut short (-x, ^C) does not wait for the build: stopping the engine ends it.
        background.engine_ready.wait()
        background.stack.close()


@pytest.fixture(scope="session")
def docker_engine_session(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """The session's real Docker Engine: the background build's when the run has ``image``
    tests (stopped when the run ends), else one started at first use."""
    background = request.config.stash.get(_BACKGROUND, None)
    if background is not None:
        yield background.wait_engine()
        return
    with docker_daemon() as engine:
        yield engine


@pytest.fixture(scope="session")
def built_image(docker_engine_session: Engine, request: pytest.FixtureRequest) -> Built:
    """The image of this checkout's Dockerfile on the stand-in base (both in the engine),
    built in the background since the tests were collected."""
    background = request.config.stash.get(_BACKGROUND, None)
    if background is None:  # a run that collected no image test asked for it anyway
        return build_image(docker_engine_session)
    return background.wait_built()
