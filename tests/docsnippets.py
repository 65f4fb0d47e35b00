"""The set-up docs/many-hosts.md and docs/admin.md give, read from the pages: each block
that is a file by its path, and :data:`SUBSTITUTE`, the one table of what a test machine
cannot have as the pages write it. Everything else in a block is run as written, so a
block changed on the page changes what the tests run.

A block is a file when its fence names the path after the language (```` ```text
/etc/redis/users.acl ````: an ACL file takes no comments) or when its first line does
(``# /etc/redis/redis.conf on each server, ...``). The files are written as on the first
host, 192.0.2.10; for the others the page says what changes, and :meth:`Site.text` does
that: the host's own address in the lines that name this host (``bind``,
``bind-source-addr``, ``listen``), and ``replicaof`` uncommented in ``redis.conf``.
"""

from __future__ import annotations

import re
import secrets
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANY_HOSTS = ROOT / "docs" / "many-hosts.md"
ADMIN = ROOT / "docs" / "admin.md"

#: What a test machine cannot have as the pages write it, and what the tests put instead.
SUBSTITUTE = {
    # the hosts: all of 127.0.0.0/8 is loopback on Linux, so three addresses need no set-up
    "addresses": {"192.0.2.10": "127.0.0.10", "192.0.2.11": "127.0.0.11", "192.0.2.12": "127.0.0.12",
                  "192.0.2.0/24": "127.0.0.0/8",
                  # "Setting it up"'s one server, by a name no test machine resolves: set up as
                  # the group's first server is, so at its address
                  "store.example": "127.0.0.10"},
    # each a free port, the same on every host (as the page has them); 11332: admin.md's milter
    "ports": (6379, 26379, 783, 9783, 11332),
    # each host's own folders: under a folder of the test's for that host
    "folders": ("/etc/", "/var/lib/", "/run/"),
    # each a password generated for the run
    "passwords": ("SPAMNB-PASSWORD", "REPLICATION-PASSWORD", "SENTINEL-USER-PASSWORD", "SENTINEL-PASSWORD"),
    # the program (a unit's path, a command line's first word): the spamnb under test
    "programs": ("/usr/local/bin/spamnb", "spamnb"),
}
HOSTS = ("192.0.2.10", "192.0.2.11", "192.0.2.12")
FIRST = HOSTS[0]

