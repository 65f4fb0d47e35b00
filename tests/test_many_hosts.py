"""docs/many-hosts.md's Sentinel group, run as the page writes it: its users.acl,
redis.conf and sentinel.conf on three hosts with Debian's ``redis-server`` and
``redis-sentinel``, spamnb's ``spamd.toml`` on two mail hosts, each started by the unit's
``ExecStart``, and its ``prometheus.yml`` with docs/admin.md's alerting rules, each block
read from the page and changed only by tests/docsnippets.py's ``SUBSTITUTE`` (the hosts
are 127.0.0.10, .11 and .12, free ports, a folder per host, generated passwords, a
throwaway CA's certificates).

The default run starts the group and has the page's spamnb user do everything spamnb
does, and runs the page's "Setting it up" (its two commands) against one server of the
group without its replicas' lines; the slow one kills the primary under load and then
the whole group, watched by a real Prometheus.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLE_MAILDIR, filter_message, gold_labels
from docsnippets import FIRST, HOSTS, MANY_HOSTS, Site, blocks, commands, files, section
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
        self.metrics = f"{site.address(host)}:{site.port(9783)}"
        self._start(argv, host_env(site, host), site.address(host), site.port(783), site.root / f"serve-{host}.log",
                    umask=0o077, ready=ready)

    @classmethod
    def command(cls, argv: list[str], env: dict, port: int, log_path: Path) -> MailHost:
        """A command of the page (``spamnb serve --spamd ...``) as a shell runs it, its spamd
        to answer on ``port`` of this host (:meth:`ready` waits for it)."""
        self = cls.__new__(cls)
        self.name = "127.0.0.1"
        self._start(argv, env, "127.0.0.1", port, log_path, ready=False)
        return self

    def _start(self, argv, env, host, port, log_path, umask=None, ready=True):
        self.host, self.port, self.log_path = host, port, log_path
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=env,
                                         preexec_fn=None if umask is None else lambda: os.umask(umask))
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
        assert "Learned as spam: " in page and "not marked" not in page
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


# -- one server: "Setting it up" -------------------------------------------------------------------

SETTING_UP = "## Setting it up"


def single_server_conf() -> str:
    """The group's redis.conf as the page has a server without replicas use it: without the
    lines the paragraph after its commands names (``masteruser``, ..., ``replicaof``, read
    from it), commented or not; every other line as written."""
    words = " ".join(section(MANY_HOSTS, SETTING_UP).split())
    said = re.search(r"its `redis\.conf` without the lines for replicas: ([^)]*)\)", words)
    assert said, "the page no longer says which lines of redis.conf a server without replicas leaves out"
    names = set(re.findall(r"`([\w-]+)`", said.group(1)))
    kept, dropped = [], set()
    for text in files()[REDIS_CONF].splitlines(keepends=True):
        directive = text.removeprefix("# ").split(None, 1)[:1]
        if directive and directive[0] in names:
            dropped.add(directive[0])
        else:
            kept.append(text)
    assert dropped == names, f"redis.conf has no line for {sorted(names - dropped)}"
    return "".join(kept)


def spam_and_ham(model) -> tuple[bytes, bytes]:
    """A spam and a ham of the sample maildir that ``model`` files by their gold label and
    has not learned."""
    from spamnb.mail.identity import message_key

    gold, found = gold_labels(), {}
    for path in sorted((SAMPLE_MAILDIR / "cur").iterdir()):
        raw = path.read_bytes()
        if gold[path.name] not in found and message_key(raw) not in model.registry \
                and filter_message(model, raw, "m")[1] == gold[path.name]:
            found[gold[path.name]] = raw
        if len(found) == 2:
            return found["spam"], found["ham"]
    raise AssertionError(f"the model files no sample message of each class as its gold label: {sorted(found)}")


@pytest.mark.skipif(SPAMC is None, reason="spamc is not installed (apt-get install spamc)")
def test_setting_it_up_as_the_page_writes_it(tmp_path, trained_model, trained_model_file):
    """The page's "Setting it up": one TLS redis-server from the page's users.acl and its redis.conf
    without the replicas' lines, the page's ``store push`` of the admin's model and its
    ``serve --spamd`` command, both as written (changed only by ``SUBSTITUTE``); ``spamc``
    has a spam and a ham filed as such, and a ``TELL`` (``spamc -L``, ``--allow-tell-served``)
    teaches the store's model: ``spamnb info --store URL`` counts one message more."""
    _, block = blocks(MANY_HOSTS, heading=SETTING_UP)[0]
    push_line, serve_line = commands(block)
    assert push_line.startswith("spamnb store push ") and serve_line.startswith("spamnb serve --spamd "), block
    spam, ham = spam_and_ham(trained_model)
    site = Site(tmp_path / "site", SPAMNB)
    authority = tmp_path / "ca"
    authority.mkdir()
    ca = throwaway_ca(authority, "ca").read_text()
    cert, key = server_certificate(authority, "ca", site.address(FIRST))
    site.write("/etc/redis/tls/server.crt", cert.read_text())
    site.write("/etc/redis/tls/server.key", key.read_text())
    site.write("/etc/redis/tls/ca.crt", ca)
    site.install(ACL)
    site.write(REDIS_CONF, site.text(single_server_conf()))
    site.path("/var/lib/redis").mkdir(parents=True)
    site.write("/etc/spamnb/redis.pw", site.passwords["SPAMNB-PASSWORD"] + "\n")
    site.write("/etc/spamnb/redis-ca.pem", ca, mode=0o644)

    env = host_env(site, FIRST)  # the admin's home, its session's runtime folder (serve's own socket)
    home = Path(env["HOME"])
    env["XDG_RUNTIME_DIR"] = str(site.root / "xdg-runtime")
    Path(env["XDG_RUNTIME_DIR"]).mkdir(mode=0o700)
    model = home / ".local" / "share" / "spamnb" / "model.joblib"
    model.parent.mkdir(parents=True)
    shutil.copyfile(trained_model_file, model)
    push, serve = site.command(push_line, home=home), site.command(serve_line, home=home)
    url = serve[serve.index("--store") + 1]
    assert str(model) in push and url in push, push  # the model the page pushes, to the store it serves

    def messages() -> tuple[int, int]:  # (ham, spam), as spamnb info --store URL says them
        r = subprocess.run(SPAMNB + ["info", "--store", url], capture_output=True, text=True, timeout=60, env=env)
        said = re.search(r"^messages: +(\d+) ham, (\d+) spam$", r.stdout, re.M)
        assert r.returncode == 0 and said, (r.stdout, r.stderr)
        return int(said.group(1)), int(said.group(2))

    group = Group.from_files(site.root, [((site.address(FIRST), site.port(6379)), site.path(REDIS_CONF))], [],
                             user="spamnb", password=site.passwords["SPAMNB-PASSWORD"],
                             ca=site.path("/etc/redis/tls/ca.crt"), args=DEBIAN_UNIT_ARGS)
    host = None
    try:
        r = subprocess.run(push, capture_output=True, timeout=120, env=env)
        assert r.returncode == 0 and b"pushed" in r.stderr, r.stderr
        ham_count, spam_count = messages()
        host = MailHost.command(serve, env, site.port(783), site.root / "serve.log")  # listening on 0.0.0.0
        host.ready()

        def spamc(*args, raw):
            r = subprocess.run([SPAMC, "-d", "127.0.0.1", "-p", str(host.port), *args], input=raw, capture_output=True,
                               timeout=60)
            return r.returncode, r.stdout
        assert spamc("-c", raw=spam)[0] == 1, host.log()  # spamc -c: exit 1 for spam
        assert spamc("-c", raw=ham)[0] == 0, host.log()  # and 0 for ham
        assert spamc("-L", "spam", raw=ham) == (0, b"Message successfully un/learned\n"), host.log()
        assert messages() == (ham_count, spam_count + 1)
    finally:
        log = host.stop() if host is not None else ""
        group.stop()
    assert "Traceback" not in log, log


