"""Tests for the procfs source and the simulated /proc writer."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enricher import procfs
from enricher.cgroups import container_chain, parse_cgroup
from enricher.model import CgroupRef, ProcError, ProcInfo, Runtime
from enricher.procfs import ProcfsSource, parse_btime, parse_stat
from enricher.simnode import fakeproc

from .conftest import examples

UID = "0b1c2d3e-4f50-4a61-8b72-93a4b5c6d7e8"
UID_ = UID.replace("-", "_")
UID2 = "f0e1d2c3-b4a5-4968-8776-655443322110"
STATIC = "6d5a1f0c2b9e4f3a8c7d6e5f4a3b2c1d"  # a static pod's config hash
CID = hashlib.sha256(b"workload").hexdigest()
CID2 = hashlib.sha256(b"sidecar").hexdigest()
NODE = hashlib.sha256(b"kind-node").hexdigest()

CD, CRIO, DOCKER, UNK = Runtime.CONTAINERD, Runtime.CRIO, Runtime.DOCKER, Runtime.UNKNOWN
SYSD_BURST = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
SYSD_BE = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
SYSD_GUAR = f"/kubepods.slice/kubepods-pod{UID_}.slice"


def ref(pod: str | None, cid: str | None, runtime: Runtime, path: str) -> CgroupRef:
    return CgroupRef(pod_uid=pod, container_id=cid, runtime=runtime, path=path)


def v2(path: str) -> tuple[str, CgroupRef | None]:
    """A single-line v2 file; the answer must name that very path."""
    return f"0::{path}\n", None


def one(path: str, pod: str | None, cid: str | None, runtime: Runtime) -> tuple[str, CgroupRef]:
    """A single-line v2 file and the answer it should give."""
    return f"0::{path}\n", ref(pod, cid, runtime, path)


def v1_file(memory: str, cpu: str = "/", systemd: str = "/") -> str:
    return (
        f"12:pids:/\n11:cpu,cpuacct:{cpu}\n10:memory:{memory}\n9:devices:/\n"
        f"1:name=systemd:{systemd}\n"
    )


CGROUP_CASES = [
    # --- systemd driver, cgroup v2
    pytest.param(
        *one(f"{SYSD_BURST}/cri-containerd-{CID}.scope", UID, CID, CD), id="v2-systemd-burstable"
    ),
    pytest.param(
        *one(f"{SYSD_BE}/cri-containerd-{CID}.scope", UID, CID, CD), id="v2-systemd-besteffort"
    ),
    pytest.param(
        *one(f"{SYSD_GUAR}/cri-containerd-{CID}.scope", UID, CID, CD), id="v2-systemd-guaranteed"
    ),
    pytest.param(*one(f"{SYSD_BURST}/crio-{CID}.scope", UID, CID, CRIO), id="v2-systemd-crio"),
    pytest.param(
        *one(f"{SYSD_BURST}/crio-conmon-{CID}.scope", UID, None, CRIO),
        id="crio-conmon-not-workload",
    ),
    pytest.param(
        *one(f"{SYSD_GUAR}/docker-{CID}.scope", UID, CID, DOCKER), id="v2-systemd-cri-dockerd"
    ),
    # --- cgroupfs driver
    pytest.param(
        *one(f"/kubepods/burstable/pod{UID}/{CID}", UID, CID, UNK), id="cgroupfs-burstable-bare-id"
    ),
    pytest.param(*one(f"/kubepods/pod{UID}/{CID}", UID, CID, UNK), id="cgroupfs-guaranteed"),
    pytest.param(
        *one(f"/kubepods/besteffort/pod{UID}/crio-{CID}", UID, CID, CRIO), id="cgroupfs-crio"
    ),
    pytest.param(
        *one(f"/kubepods/besteffort/pod{UID}/crio-conmon-{CID}", UID, None, CRIO),
        id="cgroupfs-crio-conmon",
    ),
    pytest.param(*one(f"/kubepods/burstable/pod{UID}", UID, None, UNK), id="pod-level-cgroup"),
    # --- cgroup v1
    pytest.param(
        v1_file(*[f"/kubepods/burstable/pod{UID}/{CID}"] * 3),
        ref(UID, CID, UNK, f"/kubepods/burstable/pod{UID}/{CID}"),
        id="v1-cgroupfs-all-lines",
    ),
    pytest.param(
        v1_file(f"/kubepods/pod{UID}/{CID}", f"/kubepods/pod{UID2}/{CID2}"),
        ref(UID, CID, UNK, f"/kubepods/pod{UID}/{CID}"),
        id="v1-memory-wins-disagreement",
    ),
    pytest.param(
        v1_file("/", cpu=f"{SYSD_BURST}/cri-containerd-{CID}.scope"),
        ref(UID, CID, CD, f"{SYSD_BURST}/cri-containerd-{CID}.scope"),
        id="v1-cpu-cpuacct-line",
    ),
    pytest.param(
        v1_file("/user.slice", systemd=f"/kubepods/pod{UID}/{CID}"),
        ref(UID, CID, UNK, f"/kubepods/pod{UID}/{CID}"),
        id="v1-container-beats-host-line",
    ),
    pytest.param(
        f"5:memory:{SYSD_BURST}/cri-containerd-{CID}.scope\n0::/\n",
        ref(UID, CID, CD, f"{SYSD_BURST}/cri-containerd-{CID}.scope"),
        id="hybrid-v1-memory-v2-root",
    ),
    pytest.param(
        v1_file("/user.slice", systemd="/user.slice/user-0.slice/session-1.scope"),
        ref(None, None, UNK, "/user.slice"),
        id="v1-host-memory-line",
    ),
    # --- levels below the container
    pytest.param(
        *one(f"{SYSD_BURST}/crio-{CID}.scope/container", UID, CID, CRIO), id="crun-container-sub"
    ),
    pytest.param(
        *one(f"{SYSD_BURST}/cri-containerd-{CID}.scope/exec", UID, CID, CD), id="exec-sub"
    ),
    pytest.param(
        *one(f"/kubepods/pod{UID}/{CID}/a/b.slice/c", UID, CID, UNK), id="deep-sub-cgroups"
    ),
    pytest.param(
        *one(f"/kubepods/pod{UID}/{CID}/docker/{CID2}", UID, CID, UNK),
        id="nested-runtime-in-pod-keeps-pod-container",
    ),
    # --- prefixes above kubepods
    pytest.param(
        *one(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
            UID,
            CID,
            CD,
        ),
        id="kind-kubelet-slice",
    ),
    pytest.param(
        *one(f"/docker/{NODE}/kubepods/burstable/pod{UID}/{CID}", UID, CID, UNK),
        id="docker-node-prefix-not-the-container",
    ),
    pytest.param(
        *one(
            f"/system.slice/containerd.service{SYSD_BURST}/cri-containerd-{CID}.scope", UID, CID, CD
        ),
        id="containerd-service-prefix",
    ),
    # --- containerd's literal slice:prefix:id name
    pytest.param(
        *one(
            f"/system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:cri-containerd:{CID}",
            UID,
            CID,
            CD,
        ),
        id="colon-form-under-containerd-service",
    ),
    pytest.param(
        f"9:memory:/kubepods-pod{UID_}.slice:cri-containerd:{CID}\n",
        ref(UID, CID, CD, f"/kubepods-pod{UID_}.slice:cri-containerd:{CID}"),
        id="colon-form-v1-split-first-two-colons",
    ),
    pytest.param(
        *one(f"/kubepods-besteffort-pod{UID_}.slice:crio:{CID}", UID, CID, CRIO),
        id="colon-form-crio",
    ),
    pytest.param(
        *v2(f"/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID[:60]}"),
        id="colon-form-short-id",
    ),
    # --- cgroup namespaces
    pytest.param(
        *one(
            f"/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope", UID, CID, CD
        ),
        id="namespace-relative-systemd",
    ),
    pytest.param(*one(f"/../pod{UID}/{CID}", UID, CID, UNK), id="namespace-relative-cgroupfs"),
    pytest.param(*v2("/"), id="namespace-root-unknown"),
    pytest.param(*v2("/../.."), id="namespace-ancestor-unknown"),
    # --- static pods and UID forms
    pytest.param(
        *one(
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{STATIC}.slice/"
            f"cri-containerd-{CID}.scope",
            STATIC,
            CID,
            CD,
        ),
        id="static-pod-systemd",
    ),
    pytest.param(*one(f"/kubepods/pod{STATIC}/{CID}", STATIC, CID, UNK), id="static-pod-cgroupfs"),
    pytest.param(
        *one(f"/kubepods/pod{UID.upper()}/{CID}", UID, CID, UNK), id="uppercase-uid-lowercased"
    ),
    # --- host processes and Docker outside Kubernetes
    pytest.param(
        *one("/user.slice/user-1000.slice/session-3.scope", None, None, UNK), id="host-user-slice"
    ),
    pytest.param(*one("/system.slice/sshd.service", None, None, UNK), id="host-system-service"),
    pytest.param(*one("/init.scope", None, None, UNK), id="host-init-scope"),
    pytest.param(*one(f"/docker/{CID}", None, CID, DOCKER), id="docker-outside-k8s-cgroupfs"),
    pytest.param(
        *one(f"/system.slice/docker-{CID}.scope", None, CID, DOCKER),
        id="docker-outside-k8s-systemd",
    ),
    pytest.param(
        *one(f"/docker/{NODE}/docker/{CID}", None, CID, DOCKER), id="docker-in-docker-innermost"
    ),
    # --- Docker hosts without Kubernetes (issue 8)
    pytest.param(
        "".join(
            f"{n}:{ctl}:/docker/{CID}\n"
            for n, ctl in ((12, "pids"), (11, "memory"), (10, "cpu,cpuacct"), (1, "name=systemd"))
        )
        + "0::/system.slice/containerd.service\n",
        ref(None, CID, DOCKER, f"/docker/{CID}"),
        id="docker-host-v1-cgroupfs-file",
    ),
    pytest.param(
        v1_file(*[f"/system.slice/docker-{CID}.scope"] * 3),
        ref(None, CID, DOCKER, f"/system.slice/docker-{CID}.scope"),
        id="docker-host-v1-systemd-file",
    ),
    pytest.param(
        f"4:memory:/system.slice/docker-{CID}.scope\n1:name=systemd:/system.slice/docker-{CID}"
        f".scope\n0::/system.slice/docker-{CID}.scope\n",
        ref(None, CID, DOCKER, f"/system.slice/docker-{CID}.scope"),
        id="docker-host-hybrid",
    ),
    pytest.param(*one(f"/docker/{CID}", None, CID, DOCKER), id="docker-host-v2-cgroupfs-driver"),
    pytest.param(
        *one(
            f"/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{CID}.scope",
            None,
            CID,
            DOCKER,
        ),
        id="rootless-docker-v2",
    ),
    pytest.param(
        *one(
            f"/user.slice/user-1001.slice/user@1001.service/user.slice/docker-{CID}.scope/init.scope",
            None,
            CID,
            DOCKER,
        ),
        id="rootless-docker-systemd-in-container",
    ),
    pytest.param(
        *one(f"/gpu.slice/docker-{CID}.scope", None, CID, DOCKER), id="docker-cgroup-parent-slice"
    ),
    pytest.param(*one(f"/gpu-jobs/{CID}", None, CID, UNK), id="docker-cgroup-parent-cgroupfs"),
    pytest.param(
        *one(f"/system.slice/docker-{CID}.scope/system.slice/jupyter.service", None, CID, DOCKER),
        id="docker-systemd-in-container-service",
    ),
    # Read from a container with its own cgroup namespace (Docker's default on cgroup v2).
    pytest.param(
        *one(f"/../docker-{CID}.scope", None, CID, DOCKER), id="docker-private-cgroupns-systemd"
    ),
    pytest.param(
        *one(f"/../../system.slice/docker-{CID}.scope", None, CID, DOCKER),
        id="docker-private-cgroupns-deeper",
    ),
    pytest.param(*one(f"/../{CID}", None, CID, UNK), id="docker-private-cgroupns-cgroupfs"),
    # The daemons themselves (and, for rootless Docker without cgroup delegation, the
    # containers it could not give a cgroup of their own) are host processes.
    pytest.param(*one("/system.slice/docker.service", None, None, UNK), id="dockerd-itself"),
    pytest.param(*one("/system.slice/containerd.service", None, None, UNK), id="containerd-itself"),
    pytest.param(
        *one(
            "/user.slice/user-1000.slice/user@1000.service/app.slice/docker.service",
            None,
            None,
            UNK,
        ),
        id="rootless-dockerd-itself",
    ),
    # --- malformed container ids: the pod is still known, the container is not
    pytest.param(*one(f"/kubepods/pod{UID}/{CID[:63]}", UID, None, UNK), id="container-id-63-hex"),
    pytest.param(
        *one(f"{SYSD_BURST}/cri-containerd-{CID}a.scope", UID, None, UNK), id="container-id-65-hex"
    ),
    pytest.param(
        *one(f"{SYSD_BURST}/cri-containerd-{CID.upper()}.scope", UID, None, UNK),
        id="container-id-uppercase",
    ),
    # --- negatives: nothing understood
    pytest.param("", None, id="empty"),
    pytest.param("hello world\n", None, id="garbage"),
    pytest.param("\x00\xff\x7f\ufffd:\x01:\x02\n", None, id="binary-junk"),
    pytest.param(f"0:/kubepods/pod{UID}/{CID}\n", None, id="one-colon-only"),
    pytest.param(f"x::/kubepods/pod{UID}/{CID}\n", None, id="non-numeric-hierarchy"),
    pytest.param(f"0::kubepods/pod{UID}/{CID}\n", None, id="relative-path-without-slash"),
    pytest.param(f"0::/kubepods/pod{UID}/{CID}\x07\n", None, id="control-char-in-path"),
    pytest.param(f"0::/kubepods/{'x' * 4100}/pod{UID}/{CID}\n", None, id="over-long-line"),
    pytest.param(*v2("/kubepods/burstable"), id="kubepods-without-pod"),
    pytest.param(*v2("/kubepods/burstable/pod1234"), id="pod-uid-too-short"),
    pytest.param(*v2(f"/kubepods-burstable-pod{UID}.slice"), id="slice-uid-with-dashes"),
    # A pod segment we cannot read does not hide the container: its id is exact.
    pytest.param(
        *one(f"/kubepods/pod{UID_}/{CID}", None, CID, UNK), id="cgroupfs-uid-with-underscores"
    ),
    pytest.param(*v2(f"/system.slice/crio-conmon-{CID}.scope"), id="conmon-outside-pod"),
    pytest.param(*v2("/system.slice/cri-containerd-nothex.scope"), id="malformed-scope"),
]


@pytest.mark.parametrize(("text", "expected"), CGROUP_CASES)
def test_parse_cgroup(text: str, expected: CgroupRef | None) -> None:
    assert parse_cgroup(text) == expected


def test_parse_cgroup_ignores_text_beyond_64_kib() -> None:
    good = f"0::/kubepods/pod{UID}/{CID}\n"
    filler = "7:pids:/\n" * (procfs.MAX_FILE_BYTES // 9 + 1)
    assert parse_cgroup(good + filler) == ref(UID, CID, UNK, f"/kubepods/pod{UID}/{CID}")
    assert parse_cgroup(filler + good) is None


def test_parse_cgroup_drops_a_line_cut_at_the_bound() -> None:
    # The 64 KiB bound falls inside the container id: the cut line would still name the pod
    # (a 54-hex id is no container), so a pod-only answer would show the cut line was used.
    line = f"0::/kubepods/pod{UID}/{CID}\n"
    pad = "#" * (procfs.MAX_FILE_BYTES - len(line) + 10) + "\n"
    text = pad + line
    assert text[: procfs.MAX_FILE_BYTES].endswith(CID[:54])
    assert parse_cgroup(text) is None
    assert parse_cgroup(line) is not None


def test_parse_cgroup_is_fast_on_adversarial_lines() -> None:
    nasty = [
        "0::/" + "a-" * 2000 + "kubepods",
        "0::/" + "kubepods-" * 450 + "pod",
        "0::/" + "pod" + "_" * 4000,
        "0::/" + "a:" * 2000,
    ]
    text = "\n".join(nasty * 4)
    started = time.perf_counter()
    for _ in range(10):
        parse_cgroup(text)
    assert time.perf_counter() - started < 2.0


_HEX64_RE = re.compile(r"[0-9a-f]{64}")
_UID_RE = re.compile(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}|[0-9a-f]{32}")


def _check_invariants(text: str, result: CgroupRef | None) -> None:
    if result is None:
        return
    assert result.path in text
    assert result.container_id is None or _HEX64_RE.fullmatch(result.container_id)
    assert result.pod_uid is None or _UID_RE.fullmatch(result.pod_uid)


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=2000))
def test_parse_cgroup_never_raises_on_arbitrary_text(text: str) -> None:
    _check_invariants(text, parse_cgroup(text))


_PIECES = st.sampled_from(
    [
        "kubepods",
        "kubepods.slice",
        "kubepods-burstable.slice",
        f"kubepods-burstable-pod{UID_}.slice",
        f"kubepods-pod{UID_[:20]}.slice",
        f"pod{UID}",
        f"pod{STATIC}",
        "pod",
        CID,
        CID[:50],
        f"cri-containerd-{CID}.scope",
        f"crio-conmon-{CID}.scope",
        f"crio-{CID}",
        f"docker-{CID}.scope",
        "docker",
        f"kubepods-pod{UID_}.slice:cri-containerd:{CID}",
        f"kubepods-pod{UID_}.slice:crio-conmon:{CID}",
        "a:b:c",
        "..",
        ".",
        "",
        "user.slice",
        "container",
    ]
)
_LINES = st.builds(
    lambda hid, ctl, segs: f"{hid}:{ctl}:/" + "/".join(segs),
    st.sampled_from(["0", "4", "11", "x", ""]),
    st.sampled_from(["", "memory", "cpu,cpuacct", "name=systemd", "bad ctl"]),
    st.lists(_PIECES, max_size=8),
)


@settings(max_examples=examples(500), deadline=None)
@given(st.lists(_LINES, max_size=6))
def test_parse_cgroup_never_raises_on_cgroup_like_text(lines: list[str]) -> None:
    text = "\n".join(lines)
    _check_invariants(text, parse_cgroup(text))


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param(f"/docker/{CID}", (CID,), id="one"),
        pytest.param(f"/system.slice/docker-{CID}.scope/init.scope", (CID,), id="scope"),
        pytest.param(f"/docker/{NODE}/docker/{CID}", (NODE, CID), id="docker-in-docker"),
        pytest.param(
            f"/system.slice/docker-{NODE}.scope/docker/{CID}", (NODE, CID), id="dind-systemd-host"
        ),
        pytest.param(
            f"/docker/{NODE}/kubepods/burstable/pod{UID}/{CID}", (NODE, CID), id="kind-node"
        ),
        pytest.param(f"/kubepods-pod{UID_}.slice:cri-containerd:{CID}", (CID,), id="colon-form"),
        pytest.param(f"/kubepods/pod{UID}/{CID}/docker/{CID}", (CID,), id="repeated-once"),
        pytest.param(f"{SYSD_BURST}/crio-conmon-{CID}.scope", (), id="conmon-is-no-container"),
        pytest.param("/system.slice/docker.service", (), id="host"),
        pytest.param("/", (), id="root"),
        pytest.param(f"/docker/{CID[:63]}", (), id="short-id"),
        pytest.param(f"/{'x' * 4100}/docker/{CID}", (), id="over-long"),
    ],
)
def test_container_chain(path: str, expected: tuple[str, ...]) -> None:
    assert container_chain(path) == expected


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_PIECES, max_size=8))
def test_container_chain_agrees_with_parse_cgroup(segments: list[str]) -> None:
    path = "/" + "/".join(segments)
    chain = container_chain(path)
    ref_ = parse_cgroup(f"0::{path}\n")
    assert all(_HEX64_RE.fullmatch(c) for c in chain)
    assert len(set(chain)) == len(chain)
    # Whatever container parse_cgroup names is on the chain.
    if ref_ is not None and ref_.container_id is not None:
        assert ref_.container_id in chain


# --------------------------------------------------------------------------- stat


def stat_line(pid: str, comm: str, starttime: str = "22", fields: int = 52) -> str:
    """A stat line whose field n holds the number n, except field 22 (starttime)."""
    rest = ["S"] + [str(n) for n in range(4, fields + 1)]
    if fields >= 22:
        rest[22 - 3] = starttime
    return f"{pid} ({comm}) {' '.join(rest)}\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(stat_line("1", "systemd"), ("systemd", 22), id="plain"),
        pytest.param(stat_line("77", "python3", "987654"), ("python3", 987654), id="starttime"),
        pytest.param(stat_line("9", "tritonserver x"), ("tritonserver x", 22), id="comm-space"),
        pytest.param(stat_line("9", "a) (b"), ("a) (b", 22), id="comm-parens"),
        pytest.param(stat_line("9", ")"), (")", 22), id="comm-close-paren"),
        pytest.param(stat_line("9", ") S 1 2"), (") S 1 2", 22), id="comm-looks-like-fields"),
        pytest.param(stat_line("9", ""), ("", 22), id="comm-empty"),
        pytest.param(stat_line("9", "naïve"), ("naïve", 22), id="comm-unicode"),
        pytest.param(stat_line("9", "x", fields=22), ("x", 22), id="exactly-22-fields"),
    ],
)
def test_parse_stat(text: str, expected: tuple[str, int]) -> None:
    assert parse_stat(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("garbage\n", id="garbage"),
        pytest.param(stat_line("9", "x").replace(")", ""), id="no-close-paren"),
        pytest.param("9 x) " + stat_line("9", "x").split(") ", 1)[1], id="no-open-paren"),
        pytest.param(stat_line("9", "x", fields=21), id="too-few-fields"),
        pytest.param(stat_line("9", "x", starttime="abc"), id="starttime-not-number"),
        pytest.param(stat_line("9", "x", starttime="-5"), id="starttime-negative"),
        pytest.param(stat_line("nine", "x"), id="pid-not-number"),
        pytest.param(stat_line("", "x"), id="pid-missing"),
        pytest.param(stat_line("9", "x").replace(") S ", ") 17 "), id="state-not-letter"),
    ],
)
def test_parse_stat_rejects_junk(text: str) -> None:
    with pytest.raises(ValueError):
        parse_stat(text)


def test_parse_stat_reads_the_real_proc() -> None:
    with open(f"/proc/{os.getpid()}/stat") as f:
        comm, ticks = parse_stat(f.read())
    with open(f"/proc/{os.getpid()}/comm") as f:
        assert comm == f.read().rstrip("\n")
    assert ticks > 0


_DIGITS_RE = re.compile(r"[0-9]{1,20}")


def _reference_parse_stat(text: str) -> tuple[str, int]:
    """The regex-based parser that ``parse_stat`` replaced, kept as its oracle."""
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 1 or close_paren < open_paren:
        raise ValueError("stat: no '(comm)' after the pid")
    if not _DIGITS_RE.fullmatch(text[:open_paren].strip()):
        raise ValueError("stat: the pid is not a number")
    comm = text[open_paren + 1 : close_paren]
    fields = text[close_paren + 1 :].split()
    if len(fields) < 20:
        raise ValueError(f"stat: {len(fields) + 2} fields, starttime is field 22")
    state, starttime = fields[0], fields[19]
    if len(state) != 1 or not state.isalpha():
        raise ValueError(f"stat: bad state {state[:8]!r}")
    if not _DIGITS_RE.fullmatch(starttime):
        raise ValueError(f"stat: bad starttime {starttime[:24]!r}")
    return comm, int(starttime)


def _outcome(parse: Callable[[str], tuple[str, int]], text: str) -> object:
    try:
        return parse(text)
    except ValueError as exc:
        return str(exc)


# Pieces where str and regex semantics part ways: Unicode whitespace (\x1c-\x1f, \x85, NBSP,
# em space) that str.split and str.strip honour, non-ASCII digits and letters, 20 and 21 digits.
_STAT_TOKENS = st.sampled_from(
    ["S", "R", "é", "SS", "", "22", "0", "-5", "٣", "²", "9" * 20, "9" * 21, "(", ")", "x) y"]
)
_STAT_SPACES = st.sampled_from([" ", "  ", "\t", "\n", "\x1c", "\x1f", "\x85", "\xa0", "\u2003"])


@st.composite
def _stat_like(draw: st.DrawFn) -> str:
    pid = draw(st.sampled_from(["9", " 9 ", "\xa09", "9\x1c", "٣", "", "1" * 20, "1" * 21]))
    comm = draw(st.text(max_size=20))
    fields = draw(st.lists(_STAT_TOKENS, min_size=15, max_size=25))
    rest = "".join(draw(_STAT_SPACES) + f for f in fields)
    return f"{pid}({comm}){rest}{draw(st.sampled_from(['', chr(10), ' ']))}"


@settings(max_examples=examples(500), deadline=None)
@given(st.one_of(_stat_like(), st.text(max_size=300)))
def test_parse_stat_matches_reference(text: str) -> None:
    assert _outcome(parse_stat, text) == _outcome(_reference_parse_stat, text)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(stat_line("9", "x").rstrip("\n"), id="no-trailing-newline"),
        pytest.param(stat_line("9", "x", fields=21) + " 1", id="22-fields-no-newline"),
        pytest.param(stat_line("9", "x", starttime="9" * 20), id="starttime-20-digits"),
        pytest.param(stat_line("9", "x", starttime="9" * 21), id="starttime-21-digits"),
        pytest.param(stat_line("9", "x", starttime="٣"), id="starttime-arabic-digit"),
        pytest.param(stat_line("9", "x", starttime="²"), id="starttime-superscript"),
        pytest.param(stat_line("٣", "x"), id="pid-arabic-digit"),
        pytest.param(stat_line("1" * 21, "x"), id="pid-21-digits"),
        pytest.param(stat_line("\xa09", "x"), id="pid-after-nbsp"),
        pytest.param(stat_line("9", "x").replace(" ", "\x1c"), id="fields-split-by-x1c"),
        pytest.param(stat_line("9", "x").replace(" ", "\u2003"), id="fields-split-by-em-space"),
        pytest.param(stat_line("9", "x").replace(") S ", ") é "), id="state-non-ascii-letter"),
    ],
)
def test_parse_stat_edges_match_reference(text: str) -> None:
    assert _outcome(parse_stat, text) == _outcome(_reference_parse_stat, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("cpu 1 2 3\nintr 5 0 0\nbtime 1700000123\nprocesses 9\n", 1700000123, id="ok"),
        pytest.param("btime 0\n", 0, id="zero"),
    ],
)
def test_parse_btime(text: str, expected: int) -> None:
    assert parse_btime(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("cpu 1 2 3\nprocesses 9\n", id="missing"),
        pytest.param("btime soon\n", id="not-number"),
        pytest.param("btime 1 2\n", id="extra-field"),
    ],
)
def test_parse_btime_rejects_junk(text: str) -> None:
    with pytest.raises(ValueError):
        parse_btime(text)


# --------------------------------------------------------------------------- ProcfsSource

BTIME = 1_700_000_000
CLK = 100


@pytest.fixture
def root(tmp_path: Path) -> Path:
    fakeproc.write_proc_stat(tmp_path, BTIME)
    return tmp_path


def cg(pod: str = UID, cid: str = CID) -> str:
    return fakeproc.cgroup_v2_systemd(pod, cid)


def test_read_complete_process(root: Path) -> None:
    fakeproc.write_process(root, 4242, comm="python (x)", cgroup=cg(), start_ticks=12_345)
    reader = ProcfsSource(str(root), clk_tck=CLK)
    got = reader.read_pid(4242)
    assert isinstance(got, ProcInfo)
    assert (got.pid, got.comm, got.start_time_ticks) == (4242, "python (x)", 12_345)
    assert got.start_time == pytest.approx(BTIME + 123.45)
    assert got.cgroup == parse_cgroup(cg())
    assert got.cgroup is not None and (got.cgroup.pod_uid, got.cgroup.container_id) == (UID, CID)
    assert reader.errors_total == 0


def test_read_unknown_cgroup_is_info_not_error(root: Path) -> None:
    fakeproc.write_process(root, 7, comm="w", cgroup="0::/\n", start_ticks=1)
    reader = ProcfsSource(str(root), clk_tck=CLK)
    got = reader.read_pid(7)
    assert isinstance(got, ProcInfo) and got.cgroup is None
    assert reader.errors_total == 0


def test_read_missing_process_is_exited(root: Path) -> None:
    reader = ProcfsSource(str(root), clk_tck=CLK)
    assert reader.read_pid(999) is ProcError.EXITED
    assert reader.errors_total == 0


def test_read_vanished_before_cgroup_read_is_exited(root: Path) -> None:
    fakeproc.write_process(root, 5, comm="w", cgroup=cg(), start_ticks=1)
    os.unlink(root / "5" / "cgroup")
    reader = ProcfsSource(str(root), clk_tck=CLK)
    assert reader.read_pid(5) is ProcError.EXITED
    assert reader.errors_total == 0


def test_read_removed_process_is_exited(root: Path) -> None:
    fakeproc.write_process(root, 5, comm="w", cgroup=cg(), start_ticks=1)
    reader = ProcfsSource(str(root), clk_tck=CLK)
    assert isinstance(reader.read_pid(5), ProcInfo)
    fakeproc.remove_process(root, 5)
    fakeproc.remove_process(root, 5)  # removing twice is fine
    assert reader.read_pid(5) is ProcError.EXITED


def _race_after_cgroup_read(monkeypatch: pytest.MonkeyPatch, then: Callable[[], object]) -> None:
    # The kernel reusing or reaping a PID in the microseconds between two reads cannot be
    # produced on demand, so the real file reader is wrapped to change the tree at that moment.
    real = procfs.read_bounded

    def wrapped(path: str, limit: int) -> tuple[bytes, bool]:
        result = real(path, limit)
        if path.endswith("/cgroup"):
            then()
        return result

    monkeypatch.setattr(procfs, "read_bounded", wrapped)


def test_read_pid_reused_between_stat_reads(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fakeproc.write_process(root, 6, comm="old", cgroup=cg(), start_ticks=100)
    _race_after_cgroup_read(
        monkeypatch,
        lambda: fakeproc.write_process(root, 6, comm="new", cgroup=cg(UID2), start_ticks=200),
    )
    reader = ProcfsSource(str(root), clk_tck=CLK)
    assert reader.read_pid(6) is ProcError.REUSED
    assert reader.errors_total == 0


def test_read_exited_after_cgroup_read(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fakeproc.write_process(root, 6, comm="old", cgroup=cg(), start_ticks=100)
    _race_after_cgroup_read(monkeypatch, lambda: fakeproc.remove_process(root, 6))
    assert ProcfsSource(str(root), clk_tck=CLK).read_pid(6) is ProcError.EXITED


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        pytest.param(-5.0, ProcError.REUSED, id="started-5s-after-listing"),
        pytest.param(-1.5, ProcError.REUSED, id="started-1.5s-after-listing"),
        pytest.param(-0.5, ProcError.REUSED, id="within-btime-resolution"),
        pytest.param(-1 / CLK, ProcError.REUSED, id="started-one-tick-after-listing"),
        pytest.param(0.5 / CLK, None, id="listed-later-in-its-start-tick"),
        pytest.param(1 / CLK, None, id="started-one-tick-before-listing"),
        pytest.param(0.0, None, id="same-instant"),
        pytest.param(3600.0, None, id="listed-long-after-start"),
        pytest.param(float("nan"), None, id="nan-ignored"),
    ],
)
def test_read_listed_at(root: Path, offset: float, expected: ProcError | None) -> None:
    fakeproc.write_process(root, 8, comm="w", cgroup=cg(), start_ticks=50_000)
    start = BTIME + 50_000 / CLK
    got = ProcfsSource(str(root), clk_tck=CLK).read_pid(8, listed_at=start + offset)
    if expected is None:
        assert isinstance(got, ProcInfo) and got.start_time == pytest.approx(start)
    else:
        assert got is expected


@pytest.mark.parametrize(
    ("start_ticks", "expected"),
    [
        pytest.param(400_001, ProcError.REUSED, id="one-tick-after-listing"),
        pytest.param(400_000, None, id="the-listing-tick"),
        pytest.param(399_999, None, id="one-tick-before-listing"),
    ],
)
def test_listed_at_compared_on_the_boot_clock(
    tmp_path: Path, start_ticks: int, expected: ProcError | None
) -> None:
    """A tree of this machine: btime is the boot instant rounded down (0.7 s early here), so
    a start time computed from it is 0.7 s early too; on the boot clock (CLOCK_BOOTTIME,
    injected) the start ticks are compared exactly, and a PID reused one tick after NVML's
    listing is caught."""
    boot = 1_700_000_000.7  # the boot instant on the wall clock
    root = tmp_path / "proc"
    fakeproc.write_proc_stat(root, int(boot))
    fakeproc.write_process(root, 8, comm="w", cgroup=cg(), start_ticks=start_ticks)
    reader = ProcfsSource(
        str(root), clk_tck=CLK, boot_clock=lambda: 5000.0, wall_clock=lambda: boot + 5000.0
    )
    got = reader.read_pid(8, listed_at=boot + 4000.0)  # 400,000 ticks after boot
    if expected is None:
        assert isinstance(got, ProcInfo)
    else:
        assert got is expected


def test_read_many_shares_listed_at_and_dedupes(root: Path) -> None:
    fakeproc.write_process(root, 10, comm="a", cgroup=cg(), start_ticks=100)
    fakeproc.write_process(root, 11, comm="b", cgroup=cg(UID2, CID2), start_ticks=90_000)
    got = ProcfsSource(str(root), clk_tck=CLK).read_many([10, 11, 12, 10], listed_at=BTIME + 10)
    assert list(got) == [10, 11, 12]
    assert isinstance(got[10], ProcInfo) and got[10].comm == "a"
    assert got[11] is ProcError.REUSED
    assert got[12] is ProcError.EXITED


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param("dir", id="stat-is-a-directory"),
        pytest.param("junk", id="stat-unparsable"),
        pytest.param("fifo", id="stat-is-a-fifo"),
        pytest.param("symlink", id="stat-is-a-symlink"),
        pytest.param("huge", id="stat-over-64-kib"),
        pytest.param("cgroup-dir", id="cgroup-is-a-directory"),
    ],
)
def test_read_unreadable(root: Path, breakage: str) -> None:
    # Tests run as root, so chmod 000 would not stop the read; break the files instead.
    fakeproc.write_process(root, 3, comm="w", cgroup=cg(), start_ticks=1)
    stat_path = root / "3" / "stat"
    if breakage == "cgroup-dir":
        os.unlink(root / "3" / "cgroup")
        os.mkdir(root / "3" / "cgroup")
    elif breakage == "junk":
        stat_path.write_text("3 (w) S 1 2\n")
    elif breakage == "huge":
        stat_path.write_text(stat_line("3", "x" * procfs.MAX_FILE_BYTES))
    else:
        os.unlink(stat_path)
        if breakage == "dir":
            os.mkdir(stat_path)
        elif breakage == "fifo":
            os.mkfifo(stat_path)
        else:
            (root / "elsewhere").write_text(stat_line("3", "w"))
            os.symlink(root / "elsewhere", stat_path)
    reader = ProcfsSource(str(root), clk_tck=CLK)
    assert reader.read_pid(3) is ProcError.UNREADABLE
    assert reader.read_pid(3) is ProcError.UNREADABLE
    assert reader.errors_total == 2


@pytest.mark.parametrize("pid", [0, -1, True])
def test_read_invalid_pid(root: Path, pid: int) -> None:
    reader = ProcfsSource(str(root), clk_tck=CLK)
    assert reader.read_pid(pid) is ProcError.UNREADABLE
    assert reader.errors_total == 1


def test_read_without_btime_is_unreadable(tmp_path: Path) -> None:
    fakeproc.write_process(tmp_path, 3, comm="w", cgroup=cg(), start_ticks=1)
    reader = ProcfsSource(str(tmp_path), clk_tck=CLK)
    assert reader.read_pid(3) is ProcError.UNREADABLE
    assert reader.errors_total == 1
    fakeproc.write_proc_stat(tmp_path, BTIME)  # a failed btime read is retried
    assert isinstance(reader.read_pid(3), ProcInfo)


def test_btime_is_cached_then_refreshed(root: Path) -> None:
    fakeproc.write_process(root, 3, comm="w", cgroup=cg(), start_ticks=100)
    cached = ProcfsSource(str(root), clk_tck=CLK)
    fresh = ProcfsSource(str(root), clk_tck=CLK, btime_max_age=0.0)
    for reader in (cached, fresh):
        assert isinstance(got := reader.read_pid(3), ProcInfo) and got.start_time == BTIME + 1
    fakeproc.write_proc_stat(root, BTIME + 7)
    assert isinstance(got := cached.read_pid(3), ProcInfo) and got.start_time == BTIME + 1
    assert isinstance(got := fresh.read_pid(3), ProcInfo) and got.start_time == BTIME + 8


def test_cache_keeps_cgroup_until_start_time_changes(root: Path) -> None:
    fakeproc.write_process(root, 20, comm="w", cgroup=cg(UID, CID), start_ticks=100)
    reader = ProcfsSource(str(root), clk_tck=CLK)
    first = reader.read_pid(20)
    assert isinstance(first, ProcInfo) and first.cgroup is not None
    # Same process (same start time): the cgroup file is not read again.
    (root / "20" / "cgroup").write_text(cg(UID2, CID2))
    again = reader.read_pid(20)
    assert isinstance(again, ProcInfo) and again.cgroup == first.cgroup
    # A new process under the same PID: read afresh.
    fakeproc.write_process(root, 20, comm="w2", cgroup=cg(UID2, CID2), start_ticks=101)
    newer = reader.read_pid(20)
    assert isinstance(newer, ProcInfo) and newer.comm == "w2"
    assert newer.cgroup is not None and newer.cgroup.pod_uid == UID2


def test_cache_is_bounded_lru(root: Path) -> None:
    for pid in (1, 2, 3):
        fakeproc.write_process(root, pid, comm="w", cgroup=cg(UID, CID), start_ticks=pid)
    reader = ProcfsSource(str(root), clk_tck=CLK, cache_size=2)
    for pid in (1, 2, 1, 3):  # 2 is now the least recently used
        reader.read_pid(pid)
    for pid in (1, 2, 3):
        (root / str(pid) / "cgroup").write_text(cg(UID2, CID2))
    pods = {}
    for pid in (1, 3, 2):
        got = reader.read_pid(pid)
        assert isinstance(got, ProcInfo) and got.cgroup is not None
        pods[pid] = got.cgroup.pod_uid
    assert pods == {1: UID, 3: UID, 2: UID2}
    assert len(reader._cache) == 2


def test_cache_size_zero_always_reads(root: Path) -> None:
    fakeproc.write_process(root, 1, comm="w", cgroup=cg(UID, CID), start_ticks=1)
    reader = ProcfsSource(str(root), clk_tck=CLK, cache_size=0)
    reader.read_pid(1)
    (root / "1" / "cgroup").write_text(cg(UID2, CID2))
    got = reader.read_pid(1)
    assert isinstance(got, ProcInfo) and got.cgroup is not None and got.cgroup.pod_uid == UID2


@pytest.mark.parametrize("kwargs", [{"clk_tck": 0}, {"clk_tck": -100}, {"cache_size": -1}], ids=str)
def test_reader_rejects_bad_config(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        ProcfsSource("/proc", **kwargs)


def _stat_bytes(size: int) -> bytes:
    """A valid stat file for PID 3 (starttime 22) padded through comm to ``size`` bytes."""
    return stat_line("3", "x" * (size - len(stat_line("3", "")))).encode()


# The comm that pads a stat file to exactly the 64 KiB bound.
COMM_AT_LIMIT = "x" * (procfs.MAX_FILE_BYTES - len(stat_line("3", "")))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(_stat_bytes(procfs.MAX_FILE_BYTES), COMM_AT_LIMIT, id="exactly-64-kib"),
        pytest.param(_stat_bytes(procfs.MAX_FILE_BYTES + 1), ProcError.UNREADABLE, id="one-over"),
        pytest.param(
            _stat_bytes(procfs.MAX_FILE_BYTES + 4096), ProcError.UNREADABLE, id="page-over"
        ),
        pytest.param(stat_line("3", "w").rstrip("\n").encode(), "w", id="no-trailing-newline"),
        pytest.param(stat_line("3", "naïve 名前").encode(), "naïve 名前", id="utf8-comm"),
        pytest.param(
            stat_line("3", "a\xffb").encode("latin-1"), "a\ufffdb", id="invalid-utf8-comm"
        ),
        pytest.param(stat_line("3", "x\xc3").encode("latin-1"), "x\ufffd", id="cut-utf8-comm"),
        pytest.param(b"", ProcError.UNREADABLE, id="empty"),
        pytest.param(b"\xff" * 300, ProcError.UNREADABLE, id="binary"),
    ],
)
def test_read_stat_file_content(root: Path, content: bytes, expected: str | ProcError) -> None:
    fakeproc.write_process(root, 3, comm="w", cgroup=cg(), start_ticks=22)
    (root / "3" / "stat").write_bytes(content)
    reader = ProcfsSource(str(root), clk_tck=CLK)
    got = reader.read_pid(3)
    if isinstance(expected, ProcError):
        assert got is expected
        assert reader.errors_total == 1
    else:
        assert isinstance(got, ProcInfo) and (got.comm, got.start_time_ticks) == (expected, 22)
        assert reader.errors_total == 0


def test_stat_size_cases_are_what_they_say() -> None:
    assert len(_stat_bytes(procfs.MAX_FILE_BYTES)) == procfs.MAX_FILE_BYTES
    assert parse_stat(_stat_bytes(procfs.MAX_FILE_BYTES).decode()) == (COMM_AT_LIMIT, 22)


@pytest.mark.parametrize(
    "node",
    [
        pytest.param("fifo-with-writer", id="fifo-with-idle-writer"),
        pytest.param("fifo-with-junk", id="fifo-with-pending-junk"),
        pytest.param((1, 3), id="dev-null"),
        pytest.param((1, 5), id="dev-zero"),
    ],
)
def test_read_stat_special_file_is_unreadable(root: Path, node: str | tuple[int, int]) -> None:
    # stat is read without an fstat check; these must still fail cleanly, and at once.
    fakeproc.write_process(root, 3, comm="w", cgroup=cg(), start_ticks=1)
    stat_path = root / "3" / "stat"
    os.unlink(stat_path)
    held: list[int] = []
    try:
        if isinstance(node, tuple):
            try:
                os.mknod(stat_path, 0o444 | stat.S_IFCHR, os.makedev(*node))
            except PermissionError:
                pytest.skip("no CAP_MKNOD here")
        else:
            os.mkfifo(stat_path)
            # O_RDWR holds a writer without blocking, so a read sees EAGAIN, not EOF.
            held.append(os.open(stat_path, os.O_RDWR | os.O_NONBLOCK))
            if node == "fifo-with-junk":
                os.write(held[0], b"not a stat line\n")
        reader = ProcfsSource(str(root), clk_tck=CLK)
        started = time.monotonic()
        assert reader.read_pid(3) is ProcError.UNREADABLE
        assert reader.read_many([3, 3]) == {3: ProcError.UNREADABLE}
        assert time.monotonic() - started < 2.0
        assert reader.errors_total == 2
    finally:
        for fd in held:
            os.close(fd)


@pytest.mark.parametrize(
    "form",
    [
        pytest.param("plain", id="plain"),
        pytest.param("trailing-slash", id="trailing-slash"),
        pytest.param("empty-is-cwd", id="empty-is-cwd"),
    ],
)
def test_read_root_forms(root: Path, form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fakeproc.write_process(root, 4242, comm="w", cgroup=cg(), start_ticks=100)
    if form == "empty-is-cwd":
        monkeypatch.chdir(root)  # os.path.join("", "4242") is relative, so "" is the cwd
    text = {"plain": str(root), "trailing-slash": f"{root}/", "empty-is-cwd": ""}[form]
    reader = ProcfsSource(text, clk_tck=CLK)
    for _ in range(2):  # a miss, then a cache hit
        got = reader.read_pid(4242)
        assert isinstance(got, ProcInfo) and got.start_time == BTIME + 1
        assert got.cgroup == parse_cgroup(cg())


def test_read_and_read_many_agree(root: Path) -> None:
    fakeproc.write_process(root, 10, comm="a", cgroup=cg(), start_ticks=100)
    fakeproc.write_process(root, 11, comm="b", cgroup="0::/\n", start_ticks=90_000)
    pids = [10, 11, 12, 0]
    one_by_one = ProcfsSource(str(root), clk_tck=CLK)
    batch = ProcfsSource(str(root), clk_tck=CLK)
    for _ in range(2):  # cold cache, then warm
        expected = {pid: one_by_one.read_pid(pid, BTIME + 100) for pid in pids}
        assert batch.read_many(pids, BTIME + 100) == expected
    assert one_by_one.errors_total == batch.errors_total == 2  # pid 0, twice each


@pytest.mark.parametrize(
    "pid",
    [
        pytest.param([3], id="unhashable"),
        pytest.param("3", id="str"),
        pytest.param(3.0, id="float"),
        pytest.param(None, id="none"),
    ],
)
def test_read_non_int_pid(root: Path, pid: object) -> None:
    fakeproc.write_process(root, 3, comm="w", cgroup=cg(), start_ticks=1)
    reader = ProcfsSource(str(root), clk_tck=CLK)
    assert reader.read_pid(pid) is ProcError.UNREADABLE  # type: ignore[arg-type]
    assert reader.errors_total == 1


def test_read_many_reads_btime_once(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for pid in (1, 2, 3):
        fakeproc.write_process(root, pid, comm="w", cgroup=cg(), start_ticks=pid)
    reads: list[str] = []
    real = procfs.read_bounded

    def counting(path: str, limit: int) -> tuple[bytes, bool]:
        reads.append(path)
        return real(path, limit)

    monkeypatch.setattr(procfs, "read_bounded", counting)
    reader = ProcfsSource(str(root), clk_tck=CLK, btime_max_age=0.0)
    reader.read_many([1, 2, 3])
    assert reads.count(os.path.join(str(root), "stat")) == 1
    reader.read_many([1, 2, 3])  # all cache hits now: only btime is read again
    assert reads.count(os.path.join(str(root), "stat")) == 2
    assert len(reads) == 5


def test_read_many_without_btime_counts_each_pid(tmp_path: Path) -> None:
    # A batch retries a failed btime read for each PID, so each one counts an error, as when
    # the PIDs are read one by one.
    for pid in (3, 4):
        fakeproc.write_process(tmp_path, pid, comm="w", cgroup=cg(), start_ticks=1)
    reader = ProcfsSource(str(tmp_path), clk_tck=CLK)
    assert reader.read_many([3, 0, 4]) == {
        3: ProcError.UNREADABLE,
        0: ProcError.UNREADABLE,
        4: ProcError.UNREADABLE,
    }
    assert reader.errors_total == 3


def test_cache_hit_sees_new_comm(root: Path) -> None:
    fakeproc.write_process(root, 20, comm="before", cgroup=cg(UID, CID), start_ticks=100)
    reader = ProcfsSource(str(root), clk_tck=CLK)
    first = reader.read_pid(20)
    assert isinstance(first, ProcInfo)
    assert reader.read_pid(20) is first  # unchanged: the frozen ProcInfo is handed out again
    # prctl(PR_SET_NAME) renames a process without a new start time; the cgroup stays cached.
    fakeproc.write_process(root, 20, comm="after", cgroup=cg(UID2, CID2), start_ticks=100)
    renamed = reader.read_pid(20)
    assert isinstance(renamed, ProcInfo)
    assert (renamed.comm, renamed.cgroup) == ("after", first.cgroup)
    assert reader.read_pid(20) is renamed


def test_read_many_from_threads(root: Path) -> None:
    pids = list(range(1, 41))
    for pid in pids:
        fakeproc.write_process(root, pid, comm=f"w{pid}", cgroup=cg(), start_ticks=pid)
    # A cache smaller than the batch: threads evict each other's entries all the time.
    reader = ProcfsSource(str(root), clk_tck=CLK, cache_size=16)
    expected = ProcfsSource(str(root), clk_tck=CLK).read_many(pids)
    failures: list[object] = []

    def work() -> None:
        try:
            for _ in range(30):
                if reader.read_many(pids) != expected:
                    failures.append("differs")
        except Exception as exc:  # handed to the main thread, which asserts on it
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert reader.errors_total == 0
    assert len(reader._cache) == 16


# --------------------------------------------------------------------------- the real /proc


def test_real_proc_own_process() -> None:
    reader = ProcfsSource()
    before = time.time()
    got = reader.read_pid(os.getpid(), listed_at=before)
    assert isinstance(got, ProcInfo)
    with open("/proc/self/comm") as f:
        assert got.comm == f.read().rstrip("\n")
    with open("/proc/uptime") as f:
        boot = before - float(f.read().split()[0])
    assert boot - 2 <= got.start_time <= before + 1
    with open("/proc/self/cgroup") as f:
        assert got.cgroup == parse_cgroup(f.read())
    # A listing made well before this process started means the PID was reused.
    assert reader.read_pid(os.getpid(), listed_at=got.start_time - 30) is ProcError.REUSED
    assert reader.errors_total == 0


def test_real_proc_child_exits() -> None:
    sleep = shutil.which("sleep")
    if sleep is None:
        pytest.skip("no sleep binary")
    reader = ProcfsSource()
    child = subprocess.Popen([sleep, "30"])
    try:
        deadline = time.monotonic() + 5
        got = reader.read_pid(child.pid)
        # Right after fork the child may still carry the parent's name until exec.
        while isinstance(got, ProcInfo) and got.comm != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
            got = reader.read_pid(child.pid)
        assert isinstance(got, ProcInfo) and got.comm == "sleep"
    finally:
        child.kill()
        child.wait()
    assert reader.read_pid(child.pid) is ProcError.EXITED
    assert reader.errors_total == 0


def test_real_proc_stat_has_btime() -> None:
    with open("/proc/stat") as f:
        btime = parse_btime(f.read())
    assert 0 < btime <= time.time()


# --------------------------------------------------------------------------- fakeproc


@pytest.mark.parametrize("qos", ["burstable", "besteffort", "guaranteed"])
@pytest.mark.parametrize(
    ("runtime", "expected"),
    [("containerd", CD), ("cri-o", CRIO), ("docker", DOCKER), (Runtime.CRIO, CRIO)],
)
def test_fakeproc_v2_systemd_round_trips(qos: str, runtime: str, expected: Runtime) -> None:
    got = parse_cgroup(fakeproc.cgroup_v2_systemd(UID, CID, qos=qos, runtime=runtime))
    assert got is not None
    assert (got.pod_uid, got.container_id, got.runtime) == (UID, CID, expected)
    assert ("-burstable" in got.path, "-besteffort" in got.path) == (
        qos == "burstable",
        qos == "besteffort",
    )


@pytest.mark.parametrize("qos", ["burstable", "besteffort", "guaranteed"])
def test_fakeproc_v1_cgroupfs_round_trips(qos: str) -> None:
    text = fakeproc.cgroup_v1_cgroupfs(STATIC, CID, qos=qos)
    got = parse_cgroup(text)
    assert got is not None and (got.pod_uid, got.container_id) == (STATIC, CID)
    assert any(line.split(":")[1] == "memory" for line in text.splitlines())


def test_fakeproc_host_is_host() -> None:
    got = parse_cgroup(fakeproc.cgroup_host("/user.slice/user-1000.slice/session-2.scope"))
    assert got is not None and (got.pod_uid, got.container_id) == (None, None)


@pytest.mark.parametrize(
    "call",
    [
        lambda: fakeproc.cgroup_v2_systemd(UID, CID, qos="platinum"),
        lambda: fakeproc.cgroup_v2_systemd(UID, CID, runtime="rkt"),
        lambda: fakeproc.cgroup_v1_cgroupfs(UID, CID, qos="gold"),
    ],
    ids=["bad-qos", "bad-runtime", "bad-qos-v1"],
)
def test_fakeproc_rejects_unknown_names(call: Callable[[], str]) -> None:
    with pytest.raises(ValueError):
        call()


def test_fakeproc_write_process_matches_kernel_format(tmp_path: Path) -> None:
    fakeproc.write_process(tmp_path, 31, comm="a-very-long-command", cgroup="0::/\n", start_ticks=9)
    # Same field layout as this machine's real stat file.
    with open(f"/proc/{os.getpid()}/stat") as f:
        real = f.read()
    fake = (tmp_path / "31" / "stat").read_text()
    assert len(fake.rsplit(")", 1)[1].split()) == len(real.rsplit(")", 1)[1].split())
    assert parse_stat(fake) == ("a-very-long-com", 9)
    assert (tmp_path / "31" / "comm").read_text() == "a-very-long-com\n"
    assert (tmp_path / "31" / "cgroup").read_text() == "0::/\n"
    assert not [p for p in os.listdir(tmp_path / "31") if p.startswith(".tmp")]


def test_fakeproc_proc_stat(tmp_path: Path) -> None:
    fakeproc.write_proc_stat(tmp_path / "proc", 1234567890)
    assert parse_btime((tmp_path / "proc" / "stat").read_text()) == 1234567890
