"""PKI for the local Kubernetes control plane (see :mod:`localenv.kube`).

Everything is generated once with ``cryptography`` and reused on later runs:

* ``ca.crt`` / ``ca.key``            cluster CA (ECDSA P-256, 10 years)
* ``apiserver.crt`` / ``.key``       API server serving cert (localhost, 127.0.0.1, kubernetes.default...)
* ``admin.crt`` / ``.key``           client cert, ``O=system:masters``
* ``apiserver-kubelet-client.crt``   the API server's client cert towards the kubelets (``kubectl logs``,
  ``exec``, ``port-forward``): name and CN as kubeadm issues it (cmd/kubeadm/app/phases/certs/certlist.go,
  ``KubeadmCertKubeletClient``, v1.34.4); kubeadm puts it in a group bound to cluster-admin, this one is
  in no group and gets only ``system:kubelet-api-admin`` (see :mod:`localenv.control_plane`)
* ``sa.key`` / ``sa.pub``            service-account token signing key pair (RSA 2048)

and, per kubelet node (:mod:`localenv.node`), a client cert for the node's identity and a serving cert
for its own HTTPS server, signed by the same CA the API server names in ``--kubelet-certificate-authority``.

A leaf certificate is re-issued (from the same CA) when it is missing, expires
within a day, or lacks a SAN that the current configuration needs; the CA and
the service-account keys are never replaced once they exist.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 730
_RENEW_MARGIN = _dt.timedelta(days=1)

# The user the API server is to the kubelets (kubeadm's CommonName, cmd/kubeadm/app/constants/constants.go).
APISERVER_KUBELET_CLIENT_CN = "kube-apiserver-kubelet-client"

APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class PKI:
    """Paths of the generated files."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def apiserver_kubelet_client_cert(self) -> Path:
        return self.dir / "apiserver-kubelet-client.crt"

    @property
    def apiserver_kubelet_client_key(self) -> Path:
        return self.dir / "apiserver-kubelet-client.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _write(path: Path, data: bytes, *, private: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _load_key(path: Path):
    return serialization.load_pem_private_key(path.read_bytes(), password=None)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = []
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _valid(cert: x509.Certificate) -> bool:
    return cert.not_valid_after_utc - _RENEW_MARGIN > _now()


def _ensure_ca(pki: PKI) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    if pki.ca_cert.exists() and pki.ca_key.exists():
        return _load_cert(pki.ca_cert), _load_key(pki.ca_key)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("gpufleet-local-ca")
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(pki.ca_key, _key_pem(key), private=True)
    _write(pki.ca_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return cert, key


def _issue(
    ca_cert: x509.Certificate,
    ca_key,
    *,
    cn: str,
    org: str | None,
    usage: list,
    dns: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, org))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(min(now + _dt.timedelta(days=LEAF_DAYS), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_encipherment=True, key_cert_sign=False, crl_sign=False,
                content_commitment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False
        )
    )
    if dns or ips:
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _sans_ok(cert: x509.Certificate, dns: tuple[str, ...], ips: tuple[str, ...]) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have_dns = set(san.get_values_for_type(x509.DNSName))
    have_ips = {str(i) for i in san.get_values_for_type(x509.IPAddress)}
    return set(dns) <= have_dns and {str(ipaddress.ip_address(i)) for i in ips} <= have_ips


def _signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca_cert)
        return True
    except Exception:  # noqa: BLE001 - any failure means "re-issue"
        return False


