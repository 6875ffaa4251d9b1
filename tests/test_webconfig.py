"""TLS and basic auth from a web config file, against the real app over real TLS.

Certificates come from tests/certs.py (a CA, a server certificate for 127.0.0.1, client
certificates from that CA and from a stranger CA). The server is the enricher's own aiohttp app
with :func:`enricher.webconfig.apply` and :func:`ssl_context`; the clients are aiohttp and, for
one case, the standard library's ``http.client``.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from devkit.ports import free_port
from enricher.app import make_app
from enricher.config import Config
from enricher.pipeline import Scraper
from enricher.webconfig import (
    BasicAuthChecker,
    WebConfig,
    WebConfigError,
    apply,
    auth_middleware,
    load_web_config,
    parse_basic_authorization,
    parse_web_config,
    ssl_context,
)
from tests.scraping import NoProcs

from .certs import Pki, bcrypt_hash, make_pki

# --------------------------------------------------------------------------- certificates


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# --------------------------------------------------------------------------- server


Serve = Callable[[WebConfig], Awaitable[int]]


async def _ok(_request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start the real enricher app (upstream down, no GPU side) with a web config applied."""
    runners: list[web.AppRunner] = []

    async def start(cfg: WebConfig) -> int:
        # Port 9 (discard) refuses: /metrics still answers, with upstream down.
        config = replace(Config(), upstream_url="http://127.0.0.1:9/metrics", upstream_timeout=1)
        app = make_app(Scraper(config, nvml=None, procfs=NoProcs(), kubernetes=None))
        apply(app, cfg)
        runner = web.AppRunner(app, access_log=None, max_line_size=8190, max_field_size=8190)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context(cfg))
        await site.start()
        runners.append(runner)
        return int(runner.addresses[0][1])

    yield start
    for r in runners:
        await r.cleanup()


def _client_ctx(
    pki: Pki, cert: tuple[Path, Path] | None = None, max_version: ssl.TLSVersion | None = None
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def _get(
    url: str, ctx: ssl.SSLContext | bool = False, auth: dict[str, str] | None = None, **kw: Any
) -> tuple[int, dict[str, str], str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, ssl=ctx, headers=auth, **kw) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.text()


def _tls_config(pki: Pki, **extra: str) -> WebConfig:
    lines = [f"  cert_file: {pki.server_cert}", f"  key_file: {pki.server_key}"]
    lines += [f"  {k}: {v}" for k, v in extra.items()]
    return parse_web_config("tls_server_config:\n" + "\n".join(lines) + "\n")


# --------------------------------------------------------------------------- TLS


async def test_plain_http_is_the_default(serve: Serve) -> None:
    cfg = parse_web_config("")
    assert cfg == WebConfig() and ssl_context(cfg) is None
    port = await serve(cfg)
    status, _, body = await _get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and "dcgm_enricher_build_info" in body


async def test_tls_with_a_real_client(serve: Serve, pki: Pki) -> None:
    port = await serve(_tls_config(pki))
    status, _, body = await _get(f"https://127.0.0.1:{port}/metrics", _client_ctx(pki))
    assert status == 200
    assert 'dcgm_enricher_source_up{source="upstream"} 0' in body
    # A client that does not trust our CA refuses the server.
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await _get(f"https://127.0.0.1:{port}/metrics", ssl.create_default_context())
    # Plain HTTP to the TLS port gets no answer.
    with pytest.raises(aiohttp.ClientError):
        await _get(f"http://127.0.0.1:{port}/metrics")


async def test_min_version_tls13_refuses_tls12(serve: Serve, pki: Pki) -> None:
    port = await serve(_tls_config(pki, min_version="TLS13"))
    url = f"https://127.0.0.1:{port}/healthz"
    with pytest.raises(aiohttp.ClientError):
        await _get(url, _client_ctx(pki, max_version=ssl.TLSVersion.TLSv1_2))
    assert (await _get(url, _client_ctx(pki)))[0] == 200


async def test_max_version_tls12(serve: Serve, pki: Pki) -> None:
    port = await serve(_tls_config(pki, max_version="TLS12"))
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=_client_ctx(pki))
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        assert ssl_object.version() == "TLSv1.2"
    finally:
        writer.close()
        await writer.wait_closed()


