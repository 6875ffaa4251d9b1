"""The project's image, built once per test session by the real Docker Engine
(tests/dockerengine.py), for every test that runs it (tests/test_image.py,
tests/test_compose_real.py): the fixture ``built_image``.

The base: no registry is reachable here, so the Dockerfile's ``PYTHON_IMAGE`` is a stand-in
built from Debian's packages by ``.ci/image-base`` (``make test`` runs it), imported as
``BASE_IMAGE``. The build takes minutes on the vfs driver, so the tests that take the fixture
carry the ``image`` mark. Its figures (seconds, image size) go to ``.cache/image/figures.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest

from .conftest import ROOT
from .dockerengine import Engine, skip_or_fail

BASE_TARBALL = ROOT / ".cache" / "image-base" / "bookworm-python.tar"
FIGURES = ROOT / ".cache" / "image" / "figures.json"
BASE_IMAGE = "enricher-test/python-standin:bookworm"
IMAGE = "enricher-test/dcgm-enricher:test"


@dataclass(frozen=True)
class Built:
    image: str
    base: str
    seconds: float
    size_bytes: int
    base_size_bytes: int


@pytest.fixture(scope="session")
def built_image(docker_engine_session: Engine) -> Built:
    """The image of this checkout's Dockerfile on the stand-in base (both in the engine)."""
    engine = docker_engine_session
    if not BASE_TARBALL.is_file():
        skip_or_fail(
            f"no stand-in base image at {BASE_TARBALL}: run .ci/image-base (make test does)"
        )
    with BASE_TARBALL.open("rb") as tar:
        engine.docker("import", "-", BASE_IMAGE, input=tar.read(), timeout=300)
    started = time.monotonic()
    engine.docker(
        "build",
        "--network=host",  # pip in the builder stage reaches the package index
        "--build-arg",
        f"PYTHON_IMAGE={BASE_IMAGE}",
        "--tag",
        IMAGE,
        str(ROOT),
        timeout=900,
    )
    seconds = time.monotonic() - started
    size = int(engine.docker("image", "inspect", "--format", "{{.Size}}", IMAGE))
    base = int(engine.docker("image", "inspect", "--format", "{{.Size}}", BASE_IMAGE))
    built = Built(IMAGE, BASE_IMAGE, seconds, size, base)
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
