"""Namespaces and keys of the engine adapters: namespace names built from
an engine's configuration, 32-byte kvpool keys from engine hashes and
key strings. Nothing here imports an engine. Internal: the names may
change."""

import hashlib

from .. import _lib

KEY_BYTES = _lib.KEY_BYTES


def namespace_part(value):
    """One part of a namespace: str(value) with every byte outside printable
    ASCII 0x21..0x7e (spaces included) replaced by '_'."""
    raw = str(value).encode("utf-8", "replace")
    return "".join(chr(b) if 0x21 <= b <= 0x7e else "_" for b in raw) or "_"


def make_namespace(*parts):
    """Join parts with ':' into a valid kvpool namespace (1..255 bytes). A
    name over 255 bytes keeps its first 238 bytes and ends with ':' and
    16 hex digits of the SHA-256 of the whole name, so different long
    names stay different."""
    name = ":".join(namespace_part(p) for p in parts)
    if len(name) <= 255:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return name[:238] + ":" + digest


def pad_key(h):
    """An engine hash as a 32-byte kvpool key: 32 bytes as is, shorter ones
    (16-byte xxhash-128) zero-padded at the end. TypeError for a non-bytes
    value, ValueError for one longer than 32 bytes."""
    if isinstance(h, (bytearray, memoryview)):
        h = bytes(h)
    if not isinstance(h, bytes):
        raise TypeError("kvpool: a block hash must be bytes, not %s" % type(h).__name__)
    if len(h) > KEY_BYTES or not h:
        raise ValueError("kvpool: a block hash must be 1..32 bytes, got %d" % len(h))
    return h + bytes(KEY_BYTES - len(h)) if len(h) < KEY_BYTES else h


def string_key(s):
    """A string key (LMCache's key strings, SGLang's non-hex keys) as 32
    bytes: the SHA-256 of its UTF-8."""
    if isinstance(s, bytes):
        return hashlib.sha256(s).digest()
    return hashlib.sha256(str(s).encode("utf-8")).digest()
