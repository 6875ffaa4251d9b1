"""Certificates and password hashes for the tests of TLS and basic auth (the web config).

Made here with ``cryptography`` and ``bcrypt``: a CA, a server certificate for the names given
and 127.0.0.1, a client certificate from that CA and one from a stranger CA.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import bcrypt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate from a CA the server does not trust
    stranger_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    names: Sequence[str] = ("localhost",),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_name = issuer[0].subject if issuer else _name(subject)
    signing_key = issuer[1] if issuer else key
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key()),
            critical=False,
        )
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    *(x509.DNSName(n) for n in names),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
    return builder.sign(signing_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Path:
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path.with_suffix(".crt")


def make_pki(d: Path, server_names: Sequence[str] = ("localhost",)) -> Pki:
    """A CA and its server and client certificates, and a client certificate from a stranger
    CA, written under ``d`` as PEM files. The server's names: ``server_names`` and 127.0.0.1."""
    d.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test CA", ca_key, None, ca=True)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = _cert("stranger CA", other_key, None, ca=True)
    out: dict[str, Path] = {"ca": _write(d / "ca", ca, ca_key)}
    for name, issuer, usage in (
        ("server", (ca, ca_key), ExtendedKeyUsageOID.SERVER_AUTH),
        ("client", (ca, ca_key), ExtendedKeyUsageOID.CLIENT_AUTH),
        ("stranger", (other, other_key), ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(f"{name} cert", key, issuer, usage=usage, names=server_names)
        out[name] = _write(d / name, cert, key)
    return Pki(
        ca=out["ca"],
        server_cert=out["server"],
        server_key=out["server"].with_suffix(".key"),
        client_cert=out["client"],
        client_key=out["client"].with_suffix(".key"),
        stranger_cert=out["stranger"],
        stranger_key=out["stranger"].with_suffix(".key"),
    )


def bcrypt_hash(password: bytes, prefix: str = "2b") -> str:
    """A bcrypt hash of ``password`` (cost 4: quick) with the prefix htpasswd or bcrypt writes."""
    if prefix == "2y":
        # htpasswd writes $2y$; the algorithm is the one of $2b$ (bcrypt cannot emit 2y).
        return bcrypt.hashpw(password, bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$", 1)
    return bcrypt.hashpw(password, bcrypt.gensalt(4, prefix=prefix.encode())).decode()