async def test_client_certificates_required(serve: Serve, pki: Pki) -> None:
    cfg = _tls_config(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca)
    )
    port = await serve(cfg)
    url = f"https://127.0.0.1:{port}/metrics"
    good = _client_ctx(pki, (pki.client_cert, pki.client_key))
    assert (await _get(url, good))[0] == 200
    for ctx in (_client_ctx(pki), _client_ctx(pki, (pki.stranger_cert, pki.stranger_key))):
        with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
            await _get(url, ctx)


async def test_client_certificate_if_given(serve: Serve, pki: Pki) -> None:
    cfg = _tls_config(pki, client_auth_type="VerifyClientCertIfGiven", client_ca_file=str(pki.ca))
    port = await serve(cfg)
    url = f"https://127.0.0.1:{port}/metrics"
    assert (await _get(url, _client_ctx(pki)))[0] == 200
    assert (await _get(url, _client_ctx(pki, (pki.client_cert, pki.client_key))))[0] == 200
    with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
        await _get(url, _client_ctx(pki, (pki.stranger_cert, pki.stranger_key)))


# --------------------------------------------------------------------------- basic auth


async def test_basic_auth_over_tls(serve: Serve, pki: Pki, tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text(
        "tls_server_config:\n"
        f"  cert_file: {pki.server_cert}\n"
        f"  key_file: {pki.server_key}\n"
        "basic_auth_users:\n"
        f"  prometheus: '{bcrypt_hash(b'scrape-me')}'\n"
    )
    port = await serve(load_web_config(path))
    url = f"https://127.0.0.1:{port}"
    ctx = _client_ctx(pki)
    for auth in (None, _basic("prometheus", "wrong"), _basic("x", "y")):
        status, headers, body = await _get(f"{url}/metrics", ctx, auth)
        assert status == 401
        assert headers["WWW-Authenticate"].startswith("Basic ")
        assert "dcgm_enricher" not in body
    assert (await _get(f"{url}/", ctx))[0] == 401  # the landing page names pods: protected too
    assert (await _get(f"{url}/healthz", ctx))[0] == 200  # probes need no secret
    status, _, body = await _get(f"{url}/metrics", ctx, _basic("prometheus", "scrape-me"))
    assert status == 200 and "dcgm_enricher_build_info" in body

    def stdlib_client() -> int:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
        token = base64.b64encode(b"prometheus:scrape-me").decode()
        conn.request("GET", "/metrics", headers={"Authorization": f"Basic {token}"})
        status = conn.getresponse().status
        conn.close()
        return status

    assert await asyncio.to_thread(stdlib_client) == 200


@pytest.mark.parametrize("prefix", ["2a", "2b", "2y"])
async def test_bcrypt_hash_formats(serve: Serve, prefix: str) -> None:
    hashed = bcrypt_hash("pässwörd".encode(), prefix)
    assert hashed.startswith(f"${prefix}$")
    port = await serve(parse_web_config(f"basic_auth_users:\n  alice: '{hashed}'\n"))
    url = f"http://127.0.0.1:{port}/metrics"
    good = _basic("alice", "pässwörd")
    assert (await _get(url, auth=good))[0] == 200
    bad = _basic("alice", "passwort")
    assert (await _get(url, auth=bad))[0] == 401


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("", id="empty"),
        pytest.param("Basic", id="no-credentials"),
        pytest.param("Bearer abc", id="other-scheme"),
        pytest.param("Basic !!!!", id="not-base64"),
        pytest.param("Basic " + base64.b64encode(b"alice").decode(), id="no-colon"),
        pytest.param("Basic " + base64.b64encode(b":secret").decode(), id="empty-user"),
        pytest.param("Basic " + base64.b64encode(b"alice:" + b"s" * 100).decode(), id="over-72"),
        pytest.param("Basic " + base64.b64encode(b"alice:secret\0").decode(), id="nul"),
        pytest.param("Basic " + "A" * 8000, id="huge"),
    ],
)
async def test_malformed_authorization_is_401(serve: Serve, header: str) -> None:
    port = await serve(
        parse_web_config(f"basic_auth_users:\n  alice: '{bcrypt_hash(b'secret')}'\n")
    )
    status, headers, _ = await _get(
        f"http://127.0.0.1:{port}/metrics", auth={"Authorization": header}
    )
    assert status == 401 and "WWW-Authenticate" in headers


