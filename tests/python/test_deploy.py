"""Deployment files: the compose demo, which runs kvpoold without tokens,
publishes its ports on the host's loopback only (issue 20 item 7)."""

import os
import re

from conftest import ROOT


def published_ports(text):
    """The entries of every 'ports:' list of a compose file."""
    out, in_ports, indent = [], False, 0
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        lead = len(line) - len(line.lstrip())
        if stripped == "ports:":
            in_ports, indent = True, lead
            continue
        if in_ports and lead > indent and stripped.startswith("-"):
            m = re.match(r'-\s*"?([^"#\s]+)"?', stripped)
            out.append(m.group(1))
            continue
        in_ports = False
    return out


def test_compose_binds_loopback():
    with open(os.path.join(ROOT, "docker", "compose.yaml")) as f:
        text = f.read()
    ports = published_ports(text)
    assert ports, "no published ports found"
    for p in ports:
        assert p.startswith("127.0.0.1:"), "port %s is published on every interface" % p
    assert 'KVPOOL_ALLOW_UNAUTHENTICATED: "true"' in text
