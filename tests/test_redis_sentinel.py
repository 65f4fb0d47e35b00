"""A store in a Redis Sentinel group (``redis+sentinel://``) against Debian's real
``redis-server`` (a primary and a replica) and ``redis-sentinel``, on private
127.0.0.1 ports in a temporary folder: classification reads a replica, learning
writes the primary, and a Sentinel that names another server gets no password sent
to it. A failover under load (:class:`Load`) runs on docs/many-hosts.md's group, as
the page writes it: tests/test_many_hosts.py.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT
from spamnb.mail.identity import message_key
from spamnb.storage.store import ModelError
from test_redis_store import OPENSSL, SPAMC, run, sample_messages, server_certificate, throwaway_ca
from test_spamd import _free_port

sys.path.insert(0, str(ROOT))
try:
    from tools.harnesses.redis_sentinel import Group
finally:
    sys.path.remove(str(ROOT))

REDIS_SERVER = shutil.which("redis-server")
REDIS_SENTINEL = shutil.which("redis-sentinel")
try:
    import redis
except ImportError:  # pragma: no cover - the test extra installs it
    redis = None


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    if REDIS_SERVER is None or REDIS_SENTINEL is None or redis is None:
        pytest.skip("redis-server, redis-sentinel or the redis package is not installed")
    g = Group(tmp_path_factory.mktemp("sentinel"))
    yield g
    g.stop()


def evalsha_calls(port) -> int:
    stats = Group.client(port).info("commandstats")
    return sum(c.get("calls", 0) - c.get("failed_calls", 0) - c.get("rejected_calls", 0)  # not NOSCRIPT's
               for c in (stats.get(f"cmdstat_{n}", {}) for n in ("evalsha", "eval", "evalsha_ro")))


# -- the URL --------------------------------------------------------------------------------------


@pytest.mark.parametrize("url, wanted", [
    ("redis+sentinel://127.0.0.1:26379", "name the Sentinels' service"),
    ("redis+sentinel://127.0.0.1:26379/spamnb/zero", "name the Sentinels' service"),
    ("redis+sentinel://:26379/spamnb", "HOST[:PORT]"),
    ("redis+sentinel://a:1,b:2/spamnb?socket_keepalive=1", "unknown parameter socket_keepalive="),
    ("redis+sentinel://a/spamnb?wait=some", "wait must be a number of replicas"),
    ("redis+sentinel://spamnb:secret@a/spamnb", "give the password with ?password_file=PATH"),
    ("redis://127.0.0.1/0?wait=1", "are for redis+sentinel:// URLs"),
    ("redis://127.0.0.1/0?force_plaintext=yes", "are for redis+sentinel:// URLs"),
    ("redis+sentinel://a/spamnb?password_file=/nonexistent/pw", "give the Sentinels' password too"),
    ("rediss+sentinel://a/spamnb?password_file=/nonexistent/pw", "sentinel_password_file=PATH"),
    ("redis+sentinel://127.0.0.1,10.0.0.3/spamnb?password_file=/n/pw&sentinel_password_file=/n/spw",
     "without TLS the passwords would go to 10.0.0.3 in clear text"),
    ("redis+sentinel://10.0.0.3/spamnb?sentinel_password_file=/n/spw", "use rediss+sentinel://"),
    ("redis+sentinel://a/spamnb?force_plaintext=maybe", "force_plaintext must be yes"),
    ("rediss+sentinel://a/spamnb?force_plaintext=yes", "force_plaintext= is for redis+sentinel://"),
    ("redis+sentinel://a/spamnb?ssl_ca_certs=/etc/hostname", "ssl_ca_certs= is for TLS"),
    ("rediss+sentinel://a/spamnb?bogus=1", "unknown parameter bogus="),
])
def test_a_bad_sentinel_url_is_one_line(url, wanted):
    r = run("info", "--store", url)
    assert r.returncode == 1 and wanted.encode() in r.stderr and r.stderr.count(b"\n") == 1, r.stderr


@pytest.mark.skipif(redis is None, reason="the redis package is not installed (pip install 'spamnb[redis]')")
def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database():
    from spamnb.storage.where import open_backend

    b = open_backend(None, "redis+sentinel://ops@[::1]:26380,sentinel-b,10.0.0.3:26381/spamnb/2"
                           "?prefix=mx:&timeout=0.5")
    group = b.client.connection_pool.sentinel_manager
    assert [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
            for s in group.sentinels] == [("::1", 26380), ("sentinel-b", 26379), ("10.0.0.3", 26381)]
    for pool in (b.client.connection_pool, b.reader.connection_pool):
        assert pool.service_name == "spamnb"
        assert (pool.connection_kwargs["db"], pool.connection_kwargs["username"],
                pool.connection_kwargs["socket_timeout"]) == (2, "ops", 0.5)
    assert (b.prefix, b.wait, b.reader is not b.client) == (b"mx:", 1, True)
    assert open_backend(None, "redis+sentinel://s/spamnb?db=3&wait=0").wait == 0
    port = _free_port()
    with pytest.raises(ModelError, match=rf"no Sentinel of the store .* answers \(127.0.0.1:{port}\)"):
        open_backend(None, f"redis+sentinel://127.0.0.1:{port}/spamnb").view()  # not "No slave found"


# -- a group --------------------------------------------------------------------------------------


@pytest.mark.skipif(redis is None or REDIS_SENTINEL is None, reason="redis-sentinel or the redis package is missing")
def test_classification_reads_a_replica_and_learning_writes_the_primary(group, trained_model_file):
    """Push and learn through the Sentinels reach the primary; a classification is one
    script call on the replica (a read-only script runs there), none on the primary."""
    from spamnb.storage.where import open_backend

    url = group.url(prefix="read:")
    primary, replica = group.ports[0], group.ports[1]
    r = run("store", "push", trained_model_file, url)
    assert r.returncode == 0, r.stderr
    raw = sample_messages()[0]
    want = run("filter", "--model", trained_model_file, input=raw)
    before = evalsha_calls(primary), evalsha_calls(replica)
    backend = open_backend(None, url).resident()
    view = backend.view()
    scores = [view.score(view_tokens(view, m)) for m in sample_messages()]
    after = evalsha_calls(primary), evalsha_calls(replica)
    assert after[0] == before[0] and after[1] - before[1] == len(scores)
    got = run("filter", "--store", url, input=raw)
    assert got.returncode == want.returncode and b"model=store:read:" in got.stdout, got.stderr
    done = backend.learn([(raw, "spam", None)])
    assert done["learned"] + done["moved"] == 1 and evalsha_calls(primary) == after[0] + 1
    st, key = backend.settings(), message_key(raw)
    registry = backend._reg(st.epoch, int.from_bytes(key[:4], "little") % st.registry_buckets)
    assert group.client(replica).hget(registry, key) == b"1"  # WAIT 1: the replica holds it once acknowledged


@pytest.mark.skipif(redis is None or REDIS_SENTINEL is None, reason="redis-sentinel or the redis package is missing")
def test_sentinels_that_answer_without_a_primary_are_told_from_none_answering(group):
    """Sentinels that answer but name no primary up (here: a service they do not monitor)
    are one line saying so, not redis-py's "No master found" / "No slave found"."""
    from spamnb.storage.where import open_backend

    url = group.url(prefix="nosuch:").replace("/spamnb", "/nosuch", 1)
    assert "/nosuch" in url
    for ask in ("view", "size"):
        with pytest.raises(ModelError, match="answer but name no primary up for its service") as caught:
            getattr(open_backend(None, url), ask)()
        assert "No master" not in str(caught.value) and "No slave" not in str(caught.value)