@pytest.mark.parametrize(
    ("header", "want"),
    [
        pytest.param("Basic YTpi", (b"a", b"b"), id="plain"),
        pytest.param("basic   YTpi  ", (b"a", b"b"), id="case-and-spaces"),
        pytest.param("Basic " + base64.b64encode(b"u:p:q").decode(), (b"u", b"p:q"), id="colon"),
        pytest.param("Basic " + base64.b64encode(b"u:").decode(), (b"u", b""), id="empty-pw"),
        pytest.param("Basic YTp", None, id="truncated"),
        pytest.param("Basic YWI=", None, id="no-colon"),
        pytest.param("Digest YTpi", None, id="digest"),
        pytest.param("Basic ✓", None, id="non-ascii"),
    ],
)
def test_parse_basic_authorization(header: str, want: tuple[bytes, bytes] | None) -> None:
    assert parse_basic_authorization(header) == want


async def test_successes_are_cached_failures_never() -> None:
    checker = BasicAuthChecker({"alice": bcrypt_hash(b"secret"), "bob": bcrypt_hash(b"other")})
    assert await checker.check(b"alice", b"secret")
    assert await checker.check(b"alice", b"secret")
    assert checker.bcrypt_checks == 1  # the second scrape did not pay bcrypt
    assert not await checker.check(b"alice", b"wrong")
    assert not await checker.check(b"alice", b"wrong")
    assert checker.bcrypt_checks == 3  # a failure is checked again every time
    # A good password is good for its own user only.
    assert not await checker.check(b"bob", b"secret")
    assert not await checker.check(b"carol", b"secret")  # unknown user: bcrypt still runs
    assert checker.bcrypt_checks == 5
    assert await checker.check(b"alice", b"secret")
    assert checker.bcrypt_checks == 5


async def test_concurrent_checks_share_one_bcrypt() -> None:
    checker = BasicAuthChecker({"alice": bcrypt_hash(b"secret")})
    results = await asyncio.gather(*(checker.check(b"alice", b"secret") for _ in range(20)))
    assert all(results)
    assert checker.bcrypt_checks == 1


async def test_no_users_means_no_auth(serve: Serve) -> None:
    app = web.Application()
    apply(app, parse_web_config("basic_auth_users: {}\n"))
    assert len(app.middlewares) == 0
    # The middleware itself, given no users, lets everything through too.
    app.middlewares.append(auth_middleware(WebConfig()))
    app.router.add_get("/metrics", _ok)
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/metrics")).status == 200
    port = await serve(parse_web_config("basic_auth_users:\n"))
    assert (await _get(f"http://127.0.0.1:{port}/metrics"))[0] == 200


