"""libkvpool's TLS as Python sees it (issue 28 item 1, client side):
kvpool.Client on a tls:// URL with tls_ca / tls_cert / tls_key or the
KVPOOL_TLS_* variables, host-name checking on by default, and the clear
errors of a wrong CA, a missing client certificate and a plaintext URL
on a TLS-only port."""

import hashlib
import os
import pathlib

import pytest

import kvpool
from conftest import Server
from tls_util import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def key(tag, i=0):
    return hashlib.sha256(("%s/%d" % (tag, i)).encode()).digest()


def tls_server(pki, *extra, cert="srv"):
    return Server("--dram-capacity", "64MiB", "--max-block-bytes", "4MiB", "--threads", "2",
                  "--tls-cert-file", pki[cert], "--tls-key-file", pki[cert + "_key"],
                  *extra).start()


def tls_url(s, host="127.0.0.1"):
    return "tls://%s:%d" % (host, s.port)


def test_roundtrip_over_tls(pki):
    s = tls_server(pki)
    try:
        data = os.urandom(1 << 20)
        with kvpool.Client(tls_url(s), "tls-py", tls_ca=pathlib.Path(pki["ca"])) as c:
            c.put(key("a"), data)
            assert c.get(key("a")) == data
            buf = bytearray(len(data))
            assert c.get_into(key("a"), buf) == len(data) and bytes(buf) == data
            assert c.match([key("a"), key("b")], lease_ms=1000) == 1
            assert c.stats()["tls"]["connections"]["total"] >= 1
        with kvpool.Client(tls_url(s, "localhost"), "tls-py", tls_ca=pki["ca"]) as c:
            assert c.get(key("a")) == data     # the name matches a DNS SAN
    finally:
        s.stop()


def test_environment_variables(pki, monkeypatch):
    s = tls_server(pki, "--tls-client-ca-file", pki["ca"])
    try:
        monkeypatch.setenv("KVPOOL_TLS_CA", pki["ca"])
        monkeypatch.setenv("KVPOOL_TLS_CERT", pki["client"])
        monkeypatch.setenv("KVPOOL_TLS_KEY", pki["client_key"])
        with kvpool.Client(tls_url(s), "env") as c:
            c.put(key("env"), b"e" * 4096)
            assert c.get(key("env")) == b"e" * 4096
    finally:
        s.stop()


def test_mutual_tls_needs_the_client_certificate(pki):
    s = tls_server(pki, "--tls-client-ca-file", pki["ca"])
    try:
        with kvpool.Client(tls_url(s), "m", tls_ca=pki["ca"], tls_cert=pki["client"],
                           tls_key=pki["client_key"]) as c:
            c.ping()
        with pytest.raises(kvpool.Error) as e:
            kvpool.Client(tls_url(s), "m", tls_ca=pki["ca"], timeout=5)
        assert "certificate" in str(e.value), str(e.value)
        with pytest.raises(kvpool.Error) as e:
            kvpool.Client(tls_url(s), "m", tls_ca=pki["ca"], tls_cert=pki["stranger"],
                          tls_key=pki["stranger_key"], timeout=5)
        assert "certificate" in str(e.value) or "alert" in str(e.value), str(e.value)
        with kvpool.Client(s.url, "plain") as c:      # loopback: plaintext beside
            c.ping()
    finally:
        s.stop()


def test_wrong_ca_and_host_name(pki):
    s = tls_server(pki, cert="elsewhere")
    try:
        with pytest.raises(kvpool.ProtocolError) as e:
            kvpool.Client(tls_url(s), "x", tls_ca=pki["other_ca"], timeout=5)
        assert "certificate is refused" in str(e.value), str(e.value)
        with pytest.raises(kvpool.ProtocolError) as e:
            kvpool.Client(tls_url(s), "x", tls_ca=pki["ca"], timeout=5)
        assert "127.0.0.1" in str(e.value), str(e.value)    # says the name it wanted
        with kvpool.Client(tls_url(s), "x", tls_ca=pki["ca"], tls_verify_hostname=False) as c:
            c.ping()
    finally:
        s.stop()


def test_plaintext_url_on_tls_only_port_and_arguments(pki):
    s = tls_server(pki, "--tls-only", "true")
    try:
        with pytest.raises(kvpool.Denied) as e:
            kvpool.Client(s.url, "p", timeout=5)
        assert "tls" in str(e.value).lower(), str(e.value)
        with pytest.raises(kvpool.InvalidArgument):
            kvpool.Client(tls_url(s), "p", tls_ca="/nonexistent/ca.pem", timeout=5)
        with pytest.raises(TypeError):
            kvpool.Client(tls_url(s), "p", tls_ca=7)
        with kvpool.Client(tls_url(s), "p", tls_ca=pki["ca"]) as c:
            c.ping()
    finally:
        s.stop()
