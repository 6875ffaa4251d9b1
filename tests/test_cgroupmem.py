"""The enricher's own memory limit (enricher.cgroupmem): parsing /proc/<pid>/cgroup and the
limit files, on cgroup trees laid out as cgroup v1 and v2 show them inside a container and on
a host. The kernel's own tree is read by tests/test_docker_engine.py (a real container with a
memory limit) and tests/test_image.py (the enricher's image run with one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from enricher.cgroupmem import limit_files, own_cgroups, parse_limit, read_limit

V1 = (
    "12:pids:/docker/abc\n"
    "4:memory:/docker/abc\n"
    "3:cpu,cpuacct:/docker/abc\n"
    "1:name=systemd:/docker/abc\n"
    "0::/docker/abc\n"  # a hybrid host's unified line: no memory controller there
)
V2 = "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param(V1, ("/docker/abc", "/docker/abc"), id="v1-hybrid"),
        pytest.param(
            V2, ("/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope", None), id="v2"
        ),
        pytest.param("0::/\n", ("/", None), id="v2-namespace-root"),
        pytest.param("4:memory:/../etc\n0::relative\n", (None, None), id="unclean-paths"),
        pytest.param("garbage\n\n4:memory\n", (None, None), id="garbage"),
    ],
)
def test_own_cgroups(text: str, want: tuple[str | None, str | None]) -> None:
    assert own_cgroups(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("268435456\n", 268435456, id="v2-bytes"),
        pytest.param("max\n", None, id="v2-no-limit"),
        pytest.param("9223372036854771712\n", None, id="v1-no-limit"),
        pytest.param("0\n", None, id="zero"),
        pytest.param("", None, id="empty"),
        pytest.param("-1\n", None, id="negative"),
        pytest.param("12ab\n", None, id="garbled"),
        pytest.param("9" * 400, None, id="absurdly-long"),
    ],
)
def test_parse_limit(text: str, want: int | None) -> None:
    assert parse_limit(text) == want


def test_limit_files_try_the_joined_path_then_the_mounts_root() -> None:
    assert limit_files(V1, "/cg") == [
        "/cg/docker/abc/memory.max",
        "/cg/memory.max",
        "/cg/memory/docker/abc/memory.limit_in_bytes",
        "/cg/memory/memory.limit_in_bytes",
    ]
    assert limit_files("0::/\n", "/cg") == ["/cg/memory.max"]


def _proc(root: Path, text: str, pid: str = "self") -> str:
    (root / "proc" / pid).mkdir(parents=True)
    (root / "proc" / pid / "cgroup").write_text(text)
    return str(root / "proc")


def _limit(cgroupfs: Path, rel: str, value: str) -> None:
    path = cgroupfs / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value)


def test_v1_container_reads_the_mounts_root(tmp_path: Path) -> None:
    """Docker and Kubernetes on cgroup v1 mount the container's own memory cgroup at
    /sys/fs/cgroup/memory, while /proc/self/cgroup names the host's path."""
    procfs = _proc(tmp_path, V1)
    cg = tmp_path / "cg"
    _limit(cg, "memory/memory.limit_in_bytes", "268435456\n")
    assert read_limit(procfs, str(cg)) == 256 << 20


def test_v1_host_reads_its_own_cgroup(tmp_path: Path) -> None:
    """On the host (the whole hierarchy mounted) the process's own cgroup answers, not the
    root's (which has no limit)."""
    procfs = _proc(tmp_path, V1)
    cg = tmp_path / "cg"
    _limit(cg, "memory/memory.limit_in_bytes", "9223372036854771712\n")
    _limit(cg, "memory/docker/abc/memory.limit_in_bytes", "67108864\n")
    assert read_limit(procfs, str(cg)) == 64 << 20


def test_v2_container_with_its_own_namespace(tmp_path: Path) -> None:
    procfs = _proc(tmp_path, "0::/\n")
    cg = tmp_path / "cg"
    _limit(cg, "memory.max", "268435456\n")
    assert read_limit(procfs, str(cg)) == 256 << 20


def test_v2_host_namespace_reads_the_joined_path(tmp_path: Path) -> None:
    procfs = _proc(tmp_path, V2)
    cg = tmp_path / "cg"
    _limit(cg, "kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope/memory.max", "max\n")
    _limit(cg, "memory.max", "1048576\n")  # never read: the joined path answered first
    assert read_limit(procfs, str(cg)) is None


@pytest.mark.parametrize(
    "layout",
    ["no-proc", "no-limit-file", "a-directory"],
)
def test_nothing_to_read_is_no_limit(tmp_path: Path, layout: str) -> None:
    cg = tmp_path / "cg"
    cg.mkdir()
    procfs = str(tmp_path / "proc")
    if layout != "no-proc":
        procfs = _proc(tmp_path, V1)
    if layout == "a-directory":
        (cg / "memory" / "memory.limit_in_bytes").mkdir(parents=True)
    assert read_limit(procfs, str(cg)) is None


def test_this_process_on_the_real_kernel() -> None:
    """This machine's own /proc and /sys/fs/cgroup: the test process's limit, as the kernel
    writes it (no limit here, or the one its cgroup has)."""
    files = limit_files(Path("/proc/self/cgroup").read_text())
    for path in files:
        if Path(path).is_file():
            assert read_limit() == parse_limit(Path(path).read_text())
            break
    else:
        assert read_limit() is None
