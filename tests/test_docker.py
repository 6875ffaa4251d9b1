"""The Docker source: pure parsing and rendering, and the real aiohttp client talking to a
Docker Engine API stand-in on a unix socket (tests/dockerapi.py; no engine runs here)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from devkit.clocks import Clock
from enricher.attribution import (
    Attribution,
    attribute,
    cgroup_containers,
    choose_docker,
    docker_lookup_ids,
    plan_devices,
)
from enricher.cli import parse_config
from enricher.commands import make_docker_source
from enricher.docker import (
    DEFAULT_HOST,
    MAX_VALUE_CHARS,
    DockerSource,
    parse_api_version,
    parse_docker_host,
    parse_error_message,
    parse_inspect,
    parse_inspect_body,
)
from enricher.families import (
    CONTAINER_INFO,
    RenderOptions,
    render_container_info,
    render_families,
)
from enricher.labels import SHARED, Owner
from enricher.model import (
    CgroupRef,
    DockerContainer,
    GpuProcess,
    GpuSnapshot,
    PodIndex,
    ProcError,
    ProcInfo,
    Runtime,
    short_id,
)
from enricher.selfmetrics import self_metrics
from tests.conftest import assert_valid_exposition, examples
from tests.dockerapi import DockerAPI, FakeContainer, compose_labels, container_id, inspect_document

CID = container_id("trainer")
CID2 = container_id("notebook")
TRAINER = FakeContainer(
    CID, "trainer", "nvcr.io/nvidia/pytorch:24.08-py3", compose_labels("lab", "train")
)


def doc(**changes: Any) -> dict[str, Any]:
    """Docker's inspect document for TRAINER, with top-level fields replaced (None deletes)."""
    d = inspect_document(TRAINER)
    for key, value in changes.items():
        if value is None:
            d.pop(key, None)
        else:
            d[key] = value
    return d


def with_config(**changes: Any) -> dict[str, Any]:
    d = doc()
    for key, value in changes.items():
        if value is None:
            d["Config"].pop(key, None)
        else:
            d["Config"][key] = value
    return d


# --------------------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        pytest.param("unix:///var/run/docker.sock", "/var/run/docker.sock", id="default"),
        pytest.param(
            "unix:///run/user/1000/docker.sock", "/run/user/1000/docker.sock", id="rootless"
        ),
        pytest.param(
            "unix:///host/run/docker.sock", "/host/run/docker.sock", id="mounted-elsewhere"
        ),
        pytest.param("", None, id="empty-is-cgroup-only"),
    ],
)
def test_parse_docker_host(host: str, expected: str | None) -> None:
    assert parse_docker_host(host) == expected


@pytest.mark.parametrize(
    "host",
    [
        pytest.param("tcp://10.0.0.1:2375", id="tcp"),
        pytest.param("tcp://10.0.0.1:2376", id="tls"),
        pytest.param("ssh://lab@gpu-box", id="ssh"),
        pytest.param("npipe:////./pipe/docker_engine", id="windows-pipe"),
        pytest.param("/var/run/docker.sock", id="no-scheme"),
        pytest.param("unix://", id="no-path"),
        pytest.param("unix://var/run/docker.sock", id="relative-path"),
        pytest.param("unix:///var/run/\x00docker.sock", id="nul-byte"),
        pytest.param("unix:///" + "d" * 120, id="longer-than-sun-path"),
        pytest.param("UNIX:///var/run/docker.sock", id="scheme-case"),
    ],
)
def test_parse_docker_host_rejects(host: str) -> None:
    with pytest.raises(ValueError, match=r"--docker\.host"):
        parse_docker_host(host)