@pytest.mark.skipif(redis is None or REDIS_SENTINEL is None, reason="redis-sentinel or the redis package is missing")
def test_a_message_told_again_is_confirmed_by_the_replicas_too(group, trained_model_file):
    """A learn told again (its first telling unconfirmed: the client was told to try again)
    finds the message learned; it writes the registry entry again and WAITs on that same
    connection, so its acknowledgement says the replicas hold the learn, which a WAIT on a
    connection that wrote nothing would not (the learn would be lost if the primary died)."""
    from spamnb.storage.where import open_backend

    url = group.url(prefix="again:")
    assert run("store", "push", trained_model_file, url).returncode == 0
    backend = open_backend(None, url)
    raw = sample_messages()[1]
    assert backend.learn([(raw, "spam", None)])["learned"] == 1
    primary = group.connect(group.primary())
    before = primary.info("replication")["master_repl_offset"]
    done = backend.learn([(raw, "spam", None)])
    assert done["learned"] == 0 and done.get("already", done.get("unchanged")) == 1, done
    assert primary.info("replication")["master_repl_offset"] > before  # a write, for WAIT to confirm
    waits = primary.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
    backend.learn([(raw, "spam", None)])
    assert primary.info("commandstats")["cmdstat_wait"]["calls"] == waits + 1