def ensure_pki(directory: Path, *, service_ip: str, extra_ips: tuple[str, ...] = ()) -> tuple[PKI, list[str]]:
    """Create (or reuse) the PKI in ``directory``; returns it and the names of files (re)generated."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    pki = PKI(directory)
    created: list[str] = []

    had_ca = pki.ca_cert.exists() and pki.ca_key.exists()
    ca_cert, ca_key = _ensure_ca(pki)
    if not had_ca:
        created.append("ca")

    dns = APISERVER_DNS_NAMES
    ips = tuple(dict.fromkeys(("127.0.0.1", "::1", service_ip, *extra_ips)))

    def need(cert_path: Path, key_path: Path, check=lambda c: True) -> bool:
        if not (cert_path.exists() and key_path.exists()):
            return True
        cert = _load_cert(cert_path)
        return not (_valid(cert) and _signed_by(cert, ca_cert) and check(cert))

    if need(pki.apiserver_cert, pki.apiserver_key, lambda c: _sans_ok(c, dns, ips)):
        cert, key = _issue(
            ca_cert, ca_key, cn="kube-apiserver", org=None,
            usage=[ExtendedKeyUsageOID.SERVER_AUTH], dns=dns, ips=ips,
        )
        _write(pki.apiserver_key, _key_pem(key), private=True)
        _write(pki.apiserver_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
        created.append("apiserver")

    if need(pki.admin_cert, pki.admin_key):
        cert, key = _issue(
            ca_cert, ca_key, cn="gpufleet-admin", org="system:masters",
            usage=[ExtendedKeyUsageOID.CLIENT_AUTH],
        )
        _write(pki.admin_key, _key_pem(key), private=True)
        _write(pki.admin_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
        created.append("admin")

    if need(pki.apiserver_kubelet_client_cert, pki.apiserver_kubelet_client_key,
            lambda c: c.subject == _name(APISERVER_KUBELET_CLIENT_CN)):
        cert, key = _issue(ca_cert, ca_key, cn=APISERVER_KUBELET_CLIENT_CN, org=None,
                           usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
        _write(pki.apiserver_kubelet_client_key, _key_pem(key), private=True)
        _write(pki.apiserver_kubelet_client_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
        created.append("apiserver-kubelet-client")

    if not (pki.sa_key.exists() and pki.sa_pub.exists()):
        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write(pki.sa_key, _key_pem(sa), private=True)
        _write(
            pki.sa_pub,
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            private=False,
        )
        created.append("service-account")

    return pki, created


def ensure_client_cert(pki: PKI, name: str, cn: str, org: str | None) -> tuple[Path, Path]:
    """A client certificate ``<name>.crt``/``.key`` signed by the local CA (reused while valid), e.g. a
    kubelet's ``CN=system:node:<node>, O=system:nodes``, which the Node authorizer lets act for that node."""
    return _ensure_leaf(pki, name, cn, org, ExtendedKeyUsageOID.CLIENT_AUTH)


def ensure_serving_cert(pki: PKI, name: str, cn: str, org: str | None, *, dns: tuple[str, ...],
                        ips: tuple[str, ...]) -> tuple[Path, Path]:
    """A serving certificate ``<name>.crt``/``.key`` for ``dns`` and ``ips``, signed by the local CA (re-issued
    when a name or address is missing), e.g. a kubelet's, which the API server verifies when it dials the
    node's address (``--kubelet-certificate-authority``)."""
    return _ensure_leaf(pki, name, cn, org, ExtendedKeyUsageOID.SERVER_AUTH, dns, ips)


def _ensure_leaf(pki: PKI, name: str, cn: str, org: str | None, usage, dns: tuple[str, ...] = (),
                 ips: tuple[str, ...] = ()) -> tuple[Path, Path]:
    cert_path, key_path = pki.dir / f"{name}.crt", pki.dir / f"{name}.key"
    ca_cert, ca_key = _load_cert(pki.ca_cert), _load_key(pki.ca_key)
    if cert_path.exists() and key_path.exists():
        cert = _load_cert(cert_path)
        if (_valid(cert) and _signed_by(cert, ca_cert) and cert.subject == _name(cn, org)
                and _usage(cert) == [usage] and (not (dns or ips) or _sans_ok(cert, dns, ips))):
            return cert_path, key_path
    cert, key = _issue(ca_cert, ca_key, cn=cn, org=org, usage=[usage], dns=dns, ips=ips)
    _write(key_path, _key_pem(key), private=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return cert_path, key_path


def _usage(cert: x509.Certificate) -> list:
    try:
        return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return []
