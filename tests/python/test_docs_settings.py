"""docs/configuration.md lists every setting kvpoold has (issue 28 item 7:
the cluster settings were missing): each key `kvpoold --help` prints must
appear in the page as `key`."""

import os
import re
import subprocess

from conftest import ROOT, Server


def test_configuration_page_lists_every_setting():
    out = subprocess.run([Server().binary, "--help"], capture_output=True, text=True,
                         timeout=30).stdout
    keys = [f.replace("-", "_") for f in re.findall(r"^  --([a-z0-9-]+) [A-Z]", out, re.M)
            if f != "config"]  # the INI file itself, described above the table
    assert len(keys) > 30, out
    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        page = f.read()
    missing = [k for k in keys if "`%s`" % k not in page]
    assert not missing, "docs/configuration.md does not list: %s" % ", ".join(missing)
