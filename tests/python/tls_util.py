"""Helpers of the TLS tests: a throw-away PKI made with the openssl command
line, and a minimal kvpool protocol client over any socket (plain or
ssl-wrapped), written from proto/PROTOCOL.md (header 3.1, HELLO 6.1, PUT
6.2, GET 6.3, error body 5), so that the server's TLS is tested without
libkvpool's own TLS."""

import ctypes
import ctypes.util
import os
import socket
import ssl
import struct
import subprocess

MAGIC = 0x4C50564B
HDR = struct.Struct("<IBBHHHIQQ")   # magic version opcode flags status reserved body req payload
OP_HELLO, OP_PUT, OP_GET, OP_PING, OP_STATS = 1, 2, 3, 9, 8
ST_OK, ST_DENIED = 0, 8

_xxh = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(data):
    return _xxh.XXH3_64bits(bytes(data), len(data))


# ---- PKI ------------------------------------------------------------------

_CA_CNF = """[ca]
default_ca = d
[d]
database = {d}/index.txt
new_certs_dir = {d}
certificate = {d}/{ca}.pem
private_key = {d}/{ca}.key
default_md = sha256
policy = p
copy_extensions = copy
serial = {d}/serial
unique_subject = no
[p]
commonName = supplied
"""


def _run(args, cwd):
    subprocess.run(args, cwd=cwd, check=True, capture_output=True, timeout=60)


def _key_and_csr(d, name, cn, san=None):
    args = ["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn]
    if san:
        args += ["-addext", "subjectAltName=" + san]
    _run(args, d)
    os.chmod(os.path.join(d, name + ".key"), 0o600)


def _ca(d, name, cn):
    _run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes", "-keyout", name + ".key", "-out", name + ".pem", "-days", "30",
          "-subj", "/CN=" + cn], d)
    os.chmod(os.path.join(d, name + ".key"), 0o600)
    cd = os.path.join(d, name + "-db")
    os.makedirs(cd, exist_ok=True)
    open(os.path.join(cd, "index.txt"), "w").close()
    with open(os.path.join(cd, "serial"), "w") as f:
        f.write("1000\n")
    for ext in ("pem", "key"):
        os.link(os.path.join(d, "%s.%s" % (name, ext)), os.path.join(cd, "%s.%s" % (name, ext)))
    with open(os.path.join(d, name + ".cnf"), "w") as f:
        f.write(_CA_CNF.format(d=cd, ca=name))


def _sign(d, ca, name, start=None, end=None, days=30, usage=None):
    args = ["openssl", "ca", "-batch", "-config", ca + ".cnf", "-in", name + ".csr",
            "-out", name + ".pem", "-notext"]
    if start:
        args += ["-startdate", start, "-enddate", end]
    else:
        args += ["-days", str(days)]
    _run(args, d)


def make_pki(d):
    """Certificates under directory d (a dict of their paths):
    ca, other_ca              two CAs (clients trust ca)
    srv, srv_key              server: CN kvpool-server, SAN localhost, 127.0.0.1
    rotated, rotated_key      its replacement: CN kvpool-rotated, same SANs
    expired, expired_key      a server certificate valid in 2020 only
    client, client_key        a client certificate signed by ca
    stranger, stranger_key    a client certificate signed by other_ca
    elsewhere, elsewhere_key  a server certificate for other.example only"""
    d = str(d)
    _ca(d, "ca", "kvpool test CA")
    _ca(d, "other_ca", "another CA")
    san = "DNS:localhost,IP:127.0.0.1"
    for name, cn in (("srv", "kvpool-server"), ("rotated", "kvpool-rotated"),
                     ("expired", "kvpool-expired")):
        _key_and_csr(d, name, cn, san)
    _key_and_csr(d, "elsewhere", "kvpool-elsewhere", "DNS:other.example")
    _key_and_csr(d, "client", "kvpool-client")
    _key_and_csr(d, "stranger", "kvpool-stranger")
    _sign(d, "ca", "srv")
    _sign(d, "ca", "rotated")
    _sign(d, "ca", "expired", start="20200101000000Z", end="20200102000000Z")
    _sign(d, "ca", "elsewhere")
    _sign(d, "ca", "client")
    _sign(d, "other_ca", "stranger")
    out = {}
    for name in ("ca", "other_ca", "srv", "rotated", "expired", "client", "stranger",
                 "elsewhere"):
        out[name] = os.path.join(d, name + ".pem")
        out[name + "_key"] = os.path.join(d, name + ".key")
    return out


def client_context(cafile, cert=None, key=None, check_hostname=True):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = check_hostname
    ctx.load_verify_locations(cafile)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


# ---- frames ---------------------------------------------------------------

class FrameError(Exception):
    def __init__(self, status, message):
        super().__init__("status %d: %s" % (status, message))
        self.status, self.message = status, message


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        buf += chunk
    return bytes(buf)


class FrameConn:
    """One kvpool connection over sock (plain, or an ssl.SSLSocket)."""

    def __init__(self, sock):
        self.sock = sock
        self.rid = 0

    @classmethod
    def connect(cls, port, ctx=None, host="127.0.0.1", server_hostname="localhost",
                timeout=10):
        s = socket.create_connection((host, port), timeout=timeout)
        if ctx is not None:
            s = ctx.wrap_socket(s, server_hostname=server_hostname)
        return cls(s)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, op, body=b"", payload=b""):
        self.rid += 1
        self.sock.sendall(HDR.pack(MAGIC, 1, op, 0, 0, 0, len(body), self.rid, len(payload)) +
                          body + payload)
        return self.rid

    def recv(self):
        """(opcode, status, request_id, body, payload) of the next reply."""
        magic, _v, op, _fl, st, _r, body_n, rid, pay_n = HDR.unpack(_recv_exact(self.sock, 32))
        assert magic == MAGIC, hex(magic)
        body = _recv_exact(self.sock, body_n) if body_n else b""
        payload = _recv_exact(self.sock, pay_n) if pay_n else b""
        return op, st, rid, body, payload

    def call(self, op, body=b"", payload=b""):
        rid = self.send(op, body, payload)
        rop, st, rrid, rbody, rpay = self.recv()
        if st != ST_OK and rop in (0, op):
            msg_n = struct.unpack_from("<I", rbody, 4)[0] if len(rbody) >= 8 else 0
            raise FrameError(st, rbody[8:8 + msg_n].decode(errors="replace"))
        assert rrid == rid and rop == op, (rop, rrid, op, rid)
        return rbody, rpay

    def hello(self, ns, token=b""):
        ns = ns.encode()
        token = token.encode() if isinstance(token, str) else token
        return self.call(OP_HELLO, struct.pack("<HHHH", 1, 1, len(ns), len(token)) + ns +
                         token)[0]

    def put(self, key, data, parent=None):
        """The per-block status of one PUT."""
        entry = key + (parent or bytes(32)) + struct.pack("<QQII", len(data), xxh3(data),
                                                           1 if parent else 0, 0)
        body, _ = self.call(OP_PUT, struct.pack("<II", 1, 0) + entry, data)
        return struct.unpack_from("<H", body, 8)[0]

    def get(self, key, max_length):
        """(status, bytes) of one GET."""
        body, payload = self.call(OP_GET, struct.pack("<II", 1, 0) + key +
                                  struct.pack("<Q", max_length))
        return struct.unpack_from("<H", body, 8)[0], payload

    def ping(self):
        self.call(OP_PING)
