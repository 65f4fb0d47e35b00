"""docs/many-hosts.md's Sentinel group, run as the page writes it: its users.acl,
redis.conf and sentinel.conf on three hosts with Debian's ``redis-server`` and
``redis-sentinel``, spamnb's ``spamd.toml`` on two mail hosts, each started by the unit's
``ExecStart``, and its ``prometheus.yml`` with docs/admin.md's alerting rules, each block
read from the page and changed only by tests/docsnippets.py's ``SUBSTITUTE`` (the hosts
are 127.0.0.10, .11 and .12, free ports, a folder per host, generated passwords, a
throwaway CA's certificates).

The group is started and the page's spamnb user does everything spamnb does.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLE_MAILDIR
from docsnippets import FIRST, HOSTS, Site, files
from test_e2e import SPAMNB
from test_redis_store import OPENSSL, redis, sample_messages, server_certificate, throwaway_ca
from test_spamd import _read_all, request

sys.path.insert(0, str(ROOT))
try:
    from tools.harnesses.redis_sentinel import Group
    from tools.harnesses.redis_sentinel import wait as _wait
finally:
    sys.path.remove(str(ROOT))

REDIS_SERVER, REDIS_SENTINEL = shutil.which("redis-server"), shutil.which("redis-sentinel")
SPAMC = shutil.which("spamc")
pytestmark = pytest.mark.skipif(
    REDIS_SERVER is None or REDIS_SENTINEL is None or OPENSSL is None or redis is None,
    reason="redis-server, redis-sentinel, openssl or the redis package is missing (apt-get install redis-server "
           "redis-sentinel openssl; pip install 'spamnb[redis]')")

#: the page's mail hosts (its Prometheus scrapes these two)
MAIL_HOSTS = HOSTS[:2]
ACL = "/etc/redis/users.acl"
REDIS_CONF, SENTINEL_CONF = "/etc/redis/redis.conf", "/etc/redis/sentinel.conf"
SPAMD_TOML = "/etc/spamnb/spamd.toml"
DROP_IN = "/etc/systemd/system/spamnb-spamd.service.d/store.conf"
MODEL = "/var/lib/spamnb/model.joblib"


def documented_site(root: Path) -> Site:
    """Every file of the page on its hosts (under ``root``), with a CA of the test's: the
    servers' certificates for their addresses, the passwords' files, an empty data folder."""
    site = Site(root, SPAMNB)
    authority = root / "ca"
    authority.mkdir(parents=True)
    ca = throwaway_ca(authority, "ca").read_text()
    for n, host in enumerate(HOSTS):
        cert, key = server_certificate(authority, "ca", site.address(host), name=f"host{n}")
        site.write("/etc/redis/tls/server.crt", cert.read_text(), host)
        site.write("/etc/redis/tls/server.key", key.read_text(), host)
        site.write("/etc/redis/tls/ca.crt", ca, host)
        for path in (ACL, REDIS_CONF, SENTINEL_CONF):
            site.install(path, host)
        site.path("/var/lib/redis", host).mkdir(parents=True)
    for host in MAIL_HOSTS:
        site.write("/etc/spamnb/redis.pw", site.passwords["SPAMNB-PASSWORD"] + "\n", host)
        site.write("/etc/spamnb/sentinel.pw", site.passwords["SENTINEL-PASSWORD"] + "\n", host)
        site.write("/etc/spamnb/redis-ca.pem", ca, host, mode=0o644)
        site.install(SPAMD_TOML, host, mode=0o644)
        site.install(DROP_IN, host, mode=0o644)
        home = site.path("/var/lib/spamnb", host)  # the spamnb user's home (the shipped unit's comment)
        home.mkdir(parents=True, exist_ok=True)
        home.chmod(0o700)
    return site


#: what Debian's redis-server.service and redis-sentinel.service add to the file they start
DEBIAN_UNIT_ARGS = ("--supervised", "systemd", "--daemonize", "no")


def start_group(site: Site) -> Group:
    """The page's three servers (192.0.2.10 the primary) and three Sentinels, each from its file
    as Debian's units start it; the harness logs in as the page's spamnb user and with the
    Sentinels' password."""
    return Group.from_files(
        site.root,
        [((site.address(h), site.port(6379)), site.path(REDIS_CONF, h)) for h in HOSTS],
        [((site.address(h), site.port(26379)), site.path(SENTINEL_CONF, h)) for h in HOSTS],
        user="spamnb", password=site.passwords["SPAMNB-PASSWORD"],
        sentinel_password=site.passwords["SENTINEL-PASSWORD"], ca=site.path("/etc/redis/tls/ca.crt"),
        args=DEBIAN_UNIT_ARGS)


