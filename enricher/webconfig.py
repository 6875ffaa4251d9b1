"""TLS and basic auth for the HTTP server, from an exporter-toolkit style web config file.

The file has the format Prometheus exporters share (``--web.config.file``): a YAML mapping
with ``tls_server_config`` and ``basic_auth_users``. This module reads the subset that
dcgm-enricher can honour and rejects everything else with an error that names the field, so a
setting that would be silently ignored (and leave the server less protected than its operator
believes) never starts:

* ``tls_server_config``: ``cert_file``, ``key_file`` (both required once the section is
  present), ``client_ca_file``, ``client_auth_type`` (``NoClientCert``,
  ``VerifyClientCertIfGiven``, ``RequireAndVerifyClientCert``), ``min_version`` and
  ``max_version`` (``TLS12``, ``TLS13``). Relative paths are relative to the file's directory.
* ``basic_auth_users``: user name -> bcrypt hash (``$2a$``, ``$2b$`` or ``$2y$``).
* ``http_server_config``: only ``http2`` is accepted, and ignored (the server speaks HTTP/1.1).

:func:`parse_web_config` is pure; :func:`load_web_config` reads the file; :func:`ssl_context`
loads the certificates; :func:`auth_middleware` checks credentials on every request except the
open paths (``/healthz`` by default, so that kubelet probes need no secret).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import ssl
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import bcrypt
import yaml
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

__all__ = [
    "BasicAuthChecker",
    "TlsServerConfig",
    "WebConfig",
    "WebConfigError",
    "apply",
    "auth_middleware",
    "load_web_config",
    "parse_web_config",
    "ssl_context",
]

MAX_FILE_BYTES = 1 << 20  # a web config is a few hundred bytes; more is a mistake
MAX_USERS = 1024
MAX_CREDENTIALS_BYTES = 4096  # decoded "user:password"; the header itself is bounded by aiohttp
BCRYPT_MAX_PASSWORD_BYTES = 72  # bcrypt ignores (Go's bcrypt refuses) anything longer
CACHE_SIZE = 256  # verified credentials kept; a handful of scrapers need a handful
BCRYPT_CONCURRENCY = 2  # bcrypt checks at once; the rest queue, cached scrapes skip the queue
DEFAULT_OPEN_PATHS = ("/healthz",)
REALM = "dcgm-enricher"

# exporter-toolkit accepts all of these; the ones below the line are refused here.
CLIENT_AUTH_TYPES: Mapping[str, ssl.VerifyMode] = MappingProxyType(
    {
        "NoClientCert": ssl.CERT_NONE,
        "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
        "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    }
)
_UNSUPPORTED_CLIENT_AUTH = {
    "RequestClientCert": "asks for a certificate without verifying it",
    "RequireAnyClientCert": "requires a certificate without verifying it",
    "RequireClientCert": "requires a certificate without verifying it",
}
TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = MappingProxyType(
    {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
)
_OLD_TLS = ("TLS10", "TLS11")

_TOP_LEVEL = ("tls_server_config", "basic_auth_users", "http_server_config")
_TOP_LEVEL_UNSUPPORTED = {"rate_limit": "put a rate limit in front of the enricher instead"}
_TLS_FIELDS = (
    "cert_file",
    "key_file",
    "client_ca_file",
    "client_auth_type",
    "min_version",
    "max_version",
)
_TLS_UNSUPPORTED = {
    "cert": "give the certificate as cert_file",
    "key": "give the key as key_file",
    "client_ca": "give the CA as client_ca_file",
    "cipher_suites": "Go cipher suite names have no exact OpenSSL equivalent",
    "curve_preferences": "not supported",
    "prefer_server_cipher_suites": "not supported",
    "client_allowed_sans": "not supported",
}
_HTTP_FIELDS = ("http2",)
_HTTP_UNSUPPORTED = {"headers": "not supported"}
# $2a$/$2b$/$2y$, a two-digit cost, 22 characters of salt and 31 of hash (bcrypt's base64).
_BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
_HTPASSWD_HINT = "make one with: htpasswd -nBC 10 '' | tr -d ':\\n'"


class WebConfigError(ValueError):
    """The web config file cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class TlsServerConfig:
    """Validated ``tls_server_config``; paths are absolute or as given when the file had none."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str = "TLS13"


@dataclass(frozen=True, slots=True)
class WebConfig:
    """The whole web config. ``tls`` None: plain HTTP; no users: no authentication."""

    tls: TlsServerConfig | None = None
    basic_auth_users: Mapping[str, str] = field(default_factory=dict)  # user -> bcrypt hash
    source: str = ""  # the file it came from, for messages

    @property
    def auth_enabled(self) -> bool:
        return bool(self.basic_auth_users)


# --------------------------------------------------------------------------- parsing


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key; the plain constructor reports it
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _mapping_without_duplicates,
)


def _check_fields(
    where: str,
    section: Mapping[Any, Any],
    known: Collection[str],
    unsupported: Mapping[str, str],
) -> None:
    for key in section:
        if not isinstance(key, str):
            raise WebConfigError(f"{where}: key {key!r} is not a string")
        if key in unsupported:
            raise WebConfigError(
                f"{where}.{key} is not supported by dcgm-enricher ({unsupported[key]})"
            )
        if key not in known:
            raise WebConfigError(f"{where}: unknown field {key!r}")


def _section(doc: Mapping[str, Any], name: str) -> Mapping[Any, Any] | None:
    value = doc.get(name)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise WebConfigError(f"{name} must be a mapping, not {type(value).__name__}")
    return value


def _string(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise WebConfigError(f"{where} must be a string, not {type(value).__name__}")
    return value


def _path(where: str, value: Any, base_dir: str) -> str:
    text = _string(where, value)
    if not text or "\0" in text:
        raise WebConfigError(f"{where} must be a file name")
    return os.path.join(base_dir, text) if base_dir else text


def _parse_tls(section: Mapping[Any, Any], base_dir: str) -> TlsServerConfig | None:
    where = "tls_server_config"
    _check_fields(where, section, _TLS_FIELDS, _TLS_UNSUPPORTED)
    if not section:
        return None  # as exporter-toolkit: an empty section means no TLS
    missing = [name for name in ("cert_file", "key_file") if not section.get(name)]
    if missing:
        raise WebConfigError(f"{where}: {' and '.join(missing)} required to serve TLS")
    cert = _path(f"{where}.cert_file", section["cert_file"], base_dir)
    key = _path(f"{where}.key_file", section["key_file"], base_dir)
    ca = section.get("client_ca_file")
    ca_path = _path(f"{where}.client_ca_file", ca, base_dir) if ca else None

    auth = _string(f"{where}.client_auth_type", section.get("client_auth_type") or "NoClientCert")
    if auth in _UNSUPPORTED_CLIENT_AUTH:
        raise WebConfigError(
            f"{where}.client_auth_type {auth} is not supported ({_UNSUPPORTED_CLIENT_AUTH[auth]});"
            " use RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file"
        )
    if auth not in CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"{where}.client_auth_type {auth!r} is not one of {', '.join(CLIENT_AUTH_TYPES)}"
        )
    if ca_path is not None and auth == "NoClientCert":
        raise WebConfigError(
            f"{where}: client_ca_file is set but client_auth_type is NoClientCert; "
            "set client_auth_type: RequireAndVerifyClientCert"
        )
    if ca_path is None and auth != "NoClientCert":
        raise WebConfigError(f"{where}: client_auth_type {auth} needs client_ca_file")

    versions: dict[str, str] = {}
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = _string(f"{where}.{name}", section.get(name) or default)
        if value in _OLD_TLS:
            raise WebConfigError(f"{where}.{name} {value} is not supported: TLS12 is the oldest")
        if value not in TLS_VERSIONS:
            raise WebConfigError(
                f"{where}.{name} {value!r} is not one of {', '.join(TLS_VERSIONS)}"
            )
        versions[name] = value
    if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
        raise WebConfigError(f"{where}: min_version is above max_version")
    return TlsServerConfig(
        cert, key, ca_path, auth, versions["min_version"], versions["max_version"]
    )


def _parse_users(section: Mapping[Any, Any]) -> dict[str, str]:
    where = "basic_auth_users"
    if len(section) > MAX_USERS:
        raise WebConfigError(f"{where}: more than {MAX_USERS} users")
    users: dict[str, str] = {}
    for user, hashed in section.items():
        if not isinstance(user, str):
            raise WebConfigError(f"{where}: user name {user!r} is not a string (quote it)")
        if not user or ":" in user or not user.isprintable():
            raise WebConfigError(
                f"{where}: user name {user!r} must be printable, non-empty and without ':'"
            )
        # The value is a secret (or, by mistake, a plain password): never echo it.
        if not isinstance(hashed, str) or not _BCRYPT_HASH.fullmatch(hashed):
            raise WebConfigError(
                f"{where}: the password of user {user!r} is not a bcrypt hash "
                f"($2a$, $2b$ or $2y$ with a cost of 4 to 31); {_HTPASSWD_HINT}"
            )
        users[user] = hashed
    return users


def parse_web_config(text: str, base_dir: str = "") -> WebConfig:
    """Parse and validate web config YAML. Pure; relative paths are joined to ``base_dir``.

    Raises WebConfigError for invalid YAML, unknown or unsupported fields, wrong types, an
    incomplete TLS section, a client CA without a verifying client_auth_type (or the reverse),
    TLS older than 1.2 and passwords that are not bcrypt hashes.
    """
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no objects
    except yaml.YAMLError as exc:
        raise WebConfigError(f"not valid YAML: {exc}") from None
    if doc is None:
        return WebConfig()
    if not isinstance(doc, Mapping):
        raise WebConfigError(f"the file must hold a mapping, not {type(doc).__name__}")
    _check_fields("web config", doc, _TOP_LEVEL, _TOP_LEVEL_UNSUPPORTED)

    tls_section = _section(doc, "tls_server_config")
    tls = _parse_tls(tls_section, base_dir) if tls_section is not None else None

    http_section = _section(doc, "http_server_config")
    if http_section is not None:
        _check_fields("http_server_config", http_section, _HTTP_FIELDS, _HTTP_UNSUPPORTED)
        http2 = http_section.get("http2")
        if http2 is not None and not isinstance(http2, bool):
            raise WebConfigError("http_server_config.http2 must be true or false")

    users_section = _section(doc, "basic_auth_users")
    users = _parse_users(users_section) if users_section is not None else {}
    return WebConfig(tls=tls, basic_auth_users=MappingProxyType(users))


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read and validate the web config file at ``path`` (at most 1 MiB).

    Certificates are not read here; :func:`ssl_context` loads them. Raises WebConfigError.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise WebConfigError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise WebConfigError(f"{name}: larger than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise WebConfigError(f"{name}: not UTF-8") from None
    try:
        cfg = parse_web_config(text, os.path.dirname(os.path.abspath(name)))
    except WebConfigError as exc:
        raise WebConfigError(f"{name}: {exc}") from None
    return WebConfig(tls=cfg.tls, basic_auth_users=cfg.basic_auth_users, source=name)


# --------------------------------------------------------------------------- TLS


def ssl_context(cfg: WebConfig) -> ssl.SSLContext | None:
    """A server SSLContext for ``cfg.tls``, or None for plain HTTP.

    Loads the certificate, key and client CA now, so a bad file fails at start with a
    WebConfigError that names it. Certificates are read once: restart to rotate them.
    """
    tls = cfg.tls
    if tls is None:
        return None
    where = f"{cfg.source}: tls_server_config" if cfg.source else "tls_server_config"
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except OSError as exc:  # ssl.SSLError is an OSError too
        detail = exc.strerror or getattr(exc, "reason", None) or str(exc)
        raise WebConfigError(
            f"{where}: cannot load cert_file {tls.cert_file} with key_file {tls.key_file}: {detail}"
        ) from None
    if tls.client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        except OSError as exc:
            detail = exc.strerror or getattr(exc, "reason", None) or str(exc)
            raise WebConfigError(
                f"{where}: cannot load client_ca_file {tls.client_ca_file}: {detail}"
            ) from None
        if not ctx.get_ca_certs():
            raise WebConfigError(
                f"{where}: client_ca_file {tls.client_ca_file} holds no CA certificate"
            )
    ctx.verify_mode = CLIENT_AUTH_TYPES[tls.client_auth_type]
    return ctx


# --------------------------------------------------------------------------- basic auth


def parse_basic_authorization(header: str) -> tuple[bytes, bytes] | None:
    """``(user, password)`` bytes from an ``Authorization: Basic ...`` value; None if malformed.

    Pure. The scheme is case-insensitive; the credentials must be strict base64 of
    ``user:password`` (the password may hold colons).
    """
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    token = token.strip()
    if not token or len(token) > MAX_CREDENTIALS_BYTES * 4 // 3 + 4:
        return None
    try:
        raw = base64.b64decode(token.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    return user, password


class BasicAuthChecker:
    """Checks credentials against bcrypt hashes, remembering the ones that matched.

    Only successes are cached, keyed by an HMAC (with a per-process random key) of user, hash
    and password, so neither the cache nor its timing tells anything about a password. A failed
    check is never cached: every wrong password pays bcrypt again, in a worker thread, at most
    ``BCRYPT_CONCURRENCY`` at a time, so a flood of wrong guesses cannot block the event loop
    and scrapers whose credentials are cached do not wait behind it. Concurrent checks of the
    same credentials share one bcrypt run.
    """

    def __init__(self, users: Mapping[str, str], cache_size: int = CACHE_SIZE) -> None:
        self._users = [
            (hashlib.sha256(u.encode("utf-8")).digest(), h.encode("ascii"))
            for u, h in users.items()
        ]
        self._key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, None] = OrderedDict()
        self._cache_size = cache_size
        self._inflight: dict[bytes, asyncio.Future[bool]] = {}
        self._semaphore: asyncio.Semaphore | None = None
        self.bcrypt_checks = 0  # how many times bcrypt actually ran (tests, debugging)

    def _find_hash(self, user: bytes) -> bytes | None:
        digest = hashlib.sha256(user).digest()
        found: bytes | None = None
        for candidate, hashed in self._users:  # every entry, in constant time each
            if hmac.compare_digest(candidate, digest):
                found = hashed
        return found

    async def check(self, user: bytes, password: bytes) -> bool:
        """True when ``user`` exists and ``password`` matches its hash."""
        hashed = self._find_hash(user)
        known = hashed is not None
        if hashed is None:
            if not self._users:
                return False
            # Run bcrypt all the same, so an unknown user takes as long as a wrong password.
            hashed = self._users[0][1]
        if len(password) > BCRYPT_MAX_PASSWORD_BYTES:
            return False
        key = hmac.new(self._key, user + b"\0" + hashed + b"\0" + password, "sha256").digest()
        if known and key in self._cache:
            self._cache.move_to_end(key)
            return True
        pending = self._inflight.get(key)
        if pending is not None:
            return known and await asyncio.shield(pending)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            ok = await self._bcrypt(password, hashed)
            fut.set_result(ok)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: joiners re-raise it themselves
            raise
        finally:
            del self._inflight[key]
        if ok and known:
            self._cache[key] = None
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return ok and known

    async def _bcrypt(self, password: bytes, hashed: bytes) -> bool:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(BCRYPT_CONCURRENCY)
        async with self._semaphore:
            self.bcrypt_checks += 1
            loop = asyncio.get_running_loop()
            try:
                return await loop.run_in_executor(None, bcrypt.checkpw, password, hashed)
            except ValueError:  # a hash bcrypt refuses after all: no one gets in with it
                return False


def _unauthorized() -> web.Response:
    return web.Response(
        status=401,
        text="401 Unauthorized\n",
        headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
    )


def auth_middleware(cfg: WebConfig, open_paths: Collection[str] = DEFAULT_OPEN_PATHS) -> Middleware:
    """An aiohttp middleware that requires basic auth on every path but ``open_paths``.

    With no users configured it lets everything through. Missing, malformed or wrong
    credentials get 401 with ``WWW-Authenticate: Basic``. The checker is reachable as the
    middleware's ``checker`` attribute.
    """
    checker = BasicAuthChecker(cfg.basic_auth_users)
    enabled = cfg.auth_enabled
    open_set = frozenset(open_paths)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not enabled or request.path in open_set:
            return await handler(request)
        header = request.headers.get("Authorization")
        creds = parse_basic_authorization(header) if header is not None else None
        if creds is None or not await checker.check(*creds):
            return _unauthorized()
        return await handler(request)

    middleware.checker = checker  # type: ignore[attr-defined]
    return middleware


def apply(
    app: web.Application, cfg: WebConfig, open_paths: Collection[str] = DEFAULT_OPEN_PATHS
) -> None:
    """Add the auth middleware to ``app`` (before it starts) when ``cfg`` has users."""
    if cfg.auth_enabled:
        app.middlewares.append(auth_middleware(cfg, open_paths))
