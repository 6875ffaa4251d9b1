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

from enricher.docker import (
    CONTAINER_INFO,
    MAX_VALUE_CHARS,
    DockerContainer,
    DockerSource,
    parse_api_version,
    parse_docker_host,
    parse_error_message,
    parse_inspect,
    parse_inspect_body,
    render_container_info,
    short_id,
)
from tests.conftest import assert_valid_exposition
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


def test_render_container_info(promtool: str) -> None:
    hostile = DockerContainer(CID2, 'nb "1"\\\nx', 'img:"q"', "p\\", "s\n")
    plain = DockerContainer(CID, "trainer", "nvcr.io/nvidia/pytorch:24.08-py3", "lab", "train")
    text = render_container_info([hostile, plain, plain, DockerContainer.from_id(CID2)])
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


def test_render_container_info_escapes(promtool: str) -> None:
    hostile = DockerContainer(CID2, 'nb "1"\\\nx', 'img:"q"', "p\\", "s\n")
    text = render_container_info([hostile])
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


@settings(max_examples=300, deadline=None)
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


@settings(max_examples=300, deadline=None)
@given(obj=_JSON)
def test_parse_inspect_never_raises_anything_but_value_error(obj: Any) -> None:
    with contextlib.suppress(ValueError):
        parse_inspect(obj)


# --------------------------------------------------------------------------- I/O


class Clock:
    """The source's TTL clock; request timeouts stay on the real event loop clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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
    assert source.cached == 1
    clock.now += 119
    await source.lookup([CID])
    assert source.cached == 2
    clock.now += 1
    await source.lookup([CID])
    assert source.cached == 1


async def test_a_404_that_is_not_about_the_container_is_an_error(
    dockerd: DockerAPI, make_source: MakeSource
) -> None:
    dockerd.fail[CID] = 404  # e.g. a proxy on the socket answering "page not found"
    source = make_source()
    assert (await source.lookup([CID]))[CID] == DockerContainer.from_id(CID)
    assert source.errors_total == 1 and not source.up
    assert source.cached == 0  # not remembered as gone


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


async def test_socket_missing_is_cgroup_only_until_it_appears(
    sock_dir: str, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    path = os.path.join(sock_dir, "later.sock")
    source = DockerSource(f"unix://{path}", timeout=2.0, clock=clock)
    try:
        with caplog.at_level(logging.INFO, logger="enricher.docker"):
            got = await source.lookup([CID])
            await source.lookup([CID])
        assert got[CID] == DockerContainer.from_id(CID)
        assert not source.enabled and not source.up and source.errors_total == 0
        assert sum("cgroup-only" in r.getMessage() for r in caplog.records) == 1
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
    assert source.cached == 2


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