def view_tokens(view, raw):
    from spamnb.delivery.hook import message_tokens

    return message_tokens(view, raw)


# -- a failover -----------------------------------------------------------------------------------
# The failover test runs on docs/many-hosts.md's group as the page writes it: tests/test_many_hosts.py.


class Load:
    """Mail and learning while a group fails over: a sender passing one message through the
    real ``spamc`` to each of ``hosts`` in turn (each with ``.host``, ``.port`` and ``.ask``),
    a TELL learner per host (``tells`` messages each) and one of ``spamnb learn`` (``learn(path,
    label)``: its completed process), each retrying what is refused (spamd's ``75``, learn's one
    line) until it is acknowledged. ``acked``: the keys of the messages acknowledged,
    ``acked_at``: when each acknowledged request was sent and answered; ``mail``: ``(time,
    scanned, seconds, host)`` of each message sent."""

    def __init__(self, hosts, learn, pairs, folder, tells=30, seconds=120):
        self.hosts, self.learn, self.folder = hosts, learn, folder
        self.pairs = list(pairs)
        self.acked: set[bytes] = set()
        self.acked_at: list[float] = []
        self.mail: list[tuple[float, bool, float]] = []
        self.failures: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = time.monotonic() + seconds
        parts = [self.pairs[i * tells:(i + 1) * tells] for i in range(len(hosts))]
        self._learners = [threading.Thread(target=self._guard, args=(self._tell, host, part), daemon=True)
                          for host, part in zip(hosts, parts)]
        rest = self.pairs[len(hosts) * tells:]
        self._learners.append(threading.Thread(target=self._guard, args=(self._learn, rest), daemon=True))
        self._sender = threading.Thread(target=self._guard, args=(self._send,), daemon=True)

    def start(self):
        for t in [*self._learners, self._sender]:
            t.start()
        return self

    def finish(self, linger=1.0):
        """Wait for every learner, send ``linger`` seconds more, then stop the sender; the first
        failure of a thread is raised here."""
        for t in self._learners:
            t.join(180)
        time.sleep(linger)
        self._stop.set()
        self._sender.join(60)
        if self.failures:
            raise self.failures[0]

    def stop(self):
        """Stop every thread at its next message (a test that failed halfway)."""
        self._stop.set()

    def _guard(self, fn, *args):
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - said by finish(), in the test's thread
            self.failures.append(exc)
            self._stop.set()

    def _acked(self, raw, started):
        with self._lock:
            self.acked.add(message_key(raw))
            self.acked_at.append((started, time.monotonic()))

    def _tell(self, host, part):
        from test_spamd import request

        for raw, label in part:
            while time.monotonic() < self._deadline and not self._stop.is_set():
                started = time.monotonic()
                reply = host.ask(request("TELL", raw, Message_class=label, Set="local"))
                if reply.startswith(b"SPAMD/1.1 0 EX_OK"):
                    self._acked(raw, started)
                    break
                assert reply.startswith(b"SPAMD/1.0 75 "), reply  # try again: nothing else
                time.sleep(0.1)

    def _learn(self, part):
        for i, (raw, label) in enumerate(part):
            path = self.folder / f"learn-{i}.eml"
            path.write_bytes(raw)
            while time.monotonic() < self._deadline and not self._stop.is_set():
                started = time.monotonic()
                r = self.learn(path, label)
                if r.returncode == 0:
                    self._acked(raw, started)
                    break
                assert b"Traceback" not in r.stderr and r.stderr.count(b"\n") == 1, r.stderr
                time.sleep(0.1)

    def _send(self):
        raw, n = sample_messages()[0], 0
        while not self._stop.is_set():
            host = self.hosts[n % len(self.hosts)]
            start = time.monotonic()
            r = subprocess.run([SPAMC, "-d", host.host, "-p", str(host.port)], input=raw, capture_output=True,
                               timeout=60)
            assert r.returncode == 0 and (r.stdout == raw or b"X-Spam" in r.stdout), r
            self.mail.append((time.monotonic(), r.stdout != raw, time.monotonic() - start, host))
            n += 1

    def unscanned(self):
        return [m for m in self.mail if not m[1]]

    def learning_back(self, killed):
        """Seconds from ``killed`` to the first acknowledgement of a learn sent after it."""
        return min(acked for sent, acked in self.acked_at if sent > killed) - killed


