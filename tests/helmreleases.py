"""The Helm releases every chart test runs on: Helm 3.17 and Helm 4.1.

Both are unpacked by .ci/helm (``make test`` runs it) into .cache/helm-3 and .cache/helm-4;
ENRICHER_HELM3_DIR and ENRICHER_HELM4_DIR name other folders holding a ``helm`` binary. In CI
(CI set) a missing release fails the tests that need it; elsewhere they skip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"


@dataclass(frozen=True)
class HelmRelease:
    """One Helm release: the version .ci/helm fetches and the path of its binary."""

    version: str
    helm: str

    @property
    def id(self) -> str:
        """The test id: helm3, helm4."""
        return "helm" + self.version.split(".")[0]


def releases() -> list[HelmRelease]:
    """Both releases, present or not (``require`` checks a release before a test uses it)."""
    found = []
    for version in ("3.17.3", "4.1.4"):
        major = version.split(".")[0]
        folder = os.environ.get(f"ENRICHER_HELM{major}_DIR") or CACHE / f"helm-{major}"
        found.append(HelmRelease(version, str(Path(folder) / "helm")))
    return found


def require(release: HelmRelease) -> HelmRelease:
    """``release`` when its binary is there; fails in CI and skips elsewhere otherwise."""
    if not (os.access(release.helm, os.X_OK) and Path(release.helm).is_file()):
        message = (
            f"Helm {release.version} is missing ({release.helm}): .ci/helm (make test runs it)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return release
