"""TLS on kvpoold's data port (issue 28 item 1, server side), with
certificates made by the openssl command line and Python's ssl module as
the client (libkvpool's own TLS is tested with its transport): a round
trip with server-only and with mutual TLS, a plaintext client on a TLS
port, a wrong CA, an expired certificate, a host name that does not
match, tokens over plaintext, a SIGHUP reload of the certificate while
clients keep working, and bad bytes where a ClientHello should be. Each
failure must be clear on both sides: the client's exception, and the
server's log line and counters; nothing else is disturbed."""

import hashlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time

import pytest

import kvpool
from conftest import Server
from tls_util import FrameConn, FrameError, ST_DENIED, client_context, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def key(tag, i=0):
    return hashlib.sha256(("%s/%d" % (tag, i)).encode()).digest()


def tls_server(pki, *extra, cert="srv"):
    return Server("--dram-capacity", "64MiB", "--max-block-bytes", "4MiB", "--threads", "2",
                  "--tls-cert-file", pki[cert], "--tls-key-file", pki[cert + "_key"],
                  *extra).start()


def wait_log(s, text, timeout=5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in s.log_text():
            return True
        time.sleep(0.05)
    raise AssertionError("kvpoold did not log %r; its log:\n%s" % (text, s.log_text()))


def stats_of(s):
    with kvpool.Client(s.url, "stats") as c:
        return c.stats()


def roundtrip(conn, tag, size=1 << 20):
    data = os.urandom(size)
    assert conn.put(key(tag), data) == 0
    st, got = conn.get(key(tag), size)
    assert st == 0 and got == data


def test_roundtrip_server_only_and_plaintext_beside(pki):
    """tls_only false (listen is loopback): TLS and plaintext clients on
    one port, told apart by their first byte."""
    s = tls_server(pki)
    try:
        c = FrameConn.connect(s.port, client_context(pki["ca"]))
        assert c.sock.version() in ("TLSv1.3", "TLSv1.2")
        c.hello("tls-a")
        roundtrip(c, "tls-a")
        c.ping()
        c.close()
        with kvpool.Client(s.url, "plain") as p:     # plaintext, same port
            p.put(key("plain"), b"p" * 4096)
            assert p.get(key("plain")) == b"p" * 4096
        tls = stats_of(s)["tls"]
        assert tls["enabled"] and not tls["tls_only"]
        assert tls["connections"]["total"] == 1 and tls["handshake_errors"] == 0
        assert "tls: certificate /CN=kvpool-server" in s.log_text()
    finally:
        assert s.stop() == 0


def test_mutual_tls(pki):
    s = tls_server(pki, "--tls-client-ca-file", pki["ca"])
    try:
        good = FrameConn.connect(s.port, client_context(pki["ca"], pki["client"],
                                                        pki["client_key"]))
        good.hello("mtls")
        roundtrip(good, "mtls", 64 << 10)
        # no client certificate: the server refuses it in the handshake
        for cert in (None, "stranger"):
            ctx = client_context(pki["ca"], cert and pki[cert], cert and pki[cert + "_key"])
            with pytest.raises((ssl.SSLError, ConnectionError)) as ei:
                c = FrameConn.connect(s.port, ctx)
                c.hello("mtls")          # TLS 1.3: the refusal comes with the first read
            assert "alert" in str(ei.value) or "reset" in str(ei.value).lower(), ei.value
        wait_log(s, "tls handshake failed: peer did not return a certificate")
        wait_log(s, "tls handshake failed: client certificate refused: unable to get local "
                    "issuer certificate")
        # the good client was not disturbed
        roundtrip(good, "mtls-2", 64 << 10)
        good.close()
        assert stats_of(s)["tls"]["handshake_errors"] == 2
    finally:
        assert s.stop() == 0


def test_plaintext_client_on_tls_only_port(pki):
    s = tls_server(pki, "--tls-only", "true")
    try:
        p = FrameConn.connect(s.port)
        with pytest.raises(FrameError) as ei:
            p.hello("plain")
        assert ei.value.status == ST_DENIED
        assert "this port requires TLS (tls_only): connect with a tls:// URL" in ei.value.message
        with pytest.raises(ConnectionError):
            p.ping()                                 # and the server closed it
        p.close()
        # libkvpool says the same, and the CLI prints it
        with pytest.raises(kvpool.Denied) as ei:
            kvpool.Client(s.url, "plain")
        assert "requires TLS" in str(ei.value)
        wait_log(s, "plaintext client refused (tls_only)")
        # TLS clients are served meanwhile; RDMA is off (it carries no TLS)
        c = FrameConn.connect(s.port, client_context(pki["ca"]))
        c.hello("tls")
        roundtrip(c, "tls", 4096)
        st = stats_of_tls(s, c)
        assert st["tls"]["plaintext_refused"] >= 2 and st["tls"]["tls_only"]
        assert not st["rdma"]["available"] and "tls_only" in st["rdma"]["reason"]
    finally:
        assert s.stop() == 0


def stats_of_tls(s, conn):
    """STATS over an established TLS connection (plaintext is refused)."""
    import json
    import struct
    body, _ = conn.call(8, struct.pack("<I", 0))
    return json.loads(body)


def test_wrong_ca_and_hostname(pki):
    s = tls_server(pki)
    try:
        good = FrameConn.connect(s.port, client_context(pki["ca"]))
        good.hello("ca")
        with pytest.raises(ssl.SSLCertVerificationError) as ei:
            FrameConn.connect(s.port, client_context(pki["other_ca"]))
        assert "unable to get local issuer certificate" in str(ei.value)
        wait_log(s, "tls handshake failed: tlsv1 alert unknown ca")
        with pytest.raises(ssl.SSLCertVerificationError) as ei:
            FrameConn.connect(s.port, client_context(pki["ca"]), server_hostname="other.example")
        assert "Hostname mismatch" in str(ei.value)
        roundtrip(good, "ca-good", 4096)             # not disturbed
        good.close()
    finally:
        assert s.stop() == 0


def test_expired_certificate(pki):
    s = tls_server(pki, cert="expired")
    try:
        wait_log(s, "expired: clients will refuse it")
        with pytest.raises(ssl.SSLCertVerificationError) as ei:
            FrameConn.connect(s.port, client_context(pki["ca"]))
        assert "certificate has expired" in str(ei.value)
        wait_log(s, "tls handshake failed: sslv3 alert certificate expired")
        assert stats_of(s)["tls"]["handshake_errors"] == 1
    finally:
        assert s.stop() == 0


def test_bad_settings_stop_start(pki, tmp_path):
    """Mismatched or unreadable files are bad settings (exit 2, named)."""
    bin_ = Server().binary
    loose = tmp_path / "loose.key"
    shutil.copy(pki["srv_key"], loose)
    loose.chmod(0o644)
    cases = [
        (["--tls-cert-file", pki["srv"], "--tls-key-file", pki["rotated_key"]],
         "does not match tls_cert_file"),
        (["--tls-cert-file", pki["srv"], "--tls-key-file", str(loose)],
         "lets others read the private key"),
        (["--tls-cert-file", pki["srv"]], "tls_cert_file is set but tls_key_file is not"),
        (["--tls-only", "true"], "tls_only is true but tls_cert_file is not set"),
        (["--tls-cert-file", str(tmp_path / "none.pem"), "--tls-key-file", pki["srv_key"]],
         "cannot load the certificate"),
        (["--listen", "0.0.0.0", "--tokens-file", str(tmp_path / "tok")],
         "tokens would cross the network in the clear"),
    ]
    (tmp_path / "tok").write_text("t0123456789abcdef0123 rw *\n")
    (tmp_path / "tok").chmod(0o600)
    for args, want in cases:
        r = subprocess.run([bin_, "--dram-capacity", "16MiB", "--max-block-bytes", "1MiB",
                            "--admin-port", "0"] + args,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and want in r.stderr, (args, r.returncode, r.stderr)


def non_loopback_address():
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True,
                             timeout=10).stdout.split()
    except OSError:
        return None
    for a in out:
        if ":" not in a and not a.startswith("127."):
            return a
    return None


def test_tokens_over_plaintext_refused(pki, tmp_path):
    """With tls_only false, a token sent in plaintext from a peer that is
    not on loopback is refused (it would have crossed a network in the
    clear); over TLS, or from loopback, it is accepted."""
    addr = non_loopback_address()
    if not addr:
        pytest.skip("no non-loopback address on this machine")
    tok = "plain-token-0123456789abcdef"
    tokens = tmp_path / "tokens"
    tokens.write_text(tok + " rw t/\n")
    tokens.chmod(0o600)
    s = tls_server(pki, "--listen", "0.0.0.0", "--tls-only", "false", "--tokens-file",
                   str(tokens), "--admin-port", "0")
    try:
        far = FrameConn.connect(s.port, host=addr)
        with pytest.raises(FrameError) as ei:
            far.hello("t/x", tok)
        assert ei.value.status == ST_DENIED and "token over plaintext" in ei.value.message
        far.close()
        near = FrameConn.connect(s.port)
        near.hello("t/x", tok)
        near.close()
        ctx = client_context(pki["ca"], check_hostname=False)
        far_tls = FrameConn.connect(s.port, ctx, host=addr)
        far_tls.hello("t/x", tok)
        roundtrip(far_tls, "far", 4096)
        far_tls.close()
    finally:
        assert s.stop() == 0


def test_reload_certificate_under_load(pki, tmp_path):
    """SIGHUP installs a new certificate for new connections while the
    open ones keep working: no error, no dropped connection; a reload
    whose key does not match keeps the old certificate."""
    cert, keyf = tmp_path / "cur.pem", tmp_path / "cur.key"
    shutil.copy(pki["srv"], cert)
    shutil.copy(pki["srv_key"], keyf)
    keyf.chmod(0o600)
    s = Server("--dram-capacity", "64MiB", "--max-block-bytes", "4MiB", "--threads", "2",
               "--tls-cert-file", str(cert), "--tls-key-file", str(keyf)).start()
    stop = threading.Event()
    errors, done = [], [0] * 4

    def worker(i):
        try:
            c = FrameConn.connect(s.port, client_context(pki["ca"]))
            c.hello("reload")
            n = 0
            while not stop.is_set():
                data = os.urandom(256 << 10)
                k = key("reload-%d" % i, n)
                assert c.put(k, data) == 0
                st, got = c.get(k, len(data))
                assert st == 0 and got == data
                n += 1
            done[i] = n
            c.close()
        except Exception as e:     # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.5)
        shutil.copy(pki["rotated"], cert)
        shutil.copy(pki["rotated_key"], keyf)
        os.kill(s.proc.pid, signal.SIGHUP)
        wait_log(s, "sighup: tls reloaded: certificate /CN=kvpool-rotated")
        c = FrameConn.connect(s.port, client_context(pki["ca"]))
        assert dict(x[0] for x in c.sock.getpeercert()["subject"])["commonName"] == \
            "kvpool-rotated"
        c.close()
        # a broken pair: refused, the rotated certificate stays
        shutil.copy(pki["srv"], cert)
        os.kill(s.proc.pid, signal.SIGHUP)
        wait_log(s, "sighup: tls certificate not reloaded, the old one stays")
        c = FrameConn.connect(s.port, client_context(pki["ca"]))
        assert dict(x[0] for x in c.sock.getpeercert()["subject"])["commonName"] == \
            "kvpool-rotated"
        c.close()
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        rc = s.stop()
    assert not errors, errors
    assert all(n > 0 for n in done), done
    assert rc == 0


def test_bad_bytes_where_a_client_hello_belongs(pki):
    """A 0x16 first byte followed by junk, a truncated ClientHello, a
    stream of garbage: each connection fails alone, with a log line; the
    server keeps serving TLS."""
    s = tls_server(pki, "--payload-timeout-ms", "1000")
    try:
        hello_start = bytes.fromhex("16030100c8010000c40303") + os.urandom(32)
        for junk in (b"\x16" + os.urandom(200), b"\x16\x03\x03\xff\xff" + os.urandom(64),
                     hello_start, b"\x16\x03\x01\x00\x05" + b"\x01\x00\x00\x01\x00"):
            r = socket.create_connection(("127.0.0.1", s.port), timeout=5)
            r.sendall(junk)
            r.settimeout(3)
            try:
                while r.recv(4096):
                    pass
            except (ConnectionError, socket.timeout):
                pass
            r.close()
        c = FrameConn.connect(s.port, client_context(pki["ca"]))
        c.hello("after-junk")
        roundtrip(c, "after-junk", 4096)
        c.close()
        assert stats_of(s)["tls"]["handshake_errors"] >= 3
    finally:
        assert s.stop() == 0


def cli(*args, **env):
    """Run the kvpool CLI with KVPOOL_TLS_* and KVPOOL_TOKEN from env only."""
    from conftest import ROOT
    exe = os.environ.get("KVPOOL_CLI") or os.path.join(ROOT, "build", "kvpool")
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("KVPOOL_TLS_") and k != "KVPOOL_TOKEN"}
    e.update(env)
    r = subprocess.run([exe] + list(args), capture_output=True, text=True, env=e, timeout=60)
    return r.returncode, r.stdout + r.stderr