def host_env(site: Site, host: str) -> dict:
    """A mail host's environment for spamnb: the spamnb user's home, that host's system file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "SPAMNB_"))}
    env.update(HOME=str(site.path("/var/lib/spamnb", host)),
               SPAMNB_SYSTEM_CONFIG=str(site.path("/etc/spamnb/spamnb.toml", host)))
    return env


def on(site: Site, host: str, *args, input=None) -> subprocess.CompletedProcess:
    """``spamnb ARGS`` run on the mail host ``host``."""
    return subprocess.run(SPAMNB + [str(a) for a in args], input=input, capture_output=True, timeout=120,
                          env=host_env(site, host))


def store_url(site: Site, host: str = FIRST) -> str:
    """The store URL of ``host``'s spamd.toml, as that file says it."""
    import tomllib

    return tomllib.loads(site.path(SPAMD_TOML, host).read_text())["store"]["url"]


def page_command(site: Site, starts: str, host: str = FIRST) -> list[str]:
    """The one command line of the page's blocks that begins with ``starts``, as on ``host``."""
    from docsnippets import MANY_HOSTS, blocks

    found = [line for _, text in blocks(MANY_HOSTS) for line in text.splitlines() if line.startswith(starts)
             and "sentinel://" in line]
    assert len(found) == 1, found
    return site.command(found[0], host)


class MailHost:
    """``spamnb serve`` on the page's mail host ``host``: the drop-in's ``ExecStart``, run as
    systemd would (its RuntimeDirectory made, UMask 0077), its log in a file."""

    def __init__(self, site: Site, host: str, ready=True):
        self.name = host
        unit = site.path(DROP_IN, host).read_text()
        starts = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart=")]
        assert len(starts) == 2 and starts[0] == "", unit  # the shipped unit's command set aside, then this one
        argv = shlex.split(starts[1])
        assert argv[:len(SPAMNB)] == SPAMNB, argv
        rundir = site.path("/run/spamnb-spamd", host)  # the shipped unit's RuntimeDirectory, mode 0700
        rundir.mkdir(parents=True, exist_ok=True)
        rundir.chmod(0o700)
        self.host, self.port = site.address(host), site.port(783)
        self.metrics = f"{site.address(host)}:{site.port(9783)}"
        self.log_path = site.root / f"serve-{host}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=host_env(site, host),
                                         preexec_fn=lambda: os.umask(0o077))
        if ready:
            self.ready()

    def ready(self):
        """Wait until it answers spamd's PING."""
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.log()
            try:
                if self.ask(request("PING")) == b"SPAMD/1.5 0 PONG\r\n":
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.1)

    def ask(self, data: bytes) -> bytes:
        with socket.create_connection((self.host, self.port), timeout=30) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            return _read_all(s)

    def log(self) -> str:
        return self.log_path.read_text("utf-8", "replace")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        return self.log()


@pytest.fixture(scope="module")
def documented(tmp_path_factory, trained_model_file):
    """The page's group, started, and its model pushed by the page's own ``store push`` line."""
    site = documented_site(tmp_path_factory.mktemp("site"))
    group = start_group(site)
    try:
        shutil.copyfile(trained_model_file, site.path(MODEL))
        push = page_command(site, "spamnb store push")
        r = subprocess.run(push, capture_output=True, timeout=120, env=host_env(site, FIRST))
        assert r.returncode == 0 and b"pushed" in r.stderr, r.stderr
        yield site, group
    finally:
        group.stop()


# -- the group --------------------------------------------------------------------------------------


def test_the_pages_files_are_all_there():
    assert {ACL, REDIS_CONF, SENTINEL_CONF, SPAMD_TOML, DROP_IN, "/etc/prometheus/prometheus.yml"} <= set(files())
    users = [line.split()[1] for line in files()[ACL].splitlines()]
    assert users == ["default", "spamnb", "replication", "sentinel"]
    assert "sentinel auth-user spamnb sentinel" in files()[SENTINEL_CONF]


def test_the_sentinels_see_the_replicas_and_each_other(documented):
    """Each Sentinel logs in to the servers as the page's Sentinel user: it sees the primary
    up, both replicas (found through the primary) and the two other Sentinels; the replicas
    replicate as the replication user, and hold what was pushed."""
    site, group = documented
    for address in group.sentinels:
        master = group.connect(address, True).sentinel_master("spamnb")
        assert (master["ip"], master["port"]) == group.servers[0]
        assert master["flags"] == "master" and master["num-slaves"] == 2 and master["num-other-sentinels"] == 2, master
        replicas = group.connect(address, True).sentinel_slaves("spamnb")
        assert sorted((r["ip"], r["port"], r["flags"]) for r in replicas) == \
            sorted((h, p, "slave") for h, p in group.servers[1:])
    for address in group.servers[1:]:
        client = group.connect(address)
        assert client.info("replication")["master_link_status"] == "up"
        assert client.hexists("spamnb:meta", "epoch")  # the push, replicated
    # Redis' default user is off: a client without the user is refused
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    anonymous = redis.Redis(host=group.servers[0][0], port=group.servers[0][1], ssl=True, retry=Retry(NoBackoff(), 0),
                            ssl_ca_certs=str(group.ca), password=site.passwords["SPAMNB-PASSWORD"], socket_timeout=2)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()