def learned_messages(client, prefix: bytes) -> tuple[dict, tuple[float, float]]:
    """The learned messages' identities in the store of ``prefix`` (a client of its primary),
    and its class counts."""
    meta = client.hgetall(prefix + b"meta")
    epoch, buckets = meta[b"epoch"], json.loads(meta[b"settings"])["registry_buckets"]
    learned = {}
    for k in range(buckets):
        learned.update(client.hgetall(b"%s%s:r:%d" % (prefix, epoch, k)))
    return learned, struct.unpack_from("<dd", meta[b"counts"])


# -- a Sentinel that lies -------------------------------------------------------------------------

STORE_PW, SENTINEL_PW = b"store-secret-pw", b"sentinel-secret-pw"


def _resp(value):
    """``value`` in RESP3, as a Sentinel writes it."""
    if isinstance(value, dict):
        return b"%%%d\r\n" % len(value) + b"".join(_resp(k) + _resp(v) for k, v in value.items())
    if isinstance(value, list):
        return b"*%d\r\n" % len(value) + b"".join(_resp(v) for v in value)
    if isinstance(value, int):
        return b":%d\r\n" % value
    value = value.encode() if isinstance(value, str) else value
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _command(buf):
    """The first RESP command in ``buf`` (its words) and the rest; ``(None, buf)`` when incomplete."""
    head, sep, rest = buf.partition(b"\r\n")
    if not sep or not head.startswith(b"*"):
        return (head.split(), rest) if sep else (None, buf)
    words = []
    for _ in range(int(head[1:])):
        size, sep, rest = rest.partition(b"\r\n")
        if not sep or len(rest) < int(size[1:]) + 2:
            return None, buf
        words.append(rest[:int(size[1:])])
        rest = rest[int(size[1:]) + 2:]
    return words, rest


class FakeSentinel:
    """A server on a private port of 127.0.0.1 that records every byte it receives (after
    TLS, when given a ``tls`` context) and answers as a Sentinel naming ``names`` (host, port)
    the primary of the service ``spamnb``; ``mode="ok"``: ``+OK`` to everything, HELLO too,
    which is what no Redis answers (and, as a primary, what records a password sent to it)."""

    def __init__(self, names=None, mode="sentinel", tls=None):
        self.names, self.mode, self.tls = names, mode, tls
        self.received = bytearray()
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn):
        conn.settimeout(5)
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            buf = b""
            while data := conn.recv(65536):
                self.received += data
                buf += data
                while True:
                    words, buf = _command(buf)
                    if words is None:
                        break
                    conn.sendall(self._answer(words))
        except OSError:  # ssl.SSLError too: a client that refuses our certificate
            pass
        finally:
            conn.close()

    def _answer(self, words):
        if self.mode == "ok":
            return b"+OK\r\n"
        what = b" ".join(words[:2]).upper()
        if words[0].upper() == b"HELLO":
            return _resp({"server": "redis", "version": "7.0.15", "proto": 3, "id": 7, "mode": "sentinel",
                          "role": "sentinel", "modules": []})
        if what == b"SENTINEL MASTERS":
            host, port = self.names
            return _resp([{"name": "spamnb", "ip": host, "port": str(port), "flags": "master",
                           "num-other-sentinels": "0", "num-slaves": "0", "quorum": "1"}])
        if what in (b"SENTINEL SLAVES", b"SENTINEL REPLICAS", b"SENTINEL SENTINELS"):
            return b"*0\r\n"
        return b"+OK\r\n"

    def stop(self):
        self.sock.close()


