"""A store in a Redis Sentinel group (``redis+sentinel://``) against Debian's real
``redis-server`` (a primary and a replica) and ``redis-sentinel``, on private
127.0.0.1 ports in a temporary folder: classification reads a replica, learning
writes the primary, and a failover keeps mail flowing without losing a learn.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT
from spamnb.mail.identity import message_key
from spamnb.storage.filestore import FileBackend
from spamnb.storage.store import ModelError
from test_redis_store import SPAMC, Spamd, run, sample_messages, spamc
from test_spamd import _free_port

sys.path.insert(0, str(ROOT))
try:
    from tools.harnesses.redis_sentinel import Group
    from tools.harnesses.redis_sentinel import wait as _wait
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
    with pytest.raises(ModelError, match="cannot reach the store"):  # no Sentinel there: as a server down
        open_backend(None, f"redis+sentinel://127.0.0.1:{_free_port()}/spamnb").view()


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


def view_tokens(view, raw):
    from spamnb.delivery.hook import message_tokens

    return message_tokens(view, raw)


# -- a failover -----------------------------------------------------------------------------------


@pytest.mark.slow  # about 40 s: a group of five processes, two servers, learners, and a failover
@pytest.mark.skipif(SPAMC is None, reason="spamc is not installed (apt-get install spamc)")
@pytest.mark.skipif(redis is None or REDIS_SENTINEL is None, reason="redis-sentinel or the redis package is missing")
def test_a_failover_keeps_mail_flowing_and_loses_no_learn(tmp_path, trained_model_file):
    """A primary, two replicas, a Sentinel (down after 1 s, failover timeout 3 s); two
    ``serve --spamd`` hosts; learners through spamd's TELL and ``spamnb learn --store``;
    spamc sending mail. The primary is killed (-9) while all of them run: every message
    comes back (scanned, or unchanged during the switch), scanning goes on on the new
    primary within the failover time, and every learn acknowledged is in the new primary,
    each once: its learned messages are exactly the distinct messages acknowledged."""
    from test_spamd import request

    down_ms, failover_ms = 1000, 3000
    g = Group(tmp_path, replicas=2, sentinels=1, down_ms=down_ms, failover_ms=failover_ms)
    hosts = []
    try:
        url = g.url(prefix="fo:", timeout="1")
        assert run("store", "push", trained_model_file, url).returncode == 0
        hosts = [Spamd(url, tmp_path / f"h{i}") for i in range(2)]
        base = FileBackend(trained_model_file).model()
        messages = [m for m in sample_messages()[1:] if message_key(m) not in base.registry][:70]
        assert len(messages) == 70
        labels = ["spam" if i % 2 else "ham" for i in range(len(messages))]
        acked: set[bytes] = set()
        acked_at: list[float] = []
        lock = threading.Lock()
        stop = threading.Event()
        deadline = time.monotonic() + 90

        def tell(host, part):
            for raw, label in part:
                while time.monotonic() < deadline:
                    reply = host.ask(request("TELL", raw, Message_class=label, Set="local"))
                    if reply.startswith(b"SPAMD/1.1 0 EX_OK"):
                        with lock:
                            acked.add(message_key(raw))
                            acked_at.append(time.monotonic())
                        break
                    assert reply.startswith(b"SPAMD/1.0 75 "), reply  # try again: nothing else
                    time.sleep(0.1)

        def learn(part):
            for i, (raw, label) in enumerate(part):
                path = tmp_path / f"learn-{i}.eml"
                path.write_bytes(raw)
                while time.monotonic() < deadline:
                    r = run("learn", f"--{label}", "--store", url, path)
                    if r.returncode == 0:
                        with lock:
                            acked.add(message_key(raw))
                            acked_at.append(time.monotonic())
                        break
                    assert b"Traceback" not in r.stderr and r.stderr.count(b"\n") == 1, r.stderr
                    time.sleep(0.1)

        mail = []  # (time, scanned, seconds)

        def send():
            raw, n = sample_messages()[0], 0
            while not stop.is_set():
                took, r = spamc(hosts[n % 2].port, raw)
                assert r.returncode == 0 and (r.stdout == raw or b"X-Spam" in r.stdout), r
                mail.append((time.monotonic(), r.stdout != raw, took))
                n += 1

        pairs = list(zip(messages, labels))
        workers = [threading.Thread(target=tell, args=(hosts[0], pairs[0:30])),
                   threading.Thread(target=tell, args=(hosts[1], pairs[30:60])),
                   threading.Thread(target=learn, args=(pairs[60:70],))]
        sender = threading.Thread(target=send)
        for t in [*workers, sender]:
            t.start()
        _wait("the first learns", lambda: len(acked) >= 10)
        old = g.ports[0]
        killed = time.monotonic()
        g.kill(old)
        _wait("the failover", lambda: g.primary() != old, seconds=30)
        for t in workers:
            t.join(120)
        time.sleep(1)
        stop.set()
        sender.join(60)
    finally:
        for host in hosts:
            host.stop()
    try:
        assert len(acked) == len(pairs)  # every learner got through, after the switch too
        new = g.client(g.primary())
        meta = new.hgetall(b"fo:meta")
        epoch = meta[b"epoch"]
        learned = {}
        for k in range(1024):
            learned.update(new.hgetall(b"fo:%s:r:%d" % (epoch, k)))
        assert set(learned) - set(base.registry) == acked  # none lost, none made up
        n_ham, n_spam = struct.unpack_from("<dd", meta[b"counts"])
        grown = n_ham + n_spam - float(sum(base.estimator.class_count_))
        assert grown == len(acked)  # each learned once: the class counts grew by one a message
        after = [m for m in mail if m[0] > killed]
        unscanned = [m for m in after if not m[1]]
        print(f"failover: {len(mail)} messages through spamc, {len(after)} after the kill, {len(unscanned)} of them "
              f"unscanned; slowest answer {max(m[2] for m in mail):.2f} s; {len(acked)} learns acknowledged, the "
              f"first after the kill in {min(t for t in acked_at if t > killed) - killed:.1f} s")
        assert after and after[-1][1], "scanning resumed"
        switch = (down_ms + failover_ms) / 1000 + 2  # the Sentinel's failover time, and a process start
        if unscanned:
            assert unscanned[-1][0] - killed < switch
        assert min(t for t in acked_at if t > killed) - killed < switch  # learning goes on, on the new primary
        assert max(m[2] for m in mail) < 5  # never held: a request's timeout (1 s) and its retries
    finally:
        g.stop()