UNSURE = (b"From: u@example.org\nTo: me@example.org\nSubject: which one\nMessage-ID: <docs-u1@ex>\n\n"
          b"cheap pills meeting agenda lunch tomorrow\n")


def test_the_pages_spamnb_user_does_everything_spamnb_does(documented, tmp_path):
    """As the page's ACL user, through the page's TOML: two mail hosts started by the unit
    scan (on the replicas) and record their verdicts in the store's history, a TELL learns;
    on a host, classify, learn, forget, cutoffs, info, pull and prune; ``spamnb web --store``
    learns a correction on its page (a redirect, not a 500), once, and marks its row."""
    from spamnb.storage import history as sqlhist
    from spamnb.storage.redishistory import RedisHistory
    from spamnb.storage.where import open_backend
    from test_web import csrf_of
    from webpage import Web

    site, group = documented
    url = store_url(site)
    backend = open_backend(None, url)
    hist = RedisHistory(backend)
    before = hist.count()
    raws = sample_messages()
    hosts = [MailHost(site, h, ready=False) for h in MAIL_HOSTS]  # both starting at once
    try:
        for host in hosts:
            host.ready()
        for host, raw in zip(hosts, raws[:2]):
            reply = host.ask(request("CHECK", raw))
            assert reply.startswith(b"SPAMD/1.1 0 EX_OK") and b"Spam: " in reply, (reply, host.log())
        _wait("both verdicts in the store's history", lambda: hist.count() == before + 2, 20)
        reply = hosts[1].ask(request("TELL", raws[2], Message_class="spam", Set="local"))
        assert reply.startswith(b"SPAMD/1.1 0 EX_OK") and b"DidSet: local" in reply, (reply, hosts[1].log())
    finally:
        logs = [h.stop() for h in hosts]
    assert all("Traceback" not in log and "NOPERM" not in log for log in logs), logs

    config = ["--config", site.path(SPAMD_TOML)]
    message = tmp_path / "m.eml"
    message.write_bytes(raws[3])

    def teach():  # one message learned, forgotten and learned again, its history marked each time
        return [on(site, FIRST, *config, *args, message)
                for args in (["learn", "--spam"], ["forget", "--spam"], ["learn", "--ham"])]
    with ThreadPoolExecutor(3) as pool:  # each command a process, most of it starting up: side by side
        taught = pool.submit(teach)
        others = [pool.submit(on, site, FIRST, *args) for args in (
            [*config, "classify", "--format", "jsonl", SAMPLE_MAILDIR], [*config, "cutoffs", "--spam-cutoff", "0.9"],
            [*config, "info"], ["store", "pull", url, tmp_path / "pulled.joblib"])]
    for r in taught.result():
        assert r.returncode == 0 and b"history" not in r.stderr, (r.args, r.stderr)
    for r in (f.result() for f in others):
        assert r.returncode == 0, (r.args, r.stderr)
    assert len(others[0].result().stdout.splitlines()) >= 10 and (tmp_path / "pulled.joblib").exists()

    hist.write([sqlhist.row(UNSURE, "unsure", 0.2, 0.55, via="spamd")])
    unsure = hist.ids(stop=0)[0]
    counts = tuple(int(n) for n in backend.model().messages)
    web = Web(None, None, where=["--store", url])
    try:
        _, _, page = web.get("/unsure")
        status, _, text = web.get("/learn", data=f"id={unsure}&label=spam&csrf={csrf_of(page)}&back=/unsure"
                                  .encode())
        assert status == 303, text
        _, _, page = web.get("/history")
        assert f"Learned #{unsure} as spam." in page and "not marked" not in page
    finally:
        web.stop()
    assert "Traceback" not in web.log
    assert tuple(int(n) for n in backend.model().messages) == (counts[0], counts[1] + 1)  # learned once
    assert hist.rows([unsure])[0]["corrected"] == "spam" and hist.count("queue") == 0

    r = on(site, FIRST, *config, "prune", "--older-than", "0")
    assert r.returncode == 0, r.stderr
    # and the user is bound to its prefix
    r = on(site, FIRST, "info", "--store", url.replace("prefix=spamnb:", "prefix=other:"))
    assert r.returncode == 1 and b"Traceback" not in r.stderr and b"permission" in r.stderr.lower(), r.stderr

