"""kvpool: Python binding of libkvpool, the client of the kvpool KV-cache pool.

    import kvpool
    keys = kvpool.block_hashes(token_ids, block_size=16)
    with kvpool.Client("tcp://127.0.0.1:7470", "llama3-8b:bf16:tp1:b16") as c:
        c.put_chain(keys, [kv[i] for i in range(len(keys))])   # numpy blocks
        n = c.match(keys, lease_ms=1000)
        c.get_into_many(keys[:n], [kv[i] for i in range(n)])   # no copies

Keys are 32-byte bytes (block hashes). Payloads are buffer-protocol objects
(bytes, bytearray, memoryview, numpy arrays) or contiguous torch CPU
tensors. Errors raise subclasses of kvpool.Error (see kvpool.errors).
The C library is the copy inside the package (a wheel of make wheel
carries one), else $KVPOOL_LIB, else the source tree's build/libkvpool.so,
else the installed libkvpool.so.1; kvpool.library_path says which loaded
(kvpool/_lib.py has the rules: KVPOOL_LIB never replaces the copy inside).
"""

from ._lib import DEFAULT_URL, KEY_BYTES
from ._lib import path as library_path
from .client import (Client, Completion, Limits, MatchResult, MATCH_LEASE_CUT, MATCH_RETAIN_BUDGET,
                     MATCH_RETAIN_CLAMPED, MATCH_WAIT_CLAMPED, MATCH_WAIT_ENDED,
                     MATCH_WAIT_REFUSED, MATCH_WAIT_TIMEOUT, MATCH_WAITED, PUT_RETAIN_BUDGET,
                     PUT_RETAIN_CLAMPED, PUT_RETAINED)
from .errors import (AlreadyRegistered, Busy, ChecksumError, ConnectionError, Denied, Error,
                     Full, InvalidArgument, Miss, NoParent, NotRegistered, OutOfMemory,
                     ProtocolError, QuotaExceeded, ServerIOError, Timeout, TooLarge,
                     Unsupported, error_class, strerror)
from .hashes import block_hashes
from . import placement



def _version():
    """kvpoold's version (SRV_VERSION in server/srv_server.h): read from
    the source tree this package sits in, else from the installed package's
    metadata (which setup.py took from the same line)."""
    import os
    import re
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    if os.path.exists(os.path.join(root, "client", "kvpool.h")):  # a source tree
        try:
            with open(os.path.join(root, "server", "srv_server.h"), encoding="utf-8") as f:
                m = re.search(r'^#define SRV_VERSION "([^"]+)"', f.read(), re.M)
            if m:
                return m.group(1)
        except OSError:
            pass
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("kvpool")
    except (ImportError, PackageNotFoundError):
        return "unknown"


__version__ = _version()

__all__ = [
    "Client", "Completion", "Limits", "MatchResult", "block_hashes", "placement", "strerror",
    "error_class",
    "MATCH_LEASE_CUT", "MATCH_WAITED", "MATCH_WAIT_TIMEOUT", "MATCH_WAIT_REFUSED",
    "MATCH_WAIT_CLAMPED", "MATCH_WAIT_ENDED", "MATCH_RETAIN_BUDGET", "MATCH_RETAIN_CLAMPED",
    "PUT_RETAINED", "PUT_RETAIN_BUDGET", "PUT_RETAIN_CLAMPED",
    "DEFAULT_URL", "KEY_BYTES",
    "library_path", "Error", "Miss", "NoParent", "Full", "QuotaExceeded", "Busy", "TooLarge",
    "Denied", "ChecksumError", "ServerIOError", "ProtocolError", "Unsupported",
    "InvalidArgument", "AlreadyRegistered", "NotRegistered", "OutOfMemory", "ConnectionError",
    "Timeout",
]
