"""A local certificate authority and the certificates it signs, as PEM: what a secured local stack needs so
that clients can check the broker they reach (``ssl.ca.location``) and the brokers can check each other.

The broker's key is written unencrypted (PKCS#8 PEM, beside its certificate chain in one file): Kafka's PEM
key store reads it so (``ssl.keystore.type=PEM``), and the file is the owner's only, like every secret of
the stack."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_BITS = 2048
CA_DAYS = 3650
CERTIFICATE_DAYS = 825
LOCAL_HOSTS = ("localhost", "127.0.0.1")
"""Always among a broker certificate's names, beside the host it listens on."""


@dataclass(frozen=True)
class Issued:
    """A private key and its certificate."""

    key: rsa.RSAPrivateKey
    certificate: x509.Certificate

    def key_pem(self, password: bytes | None = None) -> bytes:
        """The key as PKCS#8 PEM, encrypted with ``password`` when given."""
        encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)

    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @classmethod
    def from_pem(cls, key_pem: bytes, certificate_pem: bytes) -> Issued:
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            msg = "expected an RSA private key"
            raise ValueError(msg)
        return cls(key, x509.load_pem_x509_certificate(certificate_pem))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def new_ca(common_name: str = "mixflow local CA", days: int = CA_DAYS) -> Issued:
    """A self-signed certificate authority."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
    name = _name(common_name)
    now = _now()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(key, certificate)


def subject_alternative_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """Each host as an IP address entry when it is one, else as a DNS name; in order, without repeats."""
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def issue(
    ca: Issued,
    common_name: str,
    hosts: Sequence[str],
    *,
    days: int = CERTIFICATE_DAYS,
    not_before: datetime.datetime | None = None,
) -> Issued:
    """A certificate signed by ``ca`` for ``hosts`` (its subject alternative names), good for a TLS server
    and a TLS client (a broker is both: to its clients, and to the other nodes and the controllers), valid
    from ``not_before`` (a few minutes ago by default) for ``days``. Without ``hosts``, a client's only: the
    subject ``CN=common_name`` is what it authenticates as."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
    start = not_before or _now() - datetime.timedelta(minutes=5)
    usages = (
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        if hosts
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(subject_alternative_names(hosts)), critical=False)
    return Issued(key, builder.sign(ca.key, hashes.SHA256()))


def key_store_pem(issued: Issued, ca: Issued) -> bytes:
    """Kafka's PEM key store: the private key, then the certificate chain (the certificate, then the CA's)."""
    return issued.key_pem() + issued.certificate_pem() + ca.certificate_pem()
