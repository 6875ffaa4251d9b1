"""A SIMULATED node's ``/proc`` tree, for the demo, the tests and the benchmark.

Nothing here touches the real procfs: it writes ordinary files under a directory of your
choosing, in the same formats the kernel uses, so that ``ProcfsSource(root=...)`` can read them.
Files are replaced atomically, so a reader never sees a half-written file.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from .gpus import UPTIME_AT_START
from .node import SimNode, SimProc

__all__ = [
    "cgroup_host",
    "cgroup_v1_cgroupfs",
    "cgroup_v2_systemd",
    "proc_cgroup",
    "remove_process",
    "write_proc_stat",
    "write_proc_tree",
    "write_process",
]

StrPath = str | os.PathLike[str]

_TASK_COMM_LEN = 15  # the kernel keeps 15 bytes of a command name
_SCOPE_PREFIX = {
    "containerd": "cri-containerd-",
    "cri-o": "crio-",
    "crio": "crio-",
    "docker": "docker-",
}
_V1_CONTROLLERS = (
    "rdma",
    "hugetlb",
    "pids",
    "net_cls,net_prio",
    "cpuset",
    "memory",
    "devices",
    "blkio",
    "perf_event",
    "freezer",
    "cpu,cpuacct",
)


def _write_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_proc_stat(root: StrPath, btime: int) -> None:
    """Write ``<root>/stat`` with a boot time of ``btime`` (Unix seconds)."""
    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    text = (
        "cpu  10132153 290696 3084719 46828483 16683 0 25195 0 0 0\n"
        "cpu0 1393280 32966 572056 13343292 6130 0 17875 0 0 0\n"
        "cpu1 1335553 28609 497545 13368003 4452 0 3722 0 0 0\n"
        "intr 199292243 10 0 0 0 0 0 0 0 1 0 0 0 0 0 0 0\n"
        "ctxt 392233217\n"
        f"btime {int(btime)}\n"
        "processes 470391\n"
        "procs_running 2\n"
        "procs_blocked 0\n"
        "softirq 80741585 0 20114946 14453 4419024 0 0 1254012 24734063 0 30205087\n"
    )
    _write_atomic(os.path.join(root, "stat"), text)


def write_process(root: StrPath, pid: int, *, comm: str, cgroup: str, start_ticks: int) -> None:
    """Create or replace ``<root>/<pid>/{stat,cgroup,comm}`` for a simulated process.

    ``start_ticks`` lands in field 22 of ``stat``; ``comm`` is cut to 15 characters as the
    kernel does; ``cgroup`` is written as given (see the ``cgroup_*`` helpers).
    """
    if pid <= 0 or start_ticks < 0:
        raise ValueError(f"pid must be positive and start_ticks not negative: {pid}, {start_ticks}")
    comm = comm[:_TASK_COMM_LEN]
    directory = os.path.join(os.fspath(root), str(pid))
    os.makedirs(directory, exist_ok=True)
    # Fields 3..52 of proc(5); starttime (22) is the only one the reader relies on.
    after_comm = [
        "S", "1", str(pid), str(pid), "0", "-1", "4194560", "2510", "0", "3", "0",  # 3..13
        "118", "41", "0", "0", "20", "0", "7", "0", str(start_ticks),  # 14..22
        "2794356736", "61302", "18446744073709551615", "1", "1", "0", "0", "0", "0",  # 23..31
        "0", "4096", "17642", "0", "0", "0", "17", "1", "0", "0", "0", "0", "0",  # 32..44
        "0", "0", "0", "0", "0", "0", "0", "0",  # 45..52
    ]  # fmt: skip
    _write_atomic(os.path.join(directory, "stat"), f"{pid} ({comm}) {' '.join(after_comm)}\n")
    _write_atomic(os.path.join(directory, "cgroup"), cgroup)
    _write_atomic(os.path.join(directory, "comm"), comm + "\n")


def remove_process(root: StrPath, pid: int) -> None:
    """Remove ``<root>/<pid>`` as if the process had exited; a missing one is fine."""
    shutil.rmtree(os.path.join(os.fspath(root), str(pid)), ignore_errors=True)


def _qos_word(qos: str) -> str:
    if qos in ("", "guaranteed"):
        return ""
    if qos in ("burstable", "besteffort"):
        return qos
    raise ValueError(f"unknown QoS class {qos!r}")


def cgroup_v2_systemd(
    pod_uid: str, container_id: str, qos: str = "burstable", runtime: str = "containerd"
) -> str:
    """A cgroup v2 file for a container under the kubelet's systemd driver.

    ``qos`` is ``burstable``, ``besteffort`` or ``guaranteed``; ``runtime`` is ``containerd``,
    ``cri-o`` or ``docker`` (a ``Runtime`` value works too).
    """
    prefix = _SCOPE_PREFIX.get(str(getattr(runtime, "value", runtime)))
    if prefix is None:
        raise ValueError(f"unknown runtime {runtime!r}")
    word = _qos_word(qos)
    uid = pod_uid.replace("-", "_")
    if word:
        path = f"/kubepods.slice/kubepods-{word}.slice/kubepods-{word}-pod{uid}.slice"
    else:
        path = f"/kubepods.slice/kubepods-pod{uid}.slice"
    return f"0::{path}/{prefix}{container_id}.scope\n"


def cgroup_v1_cgroupfs(pod_uid: str, container_id: str, qos: str = "burstable") -> str:
    """A cgroup v1 file for a container under the kubelet's cgroupfs driver (bare id)."""
    word = _qos_word(qos)
    path = f"/kubepods/{word}/pod{pod_uid}/{container_id}".replace("//", "/")
    count = len(_V1_CONTROLLERS) + 1
    lines = [f"{count - i}:{c}:{path}" for i, c in enumerate(_V1_CONTROLLERS)]
    lines.append(f"1:name=systemd:{path}")
    return "\n".join(lines) + "\n"


def cgroup_host(path: str = "/system.slice/sshd.service") -> str:
    """A cgroup v2 file for a process outside any container."""
    return f"0::{path}\n"


def proc_cgroup(proc: SimProc) -> str:
    """The cgroup file of ``proc``: its pod's, in the pod's layout, or its host unit's."""
    if proc.cgroup is not None:
        return proc.cgroup
    pod = proc.pod
    if pod is None:
        return cgroup_host(proc.host_cgroup)
    uid = pod.mirror_of or pod.uid
    if pod.cgroup_style == "cgroupfs":
        return cgroup_v1_cgroupfs(uid, pod.container_id, qos=pod.qos)
    return cgroup_v2_systemd(uid, pod.container_id, qos=pod.qos, runtime=pod.runtime)


def write_proc_tree(root: StrPath, node: SimNode, now: float) -> None:
    """Write ``node``'s SIMULATED /proc tree (booted ``UPTIME_AT_START``, a day, before
    ``now``, in whole seconds as btime is): one directory per live process with stat, comm
    and cgroup, started one after the other."""
    write_proc_stat(root, int(now) - UPTIME_AT_START)
    live = [p for p in node.procs if not p.exited]
    for i, proc in enumerate(live):
        ticks = proc.start_ticks
        if ticks is None:
            ticks = node.first_ticks + i * node.ticks_apart
        write_process(root, proc.pid, comm=proc.comm, cgroup=proc_cgroup(proc), start_ticks=ticks)
