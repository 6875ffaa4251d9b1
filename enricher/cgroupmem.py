"""The enricher's own memory limit: the one the kernel enforces on its cgroup (its container's).

At that limit the kernel's OOM killer ends the enricher, and with it the node's GPU metrics, so
``dcgm_enricher_memory_limit_bytes`` beside ``process_resident_memory_bytes`` lets an alert
warn first (GpuEnricherMemoryNearLimit). Read from the cgroup filesystem:

* cgroup v2: ``memory.max`` of the process's cgroup (``0::<path>`` in /proc/self/cgroup);
* cgroup v1: ``memory.limit_in_bytes`` of its ``memory`` hierarchy's cgroup.

Inside a container the cgroup filesystem usually shows the container's own cgroup as its root
while /proc/self/cgroup names the host's path (cgroup v1, or v2 with the host's cgroup
namespace), so the path joined under the mount is tried first and the mount's root second.
No limit ("max", or v1's page-counter maximum) is None. Parsing is pure; :func:`read_limit`
does the reads, each bounded.
"""

from __future__ import annotations

import posixpath

from .cgroups import MAX_FILE_BYTES, cgroup_lines
from .procfs import read_bounded

CGROUPFS = "/sys/fs/cgroup"
# cgroup v1 writes "no limit" as the page counter's maximum rounded to pages
# (9223372036854771712 with 4 KiB pages); anything this large is no limit.
_UNLIMITED_FROM = 1 << 62
_MAX_LIMIT_BYTES = 64  # a limit file holds one number or "max"


def own_cgroups(text: str) -> tuple[str | None, str | None]:
    """The process's cgroup v2 path and its v1 ``memory`` path from /proc/<pid>/cgroup text
    (None where there is none, or the path climbs with ``..``); the lines as
    cgroups.cgroup_lines accepts them."""
    unified: str | None = None
    memory: str | None = None
    for hierarchy, controllers, path in cgroup_lines(text):
        if ".." in path.split("/"):
            continue
        if hierarchy == "0" and controllers == "":
            unified = path
        elif "memory" in controllers.split(","):
            memory = path
    return unified, memory


def parse_limit(text: str) -> int | None:
    """A cgroup memory limit file's value in bytes; None for no limit or for what is not a
    limit (an empty or garbled file)."""
    value = text.strip()
    if not value.isdigit() or len(value) > 20:
        return None  # "max" (v2: no limit), or not a number
    limit = int(value)
    return limit if 0 < limit < _UNLIMITED_FROM else None


def limit_files(cgroup_text: str, cgroupfs: str = CGROUPFS) -> list[str]:
    """The limit files to try, in order, for a process whose /proc/<pid>/cgroup is
    ``cgroup_text``: each hierarchy's path joined under the mount, then the mount's root."""
    unified, memory = own_cgroups(cgroup_text)
    files: list[str] = []
    if unified is not None:
        files.append(posixpath.join(cgroupfs, unified.lstrip("/"), "memory.max"))
        files.append(posixpath.join(cgroupfs, "memory.max"))
    if memory is not None:
        v1 = posixpath.join(cgroupfs, "memory")
        files.append(posixpath.join(v1, memory.lstrip("/"), "memory.limit_in_bytes"))
        files.append(posixpath.join(v1, "memory.limit_in_bytes"))
    return list(dict.fromkeys(posixpath.normpath(f) for f in files))


def _read(path: str, limit: int) -> str | None:
    """The file's text (None: missing, not a regular file, unreadable, or over ``limit``)."""
    try:
        data, more = read_bounded(path, limit)
    except OSError:
        return None
    return None if more else data.decode("ascii", errors="replace")


def read_limit(procfs: str = "/proc", cgroupfs: str = CGROUPFS, pid: str = "self") -> int | None:
    """The memory limit of ``pid``'s cgroup in bytes (None: no limit, or none could be read).
    The first limit file that exists answers, the limit or no limit."""
    cgroup = _read(posixpath.join(procfs, pid, "cgroup"), MAX_FILE_BYTES)
    if cgroup is None:
        return None
    for path in limit_files(cgroup, cgroupfs):
        text = _read(path, _MAX_LIMIT_BYTES)
        if text is not None:
            return parse_limit(text)
    return None