# --------------------------------------------------------------------------- invalid configs


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("- a\n- b\n", "must hold a mapping", id="a-list"),
        pytest.param("tls_server_config: [\n", "not valid YAML", id="yaml-syntax"),
        pytest.param("tls_server_config: x\n", "must be a mapping", id="tls-not-mapping"),
        pytest.param("colour: blue\n", "unknown field 'colour'", id="unknown-top-level"),
        pytest.param("rate_limit: {burst: 1}\n", "rate_limit is not supported", id="rate-limit"),
        pytest.param(
            "tls_server_config: {cert_file: a, key_file: b, cipher_suites: [X]}\n",
            "cipher_suites is not supported",
            id="cipher-suites",
        ),
        pytest.param(
            "tls_server_config: {cert: PEM, key: PEM}\n", "cert is not supported", id="inline-cert"
        ),
        pytest.param(
            "tls_server_config: {cert_file: a, key_file: b, colour: x}\n",
            "unknown field 'colour'",
            id="unknown-tls-field",
        ),
        pytest.param("tls_server_config: {cert_file: a}\n", "key_file required", id="no-key"),
        pytest.param(
            "tls_server_config: {client_auth_type: RequireAndVerifyClientCert}\n",
            "cert_file and key_file required",
            id="no-cert-no-key",
        ),
        pytest.param(
            "tls_server_config: {cert_file: 1, key_file: b}\n", "must be a string", id="int-path"
        ),
        pytest.param(
            "tls_server_config: {cert_file: a, key_file: b, client_auth_type: Maybe}\n",
            "'Maybe' is not one of",
            id="bad-client-auth",
        ),
        pytest.param(
            "tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequireAnyClientCert,"
            " client_ca_file: c}\n",
            "without verifying it",
            id="unverified-client-auth",
        ),
        pytest.param(
            "tls_server_config: {cert_file: a, key_file: b, client_ca_file: c}\n",
            "client_ca_file is set but client_auth_type is NoClientCert",
            id="ca-without-policy",
        ),
        pytest.param(
            "tls_server_config: {cert_file: a, key_file: b,"
            " client_auth_type: RequireAndVerifyClientCert}\n",
            "needs client_ca_file",
            id="policy-without-ca",
        ),
        pytest.param(
            "tls_server_config: {cert_file: a, key_file: b, min_version: TLS10}\n",
            "TLS12 is the oldest",
            id="tls10",
        ),
        pytest.param(
            "tls_server_config: {cert_file: a, key_file: b, max_version: TLS14}\n",
            "'TLS14' is not one of",
            id="tls14",
        ),
        pytest.param(
            "tls_server_config: {cert_file: a, key_file: b, min_version: TLS13,"
            " max_version: TLS12}\n",
            "min_version is above max_version",
            id="min-above-max",
        ),
        pytest.param(
            "http_server_config: {headers: {X-Frame-Options: deny}}\n",
            "headers is not supported",
            id="http-headers",
        ),
        pytest.param(
            "http_server_config: {http2: maybe}\n", "http2 must be true or false", id="http2-str"
        ),
        pytest.param(
            "basic_auth_users:\n  alice: hunter2\n", "is not a bcrypt hash", id="plaintext"
        ),
        pytest.param(
            "basic_auth_users:\n  alice: '$2b$03$" + "a" * 53 + "'\n",
            "is not a bcrypt hash",
            id="cost-too-low",
        ),
        pytest.param(
            "basic_auth_users:\n  alice: '$2x$10$" + "a" * 53 + "'\n",
            "is not a bcrypt hash",
            id="2x-prefix",
        ),
        pytest.param(
            "basic_auth_users:\n  123: '$2b$10$" + "a" * 53 + "'\n",
            "is not a string (quote it)",
            id="numeric-user",
        ),
        pytest.param(
            "basic_auth_users:\n  'a:b': '$2b$10$" + "a" * 53 + "'\n",
            "without ':'",
            id="colon-in-user",
        ),
        pytest.param(
            "basic_auth_users:\n  alice: '$2b$10$"
            + "a" * 53
            + "'\n  alice: '$2b$10$"
            + "b" * 53
            + "'\n",
            "duplicate key 'alice'",
            id="duplicate-user",
        ),
        pytest.param("basic_auth_users: [alice]\n", "must be a mapping", id="users-list"),
    ],
)
def test_invalid_config(text: str, message: str) -> None:
    with pytest.raises(WebConfigError) as info:
        parse_web_config(text)
    assert message in str(info.value)
    assert "hunter2" not in str(info.value)  # a plain password is never echoed


def test_empty_tls_section_is_plain_http() -> None:
    """As exporter-toolkit: an empty tls_server_config serves plain HTTP."""
    cfg = parse_web_config("tls_server_config: {}\nhttp_server_config: {http2: false}\n")
    assert cfg.tls is None and ssl_context(cfg) is None


def test_relative_paths_are_relative_to_the_file(tmp_path: Path, pki: Pki) -> None:
    (tmp_path / "tls").mkdir()
    for src in (pki.server_cert, pki.server_key, pki.ca):
        (tmp_path / "tls" / src.name).write_bytes(src.read_bytes())
    path = tmp_path / "web.yml"
    path.write_text(
        "tls_server_config:\n"
        f"  cert_file: tls/{pki.server_cert.name}\n"
        f"  key_file: tls/{pki.server_key.name}\n"
        f"  client_ca_file: tls/{pki.ca.name}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
    )
    cfg = load_web_config(path)
    assert cfg.tls is not None
    assert cfg.tls.cert_file == str(tmp_path / "tls" / pki.server_cert.name)
    ctx = ssl_context(cfg)
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yml"
    with pytest.raises(WebConfigError, match=r"missing\.yml: cannot read"):
        load_web_config(missing)
    big = tmp_path / "big.yml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(WebConfigError, match="larger than"):
        load_web_config(big)
    binary = tmp_path / "binary.yml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(WebConfigError, match="not UTF-8"):
        load_web_config(binary)
    bad = tmp_path / "bad.yml"
    bad.write_text("basic_auth_users:\n  alice: hunter2\n")
    with pytest.raises(WebConfigError, match=r"bad\.yml: basic_auth_users"):
        load_web_config(bad)