FENCE = re.compile(r"^```([^`\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
PER_HOST = re.compile(r"^(bind |bind-source-addr |listen = ).*$", re.M)


def blocks(page: Path, language=None, heading=None) -> list[tuple[str, str]]:
    """``(info string, text)`` of each fenced block of ``page`` (of ``language`` only, when
    given; under ``heading`` only, when given: :func:`section`)."""
    text = page.read_text(encoding="utf-8") if heading is None else section(page, heading)
    found = [(info.strip(), text) for info, text in FENCE.findall(text)]
    return [(info, text) for info, text in found if language is None or info.split()[:1] == [language]]


def section(page: Path, heading: str) -> str:
    """The text of ``page`` under ``heading`` (a whole heading line, ``## Setting it up``), to
    the next heading of its level or above; a block's ``# comment`` lines are not headings."""
    level = len(heading) - len(heading.lstrip("#"))
    lines, out, fenced, inside = page.read_text(encoding="utf-8").splitlines(keepends=True), [], False, False
    for text in lines:
        if text.startswith("```"):
            fenced = not fenced
        elif not fenced and text.startswith("#"):
            depth = len(text) - len(text.lstrip("#"))
            if text.rstrip() == heading:
                assert not inside, f"{page.name} has the heading {heading!r} twice"
                inside = True
                continue
            if inside and depth <= level:
                break
        if inside:
            out.append(text)
    assert inside, f"{page.name} has no heading {heading!r}"
    return "".join(out)


def commands(block: str) -> list[str]:
    """The command lines of a block, as a shell reads them: comments and empty lines left
    out, a line ending in ``\\`` joined to the next."""
    joined = re.sub(r"[ \t]*\\\n\s*", " ", block)
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def line(page: Path, start: str) -> str:
    """The one line of ``page``'s blocks that starts with ``start`` (admin.md's Sendmail
    ``INPUT_MAIL_FILTER(``), as written."""
    found = [ln for _, text in blocks(page) for ln in text.splitlines() if ln.startswith(start)]
    assert len(found) == 1, f"{page.name} has {len(found)} lines starting with {start!r} in its blocks"
    return found[0]


def files(page: Path = MANY_HOSTS) -> dict[str, str]:
    """The blocks of ``page`` that are a file, by the file's path."""
    out = {}
    for info, text in blocks(page):
        words = info.split()
        if len(words) > 1 and words[1].startswith("/"):
            path = words[1]
        else:
            first = re.match(r"# (/\S+)", text)
            if first is None:
                continue
            path = first.group(1).rstrip(":,")
        assert path not in out, f"{page.name} gives {path} twice"
        out[path] = text
    return out


def acl(user: str) -> list[str]:
    """The rules of ``user`` in docs/many-hosts.md's ``/etc/redis/users.acl`` (the words after
    ``user NAME``: what ``ACL SETUSER NAME`` takes)."""
    for line in files()["/etc/redis/users.acl"].splitlines():
        words = line.split()
        if words[:2] == ["user", user]:
            return words[2:]
    raise AssertionError(f"docs/many-hosts.md's users.acl has no user {user}")


def free_ports(n: int) -> list[int]:
    import sys

    sys.path.insert(0, str(ROOT))
    try:
        from tools.harnesses.redis_sentinel import distinct_ports
    finally:
        sys.path.remove(str(ROOT))
    return distinct_ports(n)


class Site:
    """One run's substitutions (:data:`SUBSTITUTE`): its free ports, its passwords, a folder
    for each host under ``root``, and the spamnb command in place of the program's path."""

    def __init__(self, root: Path, spamnb: list[str]):
        self.root = root
        self.spamnb = spamnb
        self.ports = dict(zip(SUBSTITUTE["ports"], free_ports(len(SUBSTITUTE["ports"]))))
        self.passwords = {name: secrets.token_hex(16) for name in SUBSTITUTE["passwords"]}

    def folder(self, host: str) -> Path:
        """The folder of ``host`` (an address as the page writes it, or a name of the test's)."""
        return self.root / host.rsplit(".", 1)[-1]

    def address(self, host: str) -> str:
        return SUBSTITUTE["addresses"][host]

    def port(self, port: int) -> int:
        return self.ports[port]

    def text(self, text: str, host: str = FIRST) -> str:
        """``text`` (a block as the page writes it, for the first host) as on ``host``."""
        if host != FIRST and host in HOSTS:  # the page's own per-host changes
            text = PER_HOST.sub(lambda m: m.group(0).replace(FIRST, host), text)
            text = re.sub(r"^# (replicaof .*)$", r"\1", text, flags=re.M)
        ports = "|".join(str(p) for p in self.ports)
        text = re.sub(rf"(?<![\w.])({ports})(?![\w.])", lambda m: str(self.ports[int(m.group(1))]), text)
        for name in sorted(self.passwords, key=len, reverse=True):  # SENTINEL-USER-PASSWORD before SENTINEL-...
            text = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", self.passwords[name], text)
        for page, ours in sorted(SUBSTITUTE["addresses"].items(), key=lambda kv: -len(kv[0])):
            text = re.sub(rf"(?<![\w.]){re.escape(page)}(?![\w.])", ours, text)
        folder = self.folder(host)
        roots = "|".join(re.escape(f.strip("/")) for f in SUBSTITUTE["folders"])
        text = re.sub(rf"(?<![\w./-])/({roots})/", lambda m: f"{folder}/{m.group(1)}/", text)
        return text.replace(SUBSTITUTE["programs"][0], shlex.join(self.spamnb))

    def command(self, line: str, host: str = FIRST, home: Path | None = None) -> list[str]:
        """A command line of the page (``spamnb ...``), as run on ``host``; a word that starts
        with ``~/`` is under ``home``, as the shell expands it for the user of that home."""
        argv = shlex.split(self.text(line, host))
        if home is not None:
            argv = [f"{home}{word[1:]}" if word.startswith("~/") else word for word in argv]
        return self.spamnb + argv[1:] if argv[:1] == ["spamnb"] else argv

    def path(self, path: str, host: str = FIRST) -> Path:
        """Where the page's file ``path`` is on ``host``."""
        return Path(self.text(path, host))

    def write(self, path: str, text: str, host: str = FIRST, mode=0o600) -> Path:
        """The page's file ``path`` on ``host``, holding ``text`` (written as given)."""
        where = self.path(path, host)
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(text)
        where.chmod(mode)
        return where

    def install(self, path: str, host: str = FIRST, mode=0o600, page: Path = MANY_HOSTS) -> Path:
        """The block of ``page`` that is the file ``path``, substituted for ``host``, written there."""
        return self.write(path, self.text(files(page)[path], host), host, mode)