def test_cli_says_what_is_wrong_with_tls(pki, tmp_path):
    """The CLI's words for TLS set-up errors (tester findings F1, F6, F9):
    a CA, certificate or key file that does not load or a key that does
    not match is named as such (not "bad URL"); a wrong CA on a node list
    keeps OpenSSL's reason; `kvpool ping` answered with a refusal of this
    client (a tls_only port in plaintext) exits 1, not 0."""
    s = tls_server(pki, "--tls-only", "true")
    try:
        url = "tls://localhost:%d" % s.port
        rc, out = cli("ping", "--server", url, KVPOOL_TLS_CA=pki["ca"])
        assert rc == 0 and "pong from" in out, out
        missing = str(tmp_path / "nonexist.pem")
        junk = tmp_path / "junk.pem"
        junk.write_text("junk\n")
        for env, want in (({"KVPOOL_TLS_CA": missing}, missing),
                          ({"KVPOOL_TLS_CA": str(junk)}, str(junk)),
                          ({"KVPOOL_TLS_CA": pki["ca"], "KVPOOL_TLS_CERT": missing,
                            "KVPOOL_TLS_KEY": missing}, missing),
                          ({"KVPOOL_TLS_CA": pki["ca"], "KVPOOL_TLS_CERT": pki["client"],
                            "KVPOOL_TLS_KEY": pki["stranger_key"]}, "key")):
            rc, out = cli("ping", "--server", url, **env)
            assert rc == 2, (env, out)
            assert "bad URL" not in out and want in out, (env, out)
        # a node list whose nodes' certificates the CA does not sign
        s2 = tls_server(pki, "--tls-only", "true")
        try:
            rc, out = cli("ping", "--server", "%s,localhost:%d" % (url, s2.port),
                          KVPOOL_TLS_CA=pki["other_ca"])
            assert rc != 0 and "unable to get local issuer certificate" in out, out
        finally:
            assert s2.stop() == 0
        # plaintext on a tls_only port: the server answers and refuses
        rc, out = cli("ping", "--server", "tcp://127.0.0.1:%d" % s.port)
        assert rc == 1 and "requires TLS" in out and "refuses this client" in out, out
    finally:
        assert s.stop() == 0


