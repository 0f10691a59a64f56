"""The one configuration rule of the engine adapters: a configuration error
fails at start with a clear message; only an unreachable pool means
misses.

Each reader takes a value as an engine's configuration hands it over
(JSON, YAML, a command line: numbers may arrive as int, float or a
numeric string, booleans as bool, 0/1 or "true"/"false") and returns it
checked, or raises ConfigError (a ValueError) naming the setting, the
value and what is allowed. Adapters call them in their constructors, so
the engine refuses to start rather than run with the cache off for ever.

Nothing here imports an engine or touches the network. Internal: the
names may change.
"""

import difflib
import ipaddress
import logging
import math
import re

DEFAULT_URL = "tcp://127.0.0.1:7470"
MAX_SECONDS = 4294967          # libkvpool takes durations as u32 milliseconds

log = logging.getLogger("kvpool.engines")

# What libkvpool's kvpool_connect accepts (client/kvpool.h): tcp://, auto://
# and rdma:// with a host (a name, IPv4, or [IPv6]) and a port, or a
# comma-separated node list of them; etcd://HOST[:PORT]/CLUSTER.
_NODE_SCHEMES = ("tcp", "auto", "rdma")
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")


class ConfigError(ValueError):
    """A setting of an engine adapter that cannot work (raised at start)."""


def _where(owner, name):
    return "%s: %s" % (owner, name) if owner else name