IMAGE_ID = doc()["Image"]


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(
            doc(),
            DockerContainer(CID, "trainer", "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train"),
            id="compose-service",
        ),
        pytest.param(
            with_config(Labels={}),
            DockerContainer(CID, "trainer", "nvcr.io/nvidia/pytorch:24.08-py3"),
            id="docker-run-no-labels",
        ),
        pytest.param(
            with_config(Labels=None),
            DockerContainer(CID, "trainer", "nvcr.io/nvidia/pytorch:24.08-py3"),
            id="labels-missing",
        ),
        pytest.param(
            with_config(Labels=["com.docker.compose.project=lab"]),
            DockerContainer(CID, "trainer", "nvcr.io/nvidia/pytorch:24.08-py3"),
            id="labels-not-a-map",
        ),
        pytest.param(
            with_config(
                Labels={"com.docker.compose.project": 7, "com.docker.compose.service": None}
            ),
            DockerContainer(CID, "trainer", "nvcr.io/nvidia/pytorch:24.08-py3"),
            id="label-values-not-strings",
        ),
        pytest.param(
            doc(Name="trainer"),
            DockerContainer(CID, "trainer", "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train"),
            id="name-without-slash",
        ),
        pytest.param(
            doc(Name="//odd"),
            DockerContainer(CID, "/odd", "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train"),
            id="only-one-slash-stripped",
        ),
        pytest.param(
            doc(Name=None),
            DockerContainer(CID, CID[:12], "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train"),
            id="name-missing-short-id",
        ),
        pytest.param(
            doc(Name="/"),
            DockerContainer(CID, CID[:12], "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train"),
            id="name-empty-short-id",
        ),
        pytest.param(
            doc(Name=["/x"]),
            DockerContainer(CID, CID[:12], "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train"),
            id="name-not-string",
        ),
        pytest.param(
            with_config(Image=""),
            DockerContainer(CID, "trainer", IMAGE_ID, "lab", "train"),
            id="config-image-empty-image-id",
        ),
        pytest.param(
            doc(Config=None), DockerContainer(CID, "trainer", IMAGE_ID), id="config-missing"
        ),
        pytest.param(
            doc(Config="x", Image=None), DockerContainer(CID, "trainer"), id="config-not-a-map"
        ),
        pytest.param(
            doc(Name="/" + "n" * 5000),
            DockerContainer(
                CID, "n" * (MAX_VALUE_CHARS - 1), "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train"
            ),
            id="long-name-cut",
        ),
        pytest.param(
            doc(Name='/a"b\\c\nd'),
            DockerContainer(CID, 'a"b\\c\nd', "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train"),
            id="hostile-name-kept-for-escaping",
        ),
        pytest.param(
            doc(Name="/caf\udce9"),
            DockerContainer(CID, "caf?", "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train"),
            id="lone-surrogate-replaced",
        ),
        pytest.param(
            {"Id": CID, "Name": "/minimal"}, DockerContainer(CID, "minimal"), id="minimal-document"
        ),
    ],
)
def test_parse_inspect(obj: Any, expected: DockerContainer) -> None:
    assert parse_inspect(obj) == expected


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(doc(Id=None), id="id-missing"),
        pytest.param(doc(Id=CID[:12]), id="id-short"),
        pytest.param(doc(Id=CID.upper()), id="id-uppercase"),
        pytest.param(doc(Id=CID + "0"), id="id-65-hex"),
        pytest.param(doc(Id="sha256:" + CID), id="id-with-prefix"),
        pytest.param(doc(Id=12), id="id-number"),
        pytest.param([doc()], id="list"),
        pytest.param("trainer", id="string"),
        pytest.param(None, id="null"),
        pytest.param({"message": "No such container: x"}, id="error-body"),
    ],
)
def test_parse_inspect_rejects(obj: Any) -> None:
    with pytest.raises(ValueError):
        parse_inspect(obj)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        pytest.param(json.dumps(doc()).encode(), None, id="ok"),
        pytest.param(json.dumps(doc()).encode()[:-9], "not JSON", id="truncated"),
        pytest.param(b"", "not JSON", id="empty"),
        pytest.param(b"<html>502 Bad Gateway</html>", "not JSON", id="html"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "not JSON", id="deeply-nested"),
        pytest.param(json.dumps(doc(Id=CID2)).encode(), "asked for", id="another-container"),
        pytest.param(
            json.dumps(doc()).replace('"/trainer"', '"/tr\\u00e9"').encode()[:],
            None,
            id="escaped-unicode",
        ),
        pytest.param(
            json.dumps(doc()).encode().replace(b'"/trainer"', b'"/tr\xff"'),
            None,
            id="invalid-utf8-replaced",
        ),
    ],
)
def test_parse_inspect_body(body: bytes, error: str | None) -> None:
    if error is None:
        c = parse_inspect_body(body, CID)
        assert c.id == CID and c.compose_service == "train"
        c.name.encode("utf-8")
    else:
        with pytest.raises(ValueError, match=error):
            parse_inspect_body(body, CID)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            b'{"message":"No such container: abc"}\n', "No such container: abc", id="docker"
        ),
        pytest.param(b'{"message": 5}', '{"message": 5}', id="message-not-string"),
        pytest.param(b"page not found", "page not found", id="plain-text"),
        pytest.param(b"x" * 1000, "x" * 200, id="long-cut"),
        pytest.param(b"\xff\xfe", "\ufffd\ufffd", id="binary"),
    ],
)
def test_parse_error_message(body: bytes, expected: str) -> None:
    assert parse_error_message(body) == expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        pytest.param("1.51", "1.51", id="docker-28"),
        pytest.param("1.44", "1.44", id="docker-25"),
        pytest.param(" 1.41 ", "1.41", id="spaces"),
        pytest.param("1.41; rm -rf", None, id="junk-after"),
        pytest.param("2.0", None, id="major-2"),
        pytest.param("1.", None, id="no-minor"),
        pytest.param("../1.41", None, id="path"),
        pytest.param("", None, id="empty"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_parse_api_version(header: str | None, expected: str | None) -> None:
    assert parse_api_version(header) == expected


def test_short_id() -> None:
    assert short_id(CID) == CID[:12] == DockerContainer.from_id(CID).name
    assert DockerContainer.from_id(CID) == DockerContainer(CID, CID[:12], resolved=False)


def _info_samples(text: str) -> list[dict[str, str]]:
    families = [f for f in text_string_to_metric_families(text) if f.name == CONTAINER_INFO]
    assert len(families) == 1
    assert families[0].type == "gauge"
    assert all(s.value == 1 for s in families[0].samples)
    out = []
    for s in families[0].samples:
        labels = dict(s.labels)
        # Written empty on purpose, like on every series (honor_labels guard).
        assert (labels.pop("namespace"), labels.pop("pod")) == ("", "")
        out.append(labels)
    return out


def test_render_container_info(promtools: list[str]) -> None:
    hostile = DockerContainer(CID2, 'nb "1"\\\nx', 'img:"q"', "p\\", "s\n")
    plain = DockerContainer(CID, "trainer", "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train")
    text = render_container_info([hostile, plain, plain, DockerContainer.from_id(CID2)])
    for promtool in promtools:
        assert_valid_exposition(promtool, text)
    samples = _info_samples(text)
    # One series per container ID (the last answer wins), sorted by name.
    assert samples == [
        {
            "container": CID2[:12],
            "container_id": CID2,
            "image": "",
            "compose_project": "",
            "compose_service": "",
        },
        {
            "container": "trainer",
            "container_id": CID,
            "image": "nvcr.io/nvidia/pytorch:24.08-py3",
            "compose_project": "lab",
            "compose_service": "train",
        },
    ]


def test_render_container_info_escapes(promtools: list[str]) -> None:
    hostile = DockerContainer(CID2, 'nb "1"\\\nx', 'img:"q"', "p\\", "s\n")
    text = render_container_info([hostile])
    for promtool in promtools:
        assert_valid_exposition(promtool, text)
    assert _info_samples(text) == [
        {
            "container": 'nb "1"\\\nx',
            "container_id": CID2,
            "image": 'img:"q"',
            "compose_project": "p\\",
            "compose_service": "s\n",
        }
    ]


def test_render_container_info_empty() -> None:
    text = render_container_info([])
    assert text.startswith(f"# HELP {CONTAINER_INFO} ")
    assert f"# TYPE {CONTAINER_INFO} gauge\n" in text
    assert _info_samples(text) == []


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
_HOSTILE_TEXT = st.text(max_size=700) | st.sampled_from(['"', "\\", "\n", "/", "\udcff", "\x00"])
_LABELS = st.dictionaries(
    st.sampled_from(["com.docker.compose.project", "com.docker.compose.service", "other"]),
    _HOSTILE_TEXT | _JSON,
    max_size=3,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    name=_HOSTILE_TEXT | _JSON,
    image=_HOSTILE_TEXT | _JSON,
    labels=_LABELS | _JSON,
    config_extra=_JSON,
)
def test_parse_inspect_hostile_values(
    name: Any, image: Any, labels: Any, config_extra: Any
) -> None:
    obj = {"Id": CID, "Name": name, "Config": {"Image": image, "Labels": labels, "x": config_extra}}
    c = parse_inspect(obj)
    for value in (c.name, c.image, c.compose_project, c.compose_service):
        assert isinstance(value, str)
        assert len(value) <= MAX_VALUE_CHARS
        value.encode("utf-8")  # a lone surrogate would fail the scrape's encode
    assert c.name  # never empty: the short ID stands in
    # Whatever the values, the rendered series parses back to exactly them.
    (labels_out,) = _info_samples(render_container_info([c]))
    assert labels_out == {
        "container": c.name,
        "container_id": CID,
        "image": c.image,
        "compose_project": c.compose_project,
        "compose_service": c.compose_service,
    }


@settings(max_examples=examples(300), deadline=None)
@given(obj=_JSON)
def test_parse_inspect_never_raises_anything_but_value_error(obj: Any) -> None:
    with contextlib.suppress(ValueError):
        parse_inspect(obj)


# --------------------------------------------------------------------------- I/O


@pytest.fixture
def sock_dir() -> Iterator[str]:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path can be longer.
    path = tempfile.mkdtemp(prefix="dk-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def dockerd(sock_dir: str) -> Iterator[DockerAPI]:
    api = DockerAPI(os.path.join(sock_dir, "docker.sock")).start()
    api.add("trainer", labels=compose_labels("lab", "train"))
    api.add("notebook", image="quay.io/jupyter/pytorch-notebook:cuda12-2024-09-02")
    yield api
    api.stop()


@pytest.fixture
def clock() -> Clock:
    return Clock()


MakeSource = Callable[..., DockerSource]


def names(got: dict[str, DockerContainer | None]) -> dict[str, str | None]:
    return {cid: (c.name if c is not None else None) for cid, c in got.items()}


@pytest.fixture
async def make_source(dockerd: DockerAPI, clock: Clock) -> AsyncIterator[MakeSource]:
    made: list[DockerSource] = []

    def make(host: str | None = None, **kw: Any) -> DockerSource:
        kw.setdefault("timeout", 2.0)
        source = DockerSource(
            f"unix://{dockerd.socket_path}" if host is None else host, clock=clock, **kw
        )
        made.append(source)
        return source

    yield make
    for source in made:
        await source.close()


async def test_found(dockerd: DockerAPI, make_source: MakeSource) -> None:
    source = make_source()
    assert source.enabled and not source.up
    got = await source.lookup([CID, CID2])
    assert got == {
        CID: DockerContainer(CID, "trainer", "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train"),
        CID2: DockerContainer(
            CID2, "notebook", "quay.io/jupyter/pytorch-notebook:cuda12-2024-09-02"
        ),
    }
    assert source.up and source.errors_total == 0
    assert source.api_version == "1.51"
    assert dockerd.pings() == 1
    assert ("GET", f"/v1.51/containers/{CID}/json") in dockerd.requests
    assert dockerd.methods() == {"GET"}  # read-only: nothing but GET is ever sent


@pytest.mark.parametrize(
    ("min_api", "max_api"),
    [
        pytest.param("1.12", "1.41", id="docker-20.10"),
        pytest.param("1.24", "1.47", id="docker-27"),
        pytest.param("1.44", "1.52", id="docker-29-refuses-below-1.44"),
    ],
)
async def test_speaks_the_daemons_version(
    dockerd: DockerAPI, make_source: MakeSource, min_api: str, max_api: str
) -> None:
    dockerd.min_api, dockerd.max_api = min_api, max_api
    source = make_source()
    assert (await source.lookup([CID]))[CID] is not None
    assert source.errors_total == 0
    assert ("GET", f"/v{max_api}/containers/{CID}/json") in dockerd.requests


async def test_daemon_without_version_header_gets_unversioned_paths(
    dockerd: DockerAPI, make_source: MakeSource
) -> None:
    dockerd.advertise_version = False
    source = make_source()
    got = await source.lookup([CID])
    assert names(got)[CID] == "trainer"
    assert ("GET", f"/containers/{CID}/json") in dockerd.requests


async def test_daemon_upgraded_under_us_renegotiates(
    dockerd: DockerAPI, make_source: MakeSource
) -> None:
    dockerd.max_api = "1.47"
    source = make_source()
    await source.lookup([CID])
    dockerd.min_api, dockerd.max_api = "1.48", "1.52"  # the new daemon refuses 1.47
    first = await source.lookup([CID2])
    assert first[CID2] == DockerContainer.from_id(CID2)
    assert source.errors_total == 1 and not source.up
    second = await source.lookup([CID2])
    assert names(second)[CID2] == "notebook"
    assert source.api_version == "1.52" and source.up


async def test_known_ids_are_served_from_the_cache(
    dockerd: DockerAPI, make_source: MakeSource, clock: Clock
) -> None:
    source = make_source()
    await source.lookup([CID])
    clock.now += 299
    assert (await source.lookup([CID]))[CID] is not None
    assert dockerd.inspects() == 1
    # An unknown ID next to a known one: just that one is fetched.
    await source.lookup([CID, CID2])
    assert dockerd.inspects(CID) == 1 and dockerd.inspects(CID2) == 1


async def test_one_request_per_id_in_flight(dockerd: DockerAPI, make_source: MakeSource) -> None:
    dockerd.delay[CID] = 0.3
    source = make_source()
    results = await asyncio.gather(*(source.lookup([CID]) for _ in range(5)))
    assert all(names(r)[CID] == "trainer" for r in results)
    assert dockerd.inspects(CID) == 1
    assert dockerd.pings() == 1


async def test_rename_shows_after_the_ttl(
    dockerd: DockerAPI, make_source: MakeSource, clock: Clock
) -> None:
    source = make_source(found_ttl=300)
    await source.lookup([CID])
    dockerd.rename(CID, "trainer-v2")
    assert names(await source.lookup([CID])) == {CID: "trainer"}
    clock.now += 300
    assert names(await source.lookup([CID])) == {CID: "trainer-v2"}


async def test_vanished_container_is_remembered_then_evicted(
    dockerd: DockerAPI, make_source: MakeSource, clock: Clock
) -> None:
    gone = container_id("finished-job")
    source = make_source(vanished_ttl=60)
    assert (await source.lookup([gone]))[gone] is None
    assert source.up and source.errors_total == 0
    for _ in range(3):  # a scrape loop does not hammer the socket
        clock.now += 15
        assert (await source.lookup([gone]))[gone] is None
    assert dockerd.inspects(gone) == 1
    clock.now += 15  # 60 s after the answer: asked again
    assert (await source.lookup([gone]))[gone] is None
    assert dockerd.inspects(gone) == 2
    # No longer asked about: dropped once twice its TTL old.
    assert len(source._cache) == 1
    clock.now += 119
    await source.lookup([CID])
    assert len(source._cache) == 2
    clock.now += 1
    await source.lookup([CID])
    assert len(source._cache) == 1


async def test_a_404_that_is_not_about_the_container_is_an_error(
    dockerd: DockerAPI, make_source: MakeSource
) -> None:
    dockerd.fail[CID] = 404  # e.g. a proxy on the socket answering "page not found"
    source = make_source()
    assert (await source.lookup([CID]))[CID] == DockerContainer.from_id(CID)
    assert source.errors_total == 1 and not source.up
    assert len(source._cache) == 0  # not remembered as gone


async def test_slow_daemon_times_out_without_holding_others(
    dockerd: DockerAPI, make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    dockerd.delay[CID] = 3.0
    source = make_source(timeout=0.3)
    with caplog.at_level(logging.DEBUG, logger="enricher.docker"):
        got = await source.lookup([CID, CID2])
    assert got[CID] == DockerContainer.from_id(CID)
    assert names(got)[CID2] == "notebook"
    assert source.errors_total == 1 and not source.up
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "timeout" in warnings[0].getMessage()


async def test_garbage_body_is_an_error_not_a_crash(
    dockerd: DockerAPI, make_source: MakeSource
) -> None:
    dockerd.garbage.add(CID)
    source = make_source()
    assert (await source.lookup([CID]))[CID] == DockerContainer.from_id(CID)
    assert source.errors_total == 1 and not source.up
    dockerd.garbage.clear()
    got = await source.lookup([CID])  # not cached as anything: asked again
    assert names(got)[CID] == "trainer"
    assert source.up and source.errors_total == 1


async def test_an_answer_about_another_container_is_refused(
    dockerd: DockerAPI, make_source: MakeSource
) -> None:
    dockerd.impostor[CID] = CID2
    source = make_source()
    assert (await source.lookup([CID]))[CID] == DockerContainer.from_id(CID)
    assert source.errors_total == 1


async def test_oversized_answer_is_cut_off(dockerd: DockerAPI, make_source: MakeSource) -> None:
    dockerd.huge.add(CID)
    source = make_source(max_bytes=256 * 1024)
    assert (await source.lookup([CID]))[CID] == DockerContainer.from_id(CID)
    assert source.errors_total == 1


async def test_last_answer_kept_while_the_daemon_fails(
    dockerd: DockerAPI, make_source: MakeSource, clock: Clock
) -> None:
    source = make_source(found_ttl=300)
    first = (await source.lookup([CID]))[CID]
    clock.now += 301
    dockerd.fail[CID] = 500
    assert (await source.lookup([CID]))[CID] == first  # stale beats flapping to a short ID
    assert source.errors_total == 1 and not source.up


async def test_socket_missing_is_down_until_it_appears(
    sock_dir: str, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A configured socket that is missing is a source that is down (issue 12: failures
    show), not one switched off; containers get short IDs meanwhile."""
    path = os.path.join(sock_dir, "later.sock")
    source = DockerSource(f"unix://{path}", timeout=2.0, clock=clock)
    try:
        with caplog.at_level(logging.INFO, logger="enricher.docker"):
            got = await source.lookup([CID])
            await source.lookup([CID])
        assert got[CID] == DockerContainer.from_id(CID)
        assert source.enabled and not source.up and source.errors_total == 2
        warnings = [r for r in caplog.records if "no socket" in r.getMessage()]
        assert [r.levelno for r in warnings] == [logging.WARNING]  # once per episode
        assert not await source.ping()
        with DockerAPI(path) as api:
            api.add("trainer")
            got = await source.lookup([CID])
            assert names(got)[CID] == "trainer"
            assert source.enabled and source.up
    finally:
        await source.close()


async def test_cgroup_only_mode_never_touches_a_socket(dockerd: DockerAPI, clock: Clock) -> None:
    source = DockerSource("", clock=clock)
    try:
        got = await source.lookup([CID, CID2])
        assert got == {CID: DockerContainer.from_id(CID), CID2: DockerContainer.from_id(CID2)}
        assert not source.enabled and not await source.ping()
        assert dockerd.requests == []
    finally:
        await source.close()


@pytest.mark.parametrize("kind", ["directory", "regular-file"])
async def test_socket_path_that_is_no_socket_is_down(
    sock_dir: str, clock: Clock, kind: str
) -> None:
    # What a bind mount of a missing host path leaves behind (Docker creates a directory).
    path = os.path.join(sock_dir, "docker.sock")
    if kind == "directory":
        os.mkdir(path)
    else:
        open(path, "w").close()
    source = DockerSource(f"unix://{path}", timeout=2.0, clock=clock)
    try:
        got = await source.lookup([CID])
        assert got[CID] == DockerContainer.from_id(CID)
        assert source.enabled and not source.up and source.errors_total >= 1
    finally:
        await source.close()


async def test_health_ping_when_nothing_is_asked(
    dockerd: DockerAPI, make_source: MakeSource, clock: Clock
) -> None:
    source = make_source(health_interval=30)
    assert await source.lookup([]) == {}
    assert source.up and dockerd.pings() == 1
    clock.now += 29
    await source.lookup([])
    assert dockerd.pings() == 1
    clock.now += 1
    await source.lookup([])
    assert dockerd.pings() == 2 and source.up
    dockerd.stop()
    assert not await source.ping()
    assert source.errors_total == 1


async def test_ids_that_are_no_container_ids_are_never_sent(
    dockerd: DockerAPI, make_source: MakeSource
) -> None:
    source = make_source()
    bad = ["../../_ping", CID[:12], CID.upper(), "trainer", ""]
    got = await source.lookup(bad)
    assert got == dict.fromkeys(bad)
    assert dockerd.inspects() == 0


async def test_bounds(dockerd: DockerAPI, make_source: MakeSource) -> None:
    ids = [dockerd.add(f"job-{i}").id for i in range(5)]
    source = make_source(max_ids=4, cache_size=2)
    got = await source.lookup(ids)
    assert [names(got)[i] for i in ids[:4]] == [f"job-{i}" for i in range(4)]
    assert got[ids[4]] == DockerContainer.from_id(ids[4])  # over max_ids: not asked this time
    assert dockerd.inspects() == 4
    assert len(source._cache) == 2


async def test_close_cancels_requests_in_flight(
    dockerd: DockerAPI, make_source: MakeSource
) -> None:
    dockerd.delay[CID] = 30.0
    source = make_source(timeout=20.0)
    pending = asyncio.create_task(source.lookup([CID]))
    while dockerd.inspects(CID) == 0:
        await asyncio.sleep(0.01)
    await source.close()
    # The lookup ends at once, naming the container by its short ID.
    assert (await asyncio.wait_for(pending, 5))[CID] == DockerContainer.from_id(CID)


async def test_socket_gone_keeps_last_answers_until_they_age_out(
    sock_dir: str, clock: Clock
) -> None:
    """A daemon restart removes and recreates its socket: names hold meanwhile."""
    path = os.path.join(sock_dir, "docker.sock")
    source = DockerSource(f"unix://{path}", timeout=2.0, clock=clock, found_ttl=300)
    try:
        with DockerAPI(path) as api:
            api.add("trainer")
            assert names(await source.lookup([CID]))[CID] == "trainer"
        os.unlink(path)
        got = await source.lookup([CID, CID2])
        assert names(got) == {CID: "trainer", CID2: short_id(CID2)}
        assert source.enabled and not source.up  # gone while configured: down, not off
        clock.now += 2 * 300
        assert (await source.lookup([CID]))[CID] == DockerContainer.from_id(CID)
    finally:
        await source.close()


# --------------------------------------------------------------------------- Docker mode


def test_docker_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("ENRICHER_DOCKER_HOST", "ENRICHER_DOCKER_TIMEOUT", "NODE_NAME"):
        monkeypatch.delenv(key, raising=False)
    _, cfg, _ = parse_config([])
    assert cfg.docker_host == DEFAULT_HOST and cfg.docker_timeout == 2.0
    assert cfg.docker_active and not cfg.kube_active
    monkeypatch.setenv("ENRICHER_DOCKER_HOST", "unix:///run/user/1000/docker.sock")
    _, cfg, _ = parse_config(["--docker.timeout", "0.5"])
    assert cfg.docker_host == "unix:///run/user/1000/docker.sock" and cfg.docker_timeout == 0.5
    _, cfg, _ = parse_config(["ps", "--docker.host", ""])
    assert cfg.docker_host == "" and cfg.docker_active
    _, cfg, _ = parse_config(["--kube.node-name", "gpu-node-a"])
    assert cfg.kube_active and not cfg.docker_active
    assert make_docker_source(cfg) is None


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--docker.host", "tcp://10.0.0.1:2375"], id="tcp"),
        pytest.param(["--docker.host", "/var/run/docker.sock"], id="no-scheme"),
        pytest.param(["resolve", "--docker.host", "unix://docker.sock", "1"], id="relative"),
        pytest.param(["--docker.timeout", "0"], id="zero-timeout"),
        pytest.param(["--docker.timeout", "inf"], id="infinite-timeout"),
    ],
)
def test_docker_flag_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config(argv)
    assert info.value.code == 2
    assert "--docker." in capsys.readouterr().err


INNER = container_id("inner")
ROOTLESS = container_id("rootless")


def cg(path: str, container: str | None, pod: str | None = None) -> CgroupRef:
    return CgroupRef(pod, container, Runtime.DOCKER, path)


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        pytest.param(cg(f"/docker/{CID}", CID), (CID,), id="v1-cgroupfs"),
        pytest.param(cg(f"/system.slice/docker-{CID}.scope", CID), (CID,), id="v2-systemd"),
        pytest.param(
            cg(f"/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{CID}.scope", CID),
            (CID,),
            id="rootless",
        ),
        pytest.param(cg(f"/docker/{CID}/docker/{INNER}", INNER), (CID, INNER), id="dind"),
        pytest.param(
            cg(f"/system.slice/docker-{CID}.scope/docker/{INNER}", INNER),
            (CID, INNER),
            id="dind-systemd-outer",
        ),
        pytest.param(cg("/", INNER), (INNER,), id="path-names-nothing-keeps-the-id"),
        pytest.param(cg("/system.slice/ollama.service", None), (), id="host"),
    ],
)
def test_cgroup_containers(ref: CgroupRef, expected: tuple[str, ...]) -> None:
    assert cgroup_containers(ref) == expected


TRAINER_C = DockerContainer(CID, "t")
OUTER_C = DockerContainer(CID, "ci-dind-1", "docker:27-dind", "ci", "dind")
INNER_C = DockerContainer(INNER, "build")


@pytest.mark.parametrize(
    ("chain", "answers", "expected"),
    [
        pytest.param((CID,), {CID: TRAINER_C}, TRAINER_C, id="found"),
        pytest.param((CID,), {CID: None}, None, id="gone"),
        pytest.param((CID,), {}, DockerContainer.from_id(CID), id="not-asked-short-id"),
        pytest.param(
            (CID,), {CID: DockerContainer.from_id(CID)}, DockerContainer.from_id(CID), id="no-api"
        ),
        pytest.param((CID, INNER), {CID: OUTER_C, INNER: None}, OUTER_C, id="dind-outer-known"),
        pytest.param((CID, INNER), {CID: OUTER_C, INNER: INNER_C}, INNER_C, id="innermost-known"),
        pytest.param(
            (CID, INNER),
            {CID: OUTER_C, INNER: DockerContainer.from_id(INNER)},
            OUTER_C,
            id="resolved-beats-short-id",
        ),
        pytest.param(
            (CID, INNER),
            {CID: DockerContainer.from_id(CID), INNER: DockerContainer.from_id(INNER)},
            DockerContainer.from_id(INNER),
            id="api-down-innermost-short-id",
        ),
        pytest.param(
            (CID, INNER),
            {CID: None, INNER: DockerContainer.from_id(INNER)},
            DockerContainer.from_id(INNER),
            id="outer-gone-inner-unknown",
        ),
        pytest.param((CID, INNER), {CID: None, INNER: None}, None, id="all-gone"),
        pytest.param((), {}, None, id="empty-chain"),
    ],
)
def test_choose_docker(
    chain: tuple[str, ...],
    answers: dict[str, DockerContainer | None],
    expected: DockerContainer | None,
) -> None:
    assert choose_docker(chain, answers) == expected


@given(
    chain=st.lists(st.sampled_from([CID, CID2, INNER, ROOTLESS]), unique=True, max_size=4),
    states=st.lists(st.sampled_from(["found", "gone", "short", "missing"]), min_size=4),
)
def test_choose_docker_names_only_a_container_of_the_chain(
    chain: list[str], states: list[str]
) -> None:
    answers: dict[str, DockerContainer | None] = {}
    for cid, state in zip(chain, states, strict=False):
        if state == "found":
            answers[cid] = DockerContainer(cid, f"name-{cid[:4]}")
        elif state == "gone":
            answers[cid] = None
        elif state == "short":
            answers[cid] = DockerContainer.from_id(cid)
    got = choose_docker(chain, answers)
    if got is None:
        assert all(cid in answers and answers[cid] is None for cid in chain)
    else:
        assert got.id in chain
        # Never a short ID while some container of the chain has a real answer.
        assert got.resolved or not any(c is not None and c.resolved for c in answers.values())


GPU0 = "GPU-0a0a0a0a-0000-4000-8000-000000000000"
POD_UID = "11111111-aaaa-4aaa-8aaa-000000000001"


def proc_info(pid: int, ref: CgroupRef | None, comm: str = "python") -> ProcInfo:
    return ProcInfo(pid, 100, 1.0, comm, ref)


@pytest.mark.parametrize(
    ("info", "docker", "expected"),
    [
        pytest.param(
            proc_info(1, cg(f"/docker/{CID}", CID)),
            {CID: TRAINER_C},
            ("t", "", True),
            id="docker-container",
        ),
        pytest.param(
            proc_info(1, cg(f"/docker/{CID}", CID)),
            {CID: None},
            ("", "container_not_found", False),
            id="gone",
        ),
        pytest.param(
            proc_info(1, cg(f"/docker/{CID}", CID)),
            None,
            ("", "container_not_in_pod", False),
            id="kubernetes-mode",
        ),
        pytest.param(
            proc_info(1, cg(f"/docker/{CID}/docker/{INNER}", INNER)),
            {CID: OUTER_C, INNER: None},
            ("ci-dind-1", "", True),
            id="dind",
        ),
        pytest.param(
            proc_info(1, cg("/system.slice/ollama.service", None)),
            {},
            ("", "host_process", False),
            id="host",
        ),
        pytest.param(
            # A name is not a pass: in a container it is that container's, like any other
            # process (docs/threat-model.md); only the host's counts as the MPS daemon.
            proc_info(1, cg(f"/docker/{CID}", CID), comm="nvidia-cuda-mps"),
            {CID: TRAINER_C},
            ("t", "", True),
            id="mps-name-in-a-container",
        ),
        pytest.param(
            proc_info(1, cg("/system.slice/nvidia-mps.service", None), comm="nvidia-cuda-mps"),
            {},
            ("", "mps_server", False),
            id="mps-daemon-on-the-host",
        ),
        pytest.param(proc_info(1, None), {}, ("", "unknown_cgroup", False), id="unknown-cgroup"),
        pytest.param(ProcError.EXITED, {}, ("", "process_exited", False), id="exited"),
        pytest.param(
            proc_info(1, CgroupRef(POD_UID, CID, Runtime.DOCKER, "/kubepods/x")),
            {CID: TRAINER_C},
            ("", "pod_not_found", False),
            id="pod-cgroup-never-asks-docker",
        ),
    ],
)
def test_attribute_docker(
    info: ProcInfo | ProcError,
    docker: dict[str, DockerContainer | None] | None,
    expected: tuple[str, str, bool],
) -> None:
    snapshot = GpuSnapshot(processes=(GpuProcess(GPU0, 0, None, 1, 1 << 30, 0.5),))
    (a,) = attribute(snapshot, {1: info}, PodIndex(), docker)
    assert (a.container, a.reason, a.attributed) == expected
    assert a.pod is None
    assert (a.docker is not None) == expected[2]


def test_docker_lookup_ids() -> None:
    procs: dict[int, ProcInfo | ProcError] = {
        1: proc_info(1, cg(f"/docker/{CID}", CID)),
        2: proc_info(2, cg(f"/system.slice/docker-{CID}.scope", CID)),  # same container
        3: proc_info(3, cg(f"/docker/{CID2}/docker/{INNER}", INNER)),
        4: proc_info(4, CgroupRef(POD_UID, ROOTLESS, Runtime.CONTAINERD, "/kubepods/x")),
        5: proc_info(5, cg("/system.slice/ollama.service", None)),
        6: proc_info(6, None),
        7: ProcError.UNREADABLE,
    }
    assert docker_lookup_ids(procs) == [CID, CID2, INNER]


def attribution(gpu_index: int, pid: int, who: DockerContainer | None, reason: str = "") -> Any:
    uuid = f"GPU-{gpu_index}"
    process = GpuProcess(uuid, gpu_index, None, pid, (pid % 7 + 1) << 30, 0.1 * (pid % 3))
    name = who.name if who is not None else ""
    return Attribution(process, proc_info(pid, None), None, name, reason, who)


@pytest.mark.parametrize(
    ("attributions", "expected"),
    [
        pytest.param([attribution(0, 1, TRAINER_C)], Owner("", "", "t"), id="one-container"),
        pytest.param(
            [attribution(0, 1, TRAINER_C), attribution(0, 2, TRAINER_C)],
            Owner("", "", "t"),
            id="one-container-two-processes",
        ),
        pytest.param(
            [attribution(0, 1, TRAINER_C), attribution(0, 2, OUTER_C)], SHARED, id="two-containers"
        ),
        pytest.param(
            [attribution(0, 1, TRAINER_C), attribution(0, 2, None, "host_process")],
            SHARED,
            id="container-and-host-process",
        ),
        pytest.param(
            [attribution(0, 1, TRAINER_C), attribution(0, 2, None, "mps_server")],
            Owner("", "", "t"),
            id="mps-daemon-does-not-share",
        ),
    ],
)
def test_plan_devices_docker(attributions: list[Attribution], expected: Owner) -> None:
    assert plan_devices(attributions).owners[("GPU-0", "")] == expected


def test_render_families_docker(promtools: list[str]) -> None:
    odd = DockerContainer(CID2, 'we"ird\\name\n', 'img"\\\n', "p\n", 's"')
    rows = [
        attribution(0, 1, TRAINER_C),
        attribution(0, 2, TRAINER_C),
        attribution(0, 3, odd),
        attribution(1, 4, None, "container_not_found"),
    ]
    text = render_families(rows, {}, RenderOptions(docker=True, process_series=True))
    for promtool in promtools:
        assert_valid_exposition(promtool, text)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    mem = {s.labels["container"]: s for s in fams["gpu_container_memory_used_bytes"].samples}
    assert set(mem) == {"t", odd.name}
    assert mem["t"].value == (1 % 7 + 1 + 2 % 7 + 1) << 30
    assert (mem["t"].labels["namespace"], mem["t"].labels["pod"]) == ("", "")
    info = {s.labels["container_id"]: s.labels for s in fams["gpu_container_info"].samples}
    assert info[CID2]["image"] == odd.image and info[CID2]["compose_project"] == "p\n"
    assert set(info) == {CID, CID2}
    procs = {
        s.labels["pid"]: s.labels["container"]
        for s in fams["gpu_process_memory_used_bytes"].samples
    }
    assert procs == {"1": "t", "2": "t", "3": odd.name, "4": ""}
    (unattr,) = fams["gpu_unattributed_memory_used_bytes"].samples
    assert unattr.labels["reason"] == "container_not_found"
    assert not fams["gpu_pod_info"].samples


def test_render_families_writes_container_info_only_in_docker_mode() -> None:
    assert CONTAINER_INFO not in render_families([], {}, RenderOptions())
    assert f"# TYPE {CONTAINER_INFO} gauge" in render_families([], {}, RenderOptions(docker=True))


def test_self_metrics_count_docker_containers_as_attributed() -> None:
    rows = [attribution(0, 1, TRAINER_C), attribution(0, 2, None, "container_not_found")]
    text = self_metrics([], rows, version="test").render()
    assert 'dcgm_enricher_gpu_processes{state="attributed"} 1' in text
    assert 'dcgm_enricher_gpu_processes{state="unattributed"} 1' in text