def test_reload_keeps_a_valid_certificate_and_warns_when_mutual_tls_goes(pki, tmp_path):
    """Tester findings F7 and F8: a SIGHUP whose new certificate has
    expired keeps the valid one in use (logged, with why), and a SIGHUP
    that drops tls_client_ca_file says at warn level that mutual TLS is
    off. Before, the expired certificate replaced the valid one (every new
    client failed "certificate has expired") and the change was an info
    line like any other."""
    cert, keyf = tmp_path / "cur.pem", tmp_path / "cur.key"
    shutil.copy(pki["srv"], cert)
    shutil.copy(pki["srv_key"], keyf)
    keyf.chmod(0o600)
    conf = tmp_path / "kvpool.conf"
    base = ("dram_capacity = 16MiB\nmax_block_bytes = 1MiB\nthreads = 2\n"
            "tls_cert_file = %s\ntls_key_file = %s\n" % (cert, keyf))
    conf.write_text(base + "tls_client_ca_file = %s\n" % pki["ca"])
    s = Server("--config", str(conf)).start()
    try:
        mctx = client_context(pki["ca"], pki["client"], pki["client_key"])
        c = FrameConn.connect(s.port, mctx)
        c.hello("reload")
        c.close()
        shutil.copy(pki["expired"], cert)
        shutil.copy(pki["expired_key"], keyf)
        s.proc.send_signal(signal.SIGHUP)
        wait_log(s, "tls certificate not reloaded, the old one stays: tls_cert_file %s has "
                    "expired, and the certificate in use is valid" % cert)
        c = FrameConn.connect(s.port, mctx)      # still the valid certificate
        c.hello("reload")
        c.close()
        # the renewal goes in; then the client CA line goes
        shutil.copy(pki["srv"], cert)
        shutil.copy(pki["srv_key"], keyf)
        conf.write_text(base)
        s.proc.send_signal(signal.SIGHUP)
        wait_log(s, "warn sighup: tls_client_ca_file removed: mutual TLS is OFF")
    finally:
        assert s.stop() == 0


def test_tls_client_on_a_plaintext_port_is_told_so(pki):
    """Tester finding F10: a tls:// client of a kvpoold without TLS gets
    "the server does not speak TLS" (not OpenSSL's "wrong version number"),
    and libkvpool's own words are not labelled as the server's."""
    s = Server("--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "2").start()
    try:
        with pytest.raises(kvpool.ProtocolError) as ei:
            kvpool.Client("tls://localhost:%d" % s.port, "x", tls_ca=pki["ca"])
        msg = str(ei.value)
        assert "does not speak TLS on this port" in msg and "use tcp://" in msg, msg
        assert "(server:" not in msg, msg
        wait_log(s, "a TLS ClientHello, but this server has no TLS")
    finally:
        assert s.stop() == 0
