"""The README and the docs: a short README, a page per topic, and no broken link.

Relative links must name a file or folder that exists and, for a markdown page, a
heading it has (GitHub's anchors: lower case, punctuation dropped, spaces as
hyphens, -1, -2 ... for repeats).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import docsnippets
from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "tools").rglob("README.md")),
         ROOT / "corpora" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text):
    """The text outside fenced code blocks and inline code, where a link is a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading):
    heading = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for line in re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M).splitlines():
        m = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if m:
            a = slug(m.group(1))
            out.add(a if a not in seen else f"{a}-{seen[a]}")
            seen[a] = seen.get(a, 0) + 1
    return out


def test_github_anchors():
    assert slug("procmail (`~/.procmailrc`)") == "procmail-procmailrc"
    assert slug("Scale: training on every core, and on a cluster") == "scale-training-on-every-core-and-on-a-cluster"
    assert slug("The first day: a model trained on other people's mail") == \
        "the-first-day-a-model-trained-on-other-peoples-mail"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)}: broken links"


def test_the_readme_is_short_and_maps_every_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, f"the README's map of the docs misses docs/{page.name}"
    # the two commands, and the quick starts a newcomer looks for
    for needle in ("bash scripts/main.sh", "bash scripts/test.sh", "```procmail", "spamnb imap filter",
                   "spamnb serve --spamd", "content_filter=spamnb", "man -l man/"):
        assert needle in readme


def test_each_docs_page_has_one_title():
    for page in sorted((ROOT / "docs").glob("*.md")):
        titles = [line for line in prose(page.read_text(encoding="utf-8")).splitlines() if line.startswith("# ")]
        assert len(titles) == 1, f"docs/{page.name}: {titles}"


def test_the_documented_acl_user_may_run_every_redis_command_spamnb_sends():
    """The spamnb user of docs/many-hosts.md's ``/etc/redis/users.acl`` grants every command the
    store's code sends (redis-py's calls and the Lua scripts' ``redis.call``), and MULTI only if
    something sends it (redis-py's ``pipeline(transaction=True)``): an ACL missing one refuses it
    at run time."""
    granted = {w[1:].lower() for w in docsnippets.acl("spamnb") if w[:1] == "+"}
    source = "".join(p.read_text() for p in (ROOT / "spamnb" / "storage").glob("redis*.py"))
    sent = {c.lower() for c in re.findall(r"redis\.call\('([A-Z]+)'", source)}
    sent |= set(re.findall(r"\b(?:pipe|client)\.(h[a-z]+|z[a-z]+|expire|incr|type|unlink|ping|info|evalsha|eval|"
                           r"get|set|delete|exists|keys|scan)\(", source))
    sent |= {c.lower() for c in re.findall(r"execute_command(?:, |\()\"([A-Z]+)\"", source)}
    sent |= {c for c in re.findall(r"client\.([a-z]+), ", source) if c not in ("pipeline",)}
    sent |= {"script|load"} if "script_load(" in source else set()
    sent |= {"multi", "exec"} if "transaction=True" in source else set()
    sent -= {"sentinel"}  # asked of the Sentinels (the site page), which have their own password, not of the servers
    assert sent >= {"evalsha", "hset", "zrem", "wait", "incr", "type"}, sent  # the search finds what it should
    assert sent - granted == set(), f"docs/many-hosts.md's ACL lacks {sorted(sent - granted)}"


# -- the set-up the pages give: run as written (tests/docsnippets.py) ------------------------------------

STORE_URL = re.compile(r"\b(?:rediss?|unix|rediss?\+sentinel)://[^\s'\"`]+")


def test_every_store_url_the_pages_give_with_a_password_names_its_user():
    """A URL with ``password_file=`` and no ``USER@`` logs in as Redis' ``default`` user, which
    the pages' set-up turns off: every one in their blocks names the ACL user."""
    found = []
    for page in (docsnippets.MANY_HOSTS, docsnippets.ADMIN):
        for _, text in docsnippets.blocks(page):
            found += [url for url in STORE_URL.findall(text) if "password_file=" in url
                      and "[USER@]" not in url]  # a URL's form, not an example
    assert len(found) >= 4
    assert [url for url in found if not re.match(r"[a-z+]+://[A-Za-z_-]+@", url)] == []


