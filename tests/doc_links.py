#!/usr/bin/python3
"""doc_links.py - check the relative links of Markdown files.

Usage: doc_links.py FILE.md...  Every link [text](target) outside code
blocks whose target is not a URL must name a file that exists, relative to
the file that links to it, and a #fragment into a .md file must be one of
its headings (GitHub's anchors: lower case, punctuation dropped, spaces to
dashes). Prints one line per broken link; exit 1 when there is one.
Run by tests/readme_test.sh.
"""
import os
import re
import sys


def anchors(path):
    out = set()
    with open(path) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    for line in text.split("\n"):
        m = re.match(r"^#+\s+(.*)", line)
        if m:
            title = m.group(1).strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def main(docs):
    bad = []
    for doc in docs:
        with open(doc) as f:
            text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, frag = target.partition("#")
            if path:
                full = os.path.normpath(os.path.join(os.path.dirname(doc), path))
            else:
                full = doc
            if not os.path.exists(full):
                bad.append("%s: %s: no such file" % (doc, target))
            elif frag and full.endswith(".md") and frag not in anchors(full):
                bad.append("%s: %s: no such heading" % (doc, target))
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