@pytest.mark.parametrize(
    ("which", "message"),
    [
        pytest.param("missing-cert", "cannot load cert_file", id="missing-cert"),
        pytest.param("wrong-key", "cannot load cert_file", id="key-does-not-match"),
        pytest.param("garbage-cert", "cannot load cert_file", id="garbage-cert"),
        pytest.param("garbage-ca", "cannot load client_ca_file", id="garbage-ca"),
        pytest.param("missing-ca", "cannot load client_ca_file", id="missing-ca"),
    ],
)
def test_bad_certificate_files(tmp_path: Path, pki: Pki, which: str, message: str) -> None:
    cert, key, ca = pki.server_cert, pki.server_key, pki.ca
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    if which == "missing-cert":
        cert = tmp_path / "nope.crt"
    elif which == "wrong-key":
        key = pki.client_key
    elif which == "garbage-cert":
        cert = garbage
    elif which == "garbage-ca":
        ca = garbage
    else:
        ca = tmp_path / "nope-ca.crt"
    cfg = parse_web_config(
        "tls_server_config:\n"
        f"  cert_file: {cert}\n  key_file: {key}\n  client_ca_file: {ca}\n"
        "  client_auth_type: VerifyClientCertIfGiven\n"
    )
    with pytest.raises(WebConfigError, match=message):
        ssl_context(cfg)


def test_ca_file_without_certificates(tmp_path: Path, pki: Pki) -> None:
    empty = tmp_path / "empty-ca.pem"
    empty.write_text("# no certificates here\n")
    cfg = _tls_config(pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(empty))
    with pytest.raises(WebConfigError, match="client_ca_file"):
        ssl_context(cfg)


# --------------------------------------------------------------------------- the command line


def test_serve_with_web_config_file(pki: Pki, tmp_path: Path) -> None:
    """`dcgm-enricher serve --web.config.file` as users run it: TLS and basic auth on /metrics,
    /healthz open for probes, and a broken file refused at start with exit 2."""
    import os
    import ssl
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    root = Path(__file__).resolve().parent.parent
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        "tls_server_config:\n"
        f"  cert_file: {pki.server_cert}\n"
        f"  key_file: {pki.server_key}\n"
        "basic_auth_users:\n"
        f"  prometheus: {bcrypt_hash(b'scrape-secret')}\n"
    )
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("NODE_NAME", None)
    args = [
        sys.executable,
        "-m",
        "enricher",
        "serve",
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--upstream.url",
        "http://127.0.0.1:9/metrics",
        "--no-nvml.enabled",
        "--kubelet.pod-resources-socket=",
        "--docker.host=",
    ]
    bad = tmp_path / "bad.yml"
    bad.write_text("basic_auth_users:\n  u: not-a-bcrypt-hash\n")
    res = subprocess.run(
        [*args, "--web.config.file", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=root,
        check=False,
    )
    assert res.returncode == 2
    assert "bad.yml" in res.stderr

    proc = subprocess.Popen(
        [*args, "--web.config.file", str(cfg)],
        env=env,
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    base = f"https://localhost:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", context=ctx, timeout=5) as r:
                    assert r.read() == b"ok\n"
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "serve did not come up"
                time.sleep(0.2)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{base}/metrics", context=ctx, timeout=5)
        assert info.value.code == 401
        request = urllib.request.Request(
            f"{base}/metrics", headers=_basic("prometheus", "scrape-secret")
        )
        with urllib.request.urlopen(request, context=ctx, timeout=10) as r:
            # The served series carry the node label too (the host's name here).
            up = rb'\ndcgm_enricher_source_up\{[^}]*source="upstream"[^}]*\} 0(\.0)?\n'
            assert re.search(up, r.read())
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP, TLS port
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        proc.terminate()
        proc.communicate(timeout=15)