def test_the_page_says_which_blocks_the_tests_run_and_what_they_substitute():
    text = " ".join(docsnippets.MANY_HOSTS.read_text().split())
    said = text[text.index("`tests/test_many_hosts.py` reads these blocks"):].split("\n\n")[0]
    assert "`SUBSTITUTE` in `tests/docsnippets.py`" in said
    for port in docsnippets.SUBSTITUTE["ports"]:
        assert str(port) in said
    for page, ours in docsnippets.SUBSTITUTE["addresses"].items():
        assert ours.rsplit(".", 1)[-1] in said
    for folder in docsnippets.SUBSTITUTE["folders"]:
        assert f"`{folder.rstrip('/')}`" in said


def page_toml_files(site, page):
    """Each TOML block of ``page`` as written on the first host (its paths, ports, passwords
    substituted), in a file; with what the blocks name made as the page says to make it."""
    for name in ("redis.pw", "sentinel.pw"):
        site.write(f"/etc/spamnb/{name}", "a-password\n")
    site.write("/etc/spamnb/redis-ca.pem", "", mode=0o644)
    out = []
    for n, (_, text) in enumerate(docsnippets.blocks(page, "toml")):
        path = site.root / f"{page.stem}-{n}.toml"
        path.write_text(site.text(text))
        path.chmod(0o644)
        out.append(path)
    return out


@pytest.mark.parametrize("page", [docsnippets.MANY_HOSTS, docsnippets.ADMIN], ids=lambda p: p.name)
def test_every_toml_block_passes_config_check(page, tmp_path):
    """Every TOML block of the page, as written (a folder of the test's for ``/etc``, ``/var/lib``
    and ``/run``, free ports), is read by spamnb's configuration reader and passes ``config --check``."""
    from test_e2e import SPAMNB

    site = docsnippets.Site(tmp_path, SPAMNB)
    site.path("/var/lib/spamnb/users").mkdir(parents=True)  # admin.md's user_models folder
    for path in page_toml_files(site, page):
        r = subprocess.run(SPAMNB + ["config", "--check", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stderr == "", (path.read_text(), r.stdout, r.stderr)


def test_admin_pages_files_serve_as_written(tmp_path, trained_model_file):
    """docs/admin.md's files on one host: the system file, the service's own (started by the
    ``ExecStart=`` its first line gives) and alice's; the server answers spamc's CHECK with the
    site's decision, and alice's with hers."""
    import os
    import shlex
    import shutil
    import socket
    import time

    from conftest import sample_message
    from spamnb.delivery import events
    from test_e2e import SPAMNB
    from test_spamd import _read_all, request

    site = docsnippets.Site(tmp_path, SPAMNB)
    admin = docsnippets.files(docsnippets.ADMIN)
    for path in admin:
        site.install(path, mode=0o644, page=docsnippets.ADMIN)
    model = site.path("/var/lib/spamnb/model.joblib")
    shutil.copyfile(trained_model_file, model)
    rundir = site.path("/run/spamnb-spamd")  # the unit's RuntimeDirectory, 0700
    rundir.mkdir(parents=True)
    rundir.chmod(0o700)
    first = admin["/etc/spamnb/spamd.toml"].splitlines()[0]
    argv = shlex.split(site.text(first.split("ExecStart=", 1)[1]))
    assert argv[:len(SPAMNB)] == SPAMNB and argv[-1] == "serve", argv
    env = {**os.environ, "SPAMNB_SYSTEM_CONFIG": str(site.path("/etc/spamnb/spamnb.toml"))}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out, env=env)
    port = site.port(783)

    def check(user):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(request("CHECK", raw, User=user))
            s.shutdown(socket.SHUT_WR)
            return _read_all(s)

    raw = sample_message("spam", 1).read_bytes()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                reply = check("bob")
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        assert reply.startswith(b"SPAMD/1.1 0 EX_OK"), reply
        assert check("alice").startswith(b"SPAMD/1.1 0 EX_OK")
    finally:
        proc.terminate()
        proc.wait(20)
    cutoffs = {ev["user"]: ev["cutoff"] for line in log.read_text().splitlines() if (ev := events.parse(line))
               and ev.get("event") == "message"}
    assert cutoffs["bob"].endswith("/0.99") and cutoffs["alice"].endswith("/0.9"), cutoffs  # the site's; hers