@pytest.fixture
def passwords(tmp_path):
    """``password_file=...&sentinel_password_file=...``: two private files."""
    query = []
    for name, pw in (("password_file", STORE_PW), ("sentinel_password_file", SENTINEL_PW)):
        path = tmp_path / f"{name}.pw"
        path.write_bytes(pw + b"\n")
        path.chmod(0o600)
        query.append(f"{name}={path}")
    return "&".join(query)


@pytest.fixture
def fakes():
    made = []

    def make(*args, **kwargs):
        made.append(FakeSentinel(*args, **kwargs))
        return made[-1]
    yield make
    for fake in made:
        fake.stop()


def one_line_each_way(url, *words):
    """``info`` says it in one line (exit 1), ``filter`` delivers the message unchanged with
    one line (exit 3): never a traceback nor an internal error."""
    raw = sample_messages()[0]
    for args, code in ((["info", "--store", url], 1), (["filter", "--store", url], 3)):
        r = run(*args, input=raw if args[0] == "filter" else None)
        assert r.returncode == code and r.stderr.count(b"\n") == 1, (args, r.returncode, r.stderr)
        assert b"Traceback" not in r.stderr and b"internal error" not in r.stderr, r.stderr
        assert STORE_PW not in r.stderr and SENTINEL_PW not in r.stderr
        for w in words:
            assert w in r.stderr, (args, r.stderr)
        if code == 3:
            assert r.stdout == raw


@pytest.mark.skipif(redis is None, reason="the redis package is not installed (pip install 'spamnb[redis]')")
def test_a_sentinel_without_a_password_never_gets_the_store_to_send_its_password(fakes, passwords):
    """A Sentinel anyone can talk to names the attacker's port: a URL with the store's password
    and none for the Sentinels is refused before spamnb connects anywhere."""
    catcher = fakes(mode="ok")
    sentinel = fakes(names=("127.0.0.1", catcher.port))
    url = f"redis+sentinel://127.0.0.1:{sentinel.port}/spamnb/0?{passwords.split('&')[0]}"
    one_line_each_way(url, b"sentinel_password_file=PATH")
    assert (sentinel.connections, catcher.connections) == (0, 0) and STORE_PW not in catcher.received


@pytest.mark.skipif(redis is None, reason="the redis package is not installed (pip install 'spamnb[redis]')")
def test_without_tls_the_store_password_goes_to_a_loopback_server_only(fakes, passwords):
    """Loopback Sentinels (with their password) that name another host: refused before
    connecting to it, as the password would cross the network in clear text."""
    sentinel = fakes(names=("192.0.2.7", 6379))  # TEST-NET-1: nothing there
    url = f"redis+sentinel://127.0.0.1:{sentinel.port}/spamnb/0?{passwords}&timeout=0.5"
    one_line_each_way(url, b"the Sentinels name 192.0.2.7:6379", b"loopback addresses only", b"rediss+sentinel://")
    assert SENTINEL_PW in sentinel.received  # it was asked (with its password: no TLS here)


@pytest.mark.skipif(redis is None, reason="the redis package is not installed (pip install 'spamnb[redis]')")
def test_a_sentinel_answering_ok_to_hello_is_one_line(fakes):
    sentinel = fakes(mode="ok")
    one_line_each_way(f"redis+sentinel://127.0.0.1:{sentinel.port}/spamnb/0", b"answered what Redis does not")
    assert sentinel.connections >= 1


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    """``(folder, CA file, a server context of 127.0.0.1 signed by it, one signed by another CA)``."""
    if OPENSSL is None:
        pytest.skip("openssl is not installed (apt-get install openssl): the test makes its CA with it")
    folder, other = tmp_path_factory.mktemp("sentinel-ca"), tmp_path_factory.mktemp("sentinel-other-ca")
    ca_file = throwaway_ca(folder, "ca")
    throwaway_ca(other, "other-ca")
    contexts = []
    for where, name in ((folder, "ca"), (other, "other-ca")):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*server_certificate(where, name))
        contexts.append(context)
    return folder, ca_file, *contexts