def _host_port(text, owner, name, whole, port_required):
    """Check "host[:port]" (host: a name, IPv4 or [IPv6])."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ConfigError("%s: %r: an IPv6 address needs its closing ']'"
                              % (_where(owner, name), whole))
        host, rest = text[1:end], text[end + 1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError("%s: %r: %r is not an IPv6 address"
                              % (_where(owner, name), whole, host)) from None
    else:
        host, sep, port = text.partition(":")
        rest = sep + port
        if not host or not _HOSTNAME.match(host):
            raise ConfigError("%s: %r: %r is not a host name or address"
                              % (_where(owner, name), whole, host))
    if not rest:
        if port_required:
            raise ConfigError("%s: %r: the port is missing (host:port)"
                              % (_where(owner, name), whole))
        return
    if not rest.startswith(":") or not rest[1:].isdigit() or \
            not 0 < int(rest[1:]) < 65536:
        raise ConfigError("%s: %r: %r is not a port (1..65535)"
                          % (_where(owner, name), whole, rest[1:]))


def url(value, owner="", name="url", default=DEFAULT_URL):
    """A kvpool URL as kvpool_connect takes it; None or "" gives `default`."""
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise ConfigError("%s must be a string like %r, not %s %r"
                          % (_where(owner, name), DEFAULT_URL, type(value).__name__, value))
    u = value.strip()
    scheme, sep, rest = u.partition("://")
    if not sep:
        raise ConfigError("%s: %r has no scheme: write tcp://host:port (or rdma://, auto://, "
                          "etcd://host:port/cluster)" % (_where(owner, name), value))
    if scheme == "etcd":
        hostport, slash, cluster = rest.partition("/")
        if not slash or not cluster or "/" in cluster:
            raise ConfigError("%s: %r: an etcd URL is etcd://HOST[:PORT]/CLUSTER"
                              % (_where(owner, name), value))
        _host_port(hostport, owner, name, value, False)
        return u
    if scheme not in _NODE_SCHEMES:
        raise ConfigError("%s: %r: the scheme must be tcp, auto, rdma or etcd"
                          % (_where(owner, name), value))
    for i, node in enumerate(rest.split(",")):
        node_scheme = scheme
        if i and "://" in node:
            node_scheme, _, node = node.partition("://")
            if node_scheme not in _NODE_SCHEMES:
                raise ConfigError("%s: %r: the scheme must be tcp, auto or rdma"
                                  % (_where(owner, name), value))
        if not node:
            raise ConfigError("%s: %r: an empty node in the list" % (_where(owner, name), value))
        _host_port(node, owner, name, value, node_scheme != "rdma")
    return u


def _number(value, owner, name):
    if isinstance(value, bool):
        raise ConfigError("%s must be a number, not a boolean (%r)" % (_where(owner, name), value))
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ConfigError("%s must be a number, not %s %r"
                      % (_where(owner, name), type(value).__name__, value))


def seconds(value, owner="", name="timeout_s", default=2.0, minimum=0.0, allow_zero=False,
            maximum=MAX_SECONDS):
    """A duration in seconds: a finite number > minimum (>= with allow_zero)
    and <= maximum (libkvpool's 4294967 s). Without allow_zero, at least
    0.001 s: libkvpool counts milliseconds, and a shorter one rounds to 0."""
    if value is None:
        return float(default)
    v = float(_number(value, owner, name))
    if not math.isfinite(v) or v < minimum or (v == minimum and not allow_zero):
        raise ConfigError("%s must be a number of seconds %s %g, not %r"
                          % (_where(owner, name), ">=" if allow_zero else ">", minimum, value))
    if v > maximum:
        raise ConfigError("%s must be at most %g s, not %r" % (_where(owner, name), maximum,
                                                                value))
    if not allow_zero and v < 0.001:
        raise ConfigError("%s must be at least 0.001 s (libkvpool counts milliseconds), not %r"
                          % (_where(owner, name), value))
    return v


def integer(value, owner="", name="", default=0, minimum=0, maximum=None):
    """A whole number in [minimum, maximum] (an integral float or numeric
    string is accepted: 30000.0, "64")."""
    if value is None:
        return int(default)
    v = _number(value, owner, name)
    if isinstance(v, float):
        if not math.isfinite(v) or v != int(v):
            raise ConfigError("%s must be a whole number, not %r" % (_where(owner, name), value))
        v = int(v)
    if v < minimum or (maximum is not None and v > maximum):
        raise ConfigError("%s must be %s, not %r" % (
            _where(owner, name), ">= %d" % minimum if maximum is None else
            "in %d..%d" % (minimum, maximum), value))
    return v


def milliseconds(value, owner="", name="lease_ms", default=5000):
    """A duration in whole milliseconds, 0..2^32-1 (the wire's u32)."""
    return integer(value, owner, name, default, 0, 0xFFFFFFFF)


def flag(value, owner="", name="", default=False):
    """A boolean: true/false, 1/0, or "true"/"false"/"yes"/"no"/"1"/"0"."""
    if value is None:
        return bool(default)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no",
                                                            "1", "0", "on", "off"):
        return value.strip().lower() in ("true", "yes", "1", "on")
    raise ConfigError("%s must be true or false, not %r" % (_where(owner, name), value))


def text(value, owner="", name="", default=None, allow_empty=False):
    """A string setting (a number is turned into its text). An empty string
    is refused unless allow_empty (then it gives `default`): "" where a
    name belongs is a mistake, not a request for the default."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError("%s must be a string, not %s %r"
                          % (_where(owner, name), type(value).__name__, value))
    s = str(value)
    if not s:
        if allow_empty:
            return default
        raise ConfigError("%s must not be empty (leave it out for the default%s)"
                          % (_where(owner, name), "" if default is None else
                             ", %r" % (default,)))
    return s


def token(value, owner="", name="token", token_file=None):
    """An auth token (str or bytes), or the stripped contents of token_file;
    None when neither is set. A number is refused: JSON and YAML read an
    unquoted all-digit token as one and drop leading zeros, so the
    message says to quote it."""
    if value is not None:
        if isinstance(value, bytes):
            return value.decode("utf-8", "strict")
        if isinstance(value, str):
            return value
        raise ConfigError("%s must be a string: quote it in the configuration (an unquoted "
                          "all-digit token reads as the number %r, and leading zeros are lost)"
                          % (_where(owner, name), value))
    if token_file is None or token_file == "":
        return None
    if not isinstance(token_file, str):
        raise ConfigError("%s must be a file name, not %r" % (_where(owner, "token_file"),
                                                              token_file))
    try:
        with open(token_file) as f:
            return f.read().strip()
    except OSError as e:
        raise ConfigError("%s: cannot read %s: %s" % (_where(owner, "token_file"), token_file,
                                                      e.strerror or e)) from None


def choice(value, owner="", name="", default=None, allowed=()):
    """One of `allowed` (strings)."""
    if value is None:
        return default
    if value not in allowed:
        raise ConfigError("%s must be one of %s, not %r"
                          % (_where(owner, name), ", ".join(map(repr, allowed)), value))
    return value


_WARNED_UNKNOWN = set()


def check_keys(settings, known, owner="", ignored=(), prefix=""):
    """Check the names of an adapter's settings (a dict) against `known`.
    A name close to a known one (a typo such as namespace_prefx) raises
    ConfigError naming both: a misspelt namespace_prefix would silently
    merge deployments. Any other unknown name is logged once as a warning
    and ignored. Names in `ignored` (the engine's own keys in a shared
    dictionary) pass. `prefix` is shown before each name in messages."""
    known = sorted(set(known))
    for key in settings:
        if key in known or key in ignored:
            continue
        name = str(key)
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if close:
            raise ConfigError("%s: unknown setting %s%s: did you mean %s%s?"
                              % (owner, prefix, name, prefix, close[0]))
        if (owner, name) not in _WARNED_UNKNOWN:
            _WARNED_UNKNOWN.add((owner, name))
            log.warning("%s: ignoring unknown setting %s%s (known: %s)", owner, prefix, name,
                        ", ".join(prefix + k for k in known))
