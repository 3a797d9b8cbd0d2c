"""What lets the local API server reach its kubelet nodes as on a real cluster: the certificates (the
API server's kubelet client, each kubelet's serving certificate for its node address, both from the
cluster CA), the API server's flags, and each node's own link to the host with an address from the
environment's block of 198.18.0.0/15."""
from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from localenv import netns
from localenv.certs import APISERVER_KUBELET_CLIENT_CN, ensure_pki, ensure_serving_cert
from localenv.control_plane import LocalKube


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _eku(cert: x509.Certificate) -> list:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_the_apiserver_kubelet_client_is_a_client_cert_of_the_cluster_ca_in_no_group(tmp_path):
    pki, created = ensure_pki(tmp_path / "pki", service_ip="10.96.0.1")
    assert "apiserver-kubelet-client" in created
    cert, ca = _cert(pki.apiserver_kubelet_client_cert), _cert(pki.ca_cert)
    cert.verify_directly_issued_by(ca)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == APISERVER_KUBELET_CLIENT_CN
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME) == []  # not system:masters
    assert _eku(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    _, again = ensure_pki(tmp_path / "pki", service_ip="10.96.0.1")
    assert again == []  # reused


def test_a_kubelet_serving_cert_names_its_node_address_and_follows_it(tmp_path):
    pki, _ = ensure_pki(tmp_path / "pki", service_ip="10.96.0.1")
    crt, _ = ensure_serving_cert(pki, "kubelet-system-0-serving", "system:node:system-0", "system:nodes",
                                 dns=("system-0",), ips=("198.18.7.1",))
    cert = _cert(crt)
    cert.verify_directly_issued_by(_cert(pki.ca_cert))
    assert _eku(cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["system-0"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("198.18.7.1")]
    serial = cert.serial_number
    ensure_serving_cert(pki, "kubelet-system-0-serving", "system:node:system-0", "system:nodes",
                        dns=("system-0",), ips=("198.18.7.1",))
    assert _cert(crt).serial_number == serial  # the same address: reused
    ensure_serving_cert(pki, "kubelet-system-0-serving", "system:node:system-0", "system:nodes",
                        dns=("system-0",), ips=("198.18.9.1",))
    moved = _cert(crt).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert moved.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("198.18.9.1")]  # re-issued


def test_the_apiserver_verifies_kubelets_and_authenticates_to_them(tmp_path):
    kube = LocalKube(tmp_path / "kube", bin_dir=tmp_path / "bin")
    ensure_pki(kube.pki.dir, service_ip=kube.service_ip)
    argv = kube._components()["kube-apiserver"].command()
    flags = dict(a.split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)
    assert flags["--kubelet-certificate-authority"] == str(kube.pki.ca_cert)
    assert flags["--kubelet-client-certificate"] == str(kube.pki.apiserver_kubelet_client_cert)
    assert flags["--kubelet-client-key"] == str(kube.pki.apiserver_kubelet_client_key)
    assert flags["--kubelet-preferred-address-types"] == "InternalIP"
    assert all(Path(flags[f]).is_file() for f in ("--kubelet-certificate-authority", "--kubelet-client-certificate",
                                                   "--kubelet-client-key"))


def test_node_links_are_point_to_point_pairs_in_the_environments_block(tmp_path):
    links = [netns.link_for(tmp_path, i) for i in range(4)]
    block = netns.env_block(tmp_path)
    assert block.subnet_of(netns.RANGE) and block.prefixlen == 24
    pairs = [(ipaddress.ip_address(x.host_address), ipaddress.ip_address(x.node_address)) for x in links]
    for host, node in pairs:
        assert host in block and node == host + 1
        assert ipaddress.ip_network(f"{host}/31", strict=True)  # the pair is one /31
    assert len({x.host_if for x in links}) == 4 and all(len(x.host_if) <= 15 for x in links)
    assert len({h for h, _ in pairs}) == 4
    assert netns.link_for(tmp_path, 2) == links[2]  # a function of the folder
    # another folder names other interfaces; its block is another /24 but for a 1-in-512 hash collision
    others = [netns.link_for(tmp_path / f"other{i}", 0) for i in range(4)]
    assert all(o.host_if != links[0].host_if for o in others)
    assert any(o.block != links[0].block for o in others)
    with pytest.raises(netns.NetnsError):
        netns.link_for(tmp_path, 128)