# -- a failover under load, and an outage, watched by Prometheus ----------------------------------------


def documented_prometheus(site: Site, tmp_path: Path):
    """The page's prometheus.yml (both mail hosts, the rules' file), with admin.md's alerting
    rules in that file, scraping and evaluating every second (the one thing added: its
    ``global:``): ``(process, query, port)``."""
    from test_config import free_port
    from test_prometheus import _prometheus, documented_rules

    site.write("/etc/prometheus/spamnb.rules.yml", documented_rules(), "prometheus", mode=0o644)
    config = "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n" + \
        site.text(files()["/etc/prometheus/prometheus.yml"], "prometheus")
    port = free_port()
    prom, query = _prometheus(tmp_path, None, port, config=config)
    return prom, query, port


def role(client) -> str:
    return client.info("replication")["role"]


@pytest.mark.slow  # about 2.5 min: the group, two hosts, Prometheus; a failover, then a minute without the store
@pytest.mark.skipif(SPAMC is None, reason="spamc is not installed (apt-get install spamc)")
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed (apt-get install "
                                                             "prometheus)")
def test_the_pages_group_fails_over_under_load_and_its_alerts_fire(tmp_path, trained_model_file):
    """The page's group and its two mail hosts (unit, TOML) under mail through ``spamc``, TELLs
    to both hosts and ``spamnb learn``: the primary is killed (-9). At most 1% of the mail
    passes unscanned, learning goes on within 15 s, and the new primary holds exactly the
    learns acknowledged, each once. The old primary, restarted, is a primary refusing
    writes until the Sentinels make it a replica. Prometheus, with the page's configuration
    and admin.md's rules, has SpamnbMailUnscanned firing after the failover for each host
    that passed mail unscanned, and for no other; then, every server killed, SpamnbStoreDown, SpamnbLearningDown and
    SpamnbMailUnscanned fire for both hosts."""
    import threading

    from spamnb.mail.identity import message_key
    from spamnb.storage.filestore import FileBackend
    from test_prometheus import firing
    from test_redis_sentinel import Load, learned_messages

    site = documented_site(tmp_path / "site")
    group = start_group(site)
    hosts, prom, load = [], None, None
    try:
        shutil.copyfile(trained_model_file, site.path(MODEL))
        r = subprocess.run(page_command(site, "spamnb store push"), capture_output=True, timeout=120,
                           env=host_env(site, FIRST))
        assert r.returncode == 0, r.stderr
        hosts = [MailHost(site, h) for h in MAIL_HOSTS]
        prom, query, pport = documented_prometheus(site, tmp_path)
        targets = {h.metrics for h in hosts}
        _wait("Prometheus scraping both hosts", lambda: {r["metric"]["instance"] for r in query(
            'up{job="spamnb"} == 1') or ()} == targets, 60)

        # -- the primary killed under load
        base = FileBackend(trained_model_file).model()
        messages = [m for m in sample_messages()[1:] if message_key(m) not in base.registry][:70]
        assert len(messages) == 70
        pairs = [(raw, "spam" if i % 2 else "ham") for i, raw in enumerate(messages)]
        config = site.path(SPAMD_TOML)
        load = Load(hosts, lambda path, label: on(site, FIRST, "--config", config, "learn", f"--{label}", path),
                    pairs, tmp_path).start()
        _wait("the first learns", lambda: len(load.acked) >= 10 or load.failures, 60)
        old = group.primary()
        killed = time.monotonic()
        group.kill(old)
        _wait("the failover", lambda: group.primary() != old, 60)
        promoted = time.monotonic() - killed
        load.finish(linger=2)
        new = group.connect(group.primary())
        learned, counts = learned_messages(new, b"spamnb:")
        unscanned = load.unscanned()
        back = load.learning_back(killed)
        print(f"\nfailover of the page's group: promoted {promoted:.1f} s after the kill; {len(load.mail)} messages "
              f"through spamc, {len(unscanned)} unscanned; slowest answer {max(m[2] for m in load.mail):.2f} s; "
              f"{len(load.acked)} learns acknowledged, learning again {back:.1f} s after the kill")
        assert len(load.acked) == len(pairs)  # every learner got through, after the switch too
        assert set(learned) - set(base.registry) == load.acked  # none lost, none made up
        assert sum(counts) - float(sum(base.estimator.class_count_)) == len(load.acked)  # each once
        assert len(unscanned) <= len(load.mail) / 100, unscanned
        assert back < 15
        assert load.mail[-1][1], "scanning goes on"

        # -- the old primary, restarted: what Redis does with it
        group.start(old)
        client = group.connect(old)
        restarted, refused, listed = time.monotonic(), None, set()
        while role(client) == "master":
            if refused is None:
                try:
                    client.hset(b"spamnb:docs-test", b"x", b"1")
                    refused = False
                except redis.exceptions.ResponseError as exc:
                    refused = str(exc)
            # what spamnb's readers choose from: the replicas the Sentinels list, and their flags
            listed |= {r["flags"] for r in group.connect(group.sentinels[1], True).sentinel_slaves("spamnb")
                       if (r["ip"], r["port"]) == old}
            assert time.monotonic() - restarted < 60, "the Sentinels never made the old primary a replica"
            time.sleep(0.1)
        as_primary = time.monotonic() - restarted
        print(f"the old primary, restarted: a primary for {as_primary:.1f} s, its writes refused: {refused}; "
              f"listed by the Sentinels as: {sorted(listed)}")
        assert refused and refused.startswith("NOREPLICAS"), refused  # min-replicas-to-write 1
        _wait("the old primary replicating", lambda: client.info("replication")["master_link_status"] == "up", 60)

        # -- the alert after the failover: if and only if mail passed unscanned
        time.sleep(5)  # the last counts scraped, the rules evaluated
        now = firing(pport)
        print(f"firing after the failover: {sorted(now)}")
        passed = {m[3].metrics for m in unscanned}  # the hosts that passed mail unscanned, as spamc saw it
        assert {t for a, t in now if a == "SpamnbMailUnscanned"} == passed, (now, passed)
        assert not {a for a, _ in now} & {"SpamnbStoreDown", "SpamnbLearningDown"}, now

        # -- every server killed: the store gone for more than the rules' minute, mail still sent
        for address in group.servers:
            group.kill(address)
        gone = time.monotonic()
        stop = threading.Event()

        def keep_sending():
            raw, n = sample_messages()[0], 0
            while not stop.is_set():
                host = hosts[n % 2]
                subprocess.run([SPAMC, "-d", host.host, "-p", str(host.port)], input=raw, capture_output=True,
                               timeout=60)
                if n % 5 == 0:  # to each host in turn
                    host.ask(request("TELL", raw, Message_class="spam", Set="local"))  # refused: 75
                n += 1
                time.sleep(0.2)

        sender = threading.Thread(target=keep_sending)
        sender.start()
        wanted = {(a, t) for a in ("SpamnbStoreDown", "SpamnbLearningDown", "SpamnbMailUnscanned") for t in targets}
        fired = {}

        def all_fired():
            for alert in firing(pport) & wanted:
                fired.setdefault(alert, time.monotonic() - gone)
            return set(fired) == wanted
        try:
            _wait("the outage's alerts", all_fired, 150)
        finally:
            stop.set()
            sender.join(60)
        print("every server killed, firing for both hosts after: " + ", ".join(
            f"{a} {max(s for (b, _), s in fired.items() if b == a):.0f} s" for a in sorted({a for a, _ in wanted})))
    finally:
        if load is not None:
            load.stop()
        if prom is not None:
            prom.terminate()
            prom.wait(30)
        logs = [h.stop() for h in hosts]
        group.stop()
    assert all("Traceback" not in log for log in logs), logs