@pytest.mark.slow  # about 12 s: TLS handshakes refused until their timeouts
@pytest.mark.skipif(redis is None, reason="the redis package is not installed (pip install 'spamnb[redis]')")
def test_with_tls_a_server_a_sentinel_names_gets_nothing_without_the_cas_certificate(fakes, passwords, ca):
    """``rediss+sentinel://`` with the CA: a Sentinel (one the CA vouches for, told to name
    another server) names a plain port, then a TLS port whose certificate another CA signed;
    neither receives the password, nor anything but a TLS handshake. A plain Sentinel
    receives no password either."""
    _, ca_file, good, other = ca
    for catcher in (fakes(mode="ok"), fakes(mode="ok", tls=other)):
        sentinel = fakes(names=("127.0.0.1", catcher.port), tls=good)
        url = f"rediss+sentinel://127.0.0.1:{sentinel.port}/spamnb/0?{passwords}&ssl_ca_certs={ca_file}"
        one_line_each_way(url, b"the store rediss+sentinel://127.0.0.1:")
        assert b"SENTINEL" in sentinel.received and SENTINEL_PW in sentinel.received  # asked, over TLS
        assert catcher.connections >= 1 and STORE_PW not in catcher.received
        if catcher.tls is None:
            assert catcher.received[:1] == b"\x16"  # a TLS ClientHello, then nothing
        else:
            assert not catcher.received  # its handshake failed: no byte of a command
    plain = fakes(names=("127.0.0.1", 9))
    url = f"rediss+sentinel://127.0.0.1:{plain.port}/spamnb/0?{passwords}&ssl_ca_certs={ca_file}"
    one_line_each_way(url, b"the store rediss+sentinel://127.0.0.1:")
    assert plain.connections >= 1 and SENTINEL_PW not in plain.received and STORE_PW not in plain.received


@pytest.mark.skipif(redis is None, reason="the redis package is not installed (pip install 'spamnb[redis]')")
def test_a_tls_sentinel_url_passes_its_tls_files_to_the_sentinels_and_the_servers(passwords, ca):
    from spamnb.storage.where import open_backend

    _, ca_file, _, _ = ca
    b = open_backend(None, f"rediss+sentinel://127.0.0.1:26390/spamnb/0?{passwords}&ssl_ca_certs={ca_file}")
    sentinel = b.client.connection_pool.sentinel_manager.sentinels[0].connection_pool
    assert sentinel.connection_kwargs["ssl_ca_certs"] == str(ca_file)
    assert sentinel.connection_kwargs["password"] == SENTINEL_PW.decode()
    assert issubclass(sentinel.connection_class, redis.SSLConnection)
    for pool in (b.client.connection_pool, b.reader.connection_pool):
        assert issubclass(pool.connection_class, redis.SSLConnection)
        assert (pool.connection_kwargs["ssl_ca_certs"], pool.connection_kwargs["password"]) == \
            (str(ca_file), STORE_PW.decode())


@pytest.mark.skipif(redis is None or REDIS_SENTINEL is None, reason="redis-sentinel or the redis package is missing")
def test_a_tls_sentinel_group_with_both_passwords_pushes_classifies_and_learns(tmp_path, passwords, ca,
                                                                               trained_model_file):
    """Debian's redis-server and redis-sentinel speaking TLS only, the servers and the
    Sentinels each with their password: ``rediss+sentinel://`` with the CA and both
    password files pushes, classifies on the replica and learns on the primary."""
    folder, ca_file, _, _ = ca
    g = Group(tmp_path, tls=(folder / "server.crt", folder / "server.key", ca_file),
              password=STORE_PW.decode(), sentinel_password=SENTINEL_PW.decode())
    try:
        url = g.url(prefix="tls:") + f"&{passwords}&ssl_ca_certs={ca_file}"
        assert url.startswith("rediss+sentinel://")
        r = run("store", "push", trained_model_file, url)
        assert r.returncode == 0, r.stderr
        assert g.connect(g.ports[0]).hexists("tls:meta", "epoch")
        raw = sample_messages()[0]
        want = run("filter", "--model", trained_model_file, input=raw)
        got = run("filter", "--store", url, input=raw)
        assert got.returncode == want.returncode and b"model=store:tls:" in got.stdout, got.stderr
        (tmp_path / "m.eml").write_bytes(raw)
        r = run("learn", "--spam", "--store", url, tmp_path / "m.eml")
        assert r.returncode == 0, r.stderr
    finally:
        g.stop()
