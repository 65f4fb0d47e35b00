"""The Redis store (spamnb.storage.redisstore) against a real redis-server.

Each module run starts Debian's ``redis-server`` on a private Unix socket in a
temporary folder (no port, no persistence); the tests skip, with the reason,
when it or the redis package is not installed. No fakeredis, no mocks: the
learn script, the TTLs, READONLY and the timeouts are Redis' own.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import SAMPLE_MAILDIR, SHIPPED_ARCHIVE, gold_labels
from spamnb import verdict
from spamnb.delivery import usermodels
from spamnb.delivery.hook import decide
from spamnb.mail.identity import message_key
from spamnb.mail.sources import iter_index
from spamnb.storage import upkeep
from spamnb.storage.backend import StoreUnavailable
from spamnb.storage.filestore import FileBackend
from spamnb.storage.modelfile import load_model, save_model
from test_e2e import SPAMNB
from test_spamd import _free_port, _read_all, request

REDIS_SERVER = shutil.which("redis-server")
try:
    import redis
except ImportError:  # pragma: no cover - the test extra installs it
    redis = None

pytestmark = [
    pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed (apt-get install redis-server; "
                                                    "the README's test command does it when run as root)"),
    pytest.mark.skipif(redis is None, reason="the redis package is not installed (pip install 'spamnb[redis]')"),
]


class RedisServer:
    """A private redis-server on a Unix socket in ``folder``."""

    def __init__(self, folder: Path, *extra, password=None):
        self.folder = folder
        self.password = password
        self.sock = folder / "redis.sock"
        self.extra = extra
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", "0", "--unixsocket", str(self.sock), "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", str(self.folder), *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(20)

    def client(self):
        return redis.Redis(unix_socket_path=str(self.sock), password=self.password)

    def url(self, prefix="t:", **params):
        query = "&".join([f"prefix={prefix}"] + [f"{k}={v}" for k, v in params.items()])
        return f"unix://{self.sock}?{query}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


@pytest.fixture
def url(server, request):
    """A fresh prefix in the module's server for each test."""
    return server.url(prefix=re.sub(r"[^A-Za-z0-9_.,=-]", "_", request.node.name[:40])
                      + f"{hash(request.node.name) & 0xffff:x}:")


def pushed(url, model_path):
    from spamnb.storage.where import open_backend

    backend = open_backend(None, url)
    backend.replace(FileBackend(model_path).model())
    return backend


def run(*args, input=None):
    return subprocess.run(SPAMNB + [str(a) for a in args], input=input, capture_output=True, timeout=120)


def corpus_messages(small_corpus):
    return [m.raw for m in iter_index(str(small_corpus.index))]


def sample_messages():
    return [p.read_bytes() for p in sorted((SAMPLE_MAILDIR / "cur").iterdir())]


# -- the same model, exactly -----------------------------------------------------------------


def test_a_pushed_model_scores_every_message_as_the_file_model(url, trained_model_file, small_corpus):
    """Store and file give the same log-odds to 1e-9, and the same verdict and known tokens."""
    backend = pushed(url, trained_model_file)
    file_model = load_model(trained_model_file)
    view = backend.view()
    raws = sample_messages() + corpus_messages(small_corpus)
    worst = 0.0
    for raw in raws:
        a, b = decide(view, raw), decide(file_model, raw)
        worst = max(worst, abs(a.score - b.score))
        assert a.label == b.label
    assert len(raws) == 403 and worst < 1e-9, worst


def test_push_then_pull_gives_the_model_back(url, trained_model_file, tmp_path):
    r = run("store", "push", trained_model_file, url)
    assert r.returncode == 0, r.stderr
    assert b"pushed" in r.stderr
    out = tmp_path / "pulled.joblib"
    r = run("store", "pull", url, out)
    assert r.returncode == 0, r.stderr
    a, b = load_model(trained_model_file), load_model(out)
    assert a.registry == b.registry
    assert sorted(a.vocabulary.tokens()) == sorted(b.vocabulary.tokens())
    ids = b.vocabulary.ids(a.vocabulary.tokens())
    np.testing.assert_array_equal(a.estimator.feature_count_, b.estimator.feature_count_[:, ids])
    np.testing.assert_array_equal(a.doc_freq, b.doc_freq[ids])
    np.testing.assert_array_equal(a.estimator.class_count_, b.estimator.class_count_)
    assert (a.tokenizer.to_dict(), a.cutoffs, a.features, a.alpha) == (b.tokenizer.to_dict(), b.cutoffs,
                                                                        b.features, b.alpha)


def test_learn_forget_and_move_give_the_counts_of_the_file(url, model_file, small_corpus):
    """The same learns, forgets and moves through the store and through the file."""
    store = pushed(url, model_file)
    file_ = FileBackend(model_file)
    news = sample_messages()[:30]
    labels = gold_labels()
    names = sorted(p.name for p in (SAMPLE_MAILDIR / "cur").iterdir())[:30]
    steps = [([(raw, labels[n], None) for raw, n in zip(news, names)], False),  # learn
             ([(raw, "spam", None) for raw in news[:10] + news[:1]], False),  # move (or unchanged), a copy
             ([(raw, "spam", None) for raw in news[:5]], True)]  # forget
    keys = ("learned", "moved", "unchanged", "duplicates", "forgotten")
    for items, forget in steps:
        got, want = store.learn(items, forget=forget), file_.learn(items, forget=forget)
        assert [got.get(k, 0) for k in keys] == [want.get(k, 0) for k in keys]
        assert got["outcomes"] == want["outcomes"] and len(got["outcomes"]) == len(items)  # what each one did
    a, b = file_.model(), store.model()
    assert a.registry == b.registry
    assert len(a.vocabulary) == len(b.vocabulary)
    ids = b.vocabulary.ids(a.vocabulary.tokens())
    np.testing.assert_allclose(a.estimator.feature_count_, b.estimator.feature_count_[:, ids], rtol=0, atol=1e-9)
    np.testing.assert_array_equal(a.doc_freq, b.doc_freq[ids])
    np.testing.assert_allclose(a.estimator.class_count_, b.estimator.class_count_, atol=1e-12)
    st, counts, _ = store.read([])
    np.testing.assert_allclose(counts[2:4], a.estimator.feature_count_.sum(axis=1), rtol=1e-12)
    with pytest.raises(ValueError, match="not learned"):
        store.learn([(news[0], "spam", None)], forget=True)  # forgotten above


def test_learned_asks_the_stores_registry(url, model_file, tmp_path):
    """`spamnb learned --store URL`: each message's class in the store's registry of learned
    messages, read without the model; the store is not written."""
    store = pushed(url, model_file)
    raws = sample_messages()[40:43]
    store.learn([(raws[0], "spam", None), (raws[1], "ham", None)])
    paths = []
    for i, raw in enumerate(raws):
        paths.append(tmp_path / f"{i}.eml")
        paths[-1].write_bytes(raw)
    before = store.status().size
    r = run("learned", "--store", url, *paths)
    assert r.returncode == 3, r.stderr
    assert [line.split(": ", 1)[1] for line in r.stdout.decode().splitlines()] == [
        "learned as spam", "learned as ham", "not learned"]
    assert run("learned", "--store", url, "--ham", paths[1]).returncode == 0
    assert list(store.learned_as(iter(raws))) == ["spam", "ham", None] and store.status().size == before


# -- cost: round trips and memory ------------------------------------------------------------------


def test_one_round_trip_per_classification_and_per_learn(server, url, trained_model_file):
    backend = pushed(url, trained_model_file)
    view = backend.view()
    raws = sample_messages()[:20]
    decide(view, raws[0])  # the scripts loaded
    c = server.client()

    def client_calls(script_commands):
        """Commands per name since the last reset, without those the scripts ran inside Redis."""
        stats = c.info("commandstats")
        c.config_resetstat()
        return {k[8:]: v["calls"] for k, v in stats.items()
                if k[8:] not in script_commands + ("info", "config|resetstat")}

    c.config_resetstat()
    for raw in raws:
        decide(view, raw)
    assert client_calls(("hget",)) == {"evalsha": 20}
    backend.learn([(sample_messages()[30], "ham", None)])  # the learn script loaded
    client_calls(())
    backend.learn([(raw, "spam", None) for raw in raws])
    assert client_calls(("hget", "hset", "hdel", "hgetall", "expire")) == {"evalsha": 20}
    c.script_flush()  # a restarted server: NOSCRIPT, the script loaded again, the call made
    client_calls(())
    decide(view, raws[0])
    assert client_calls(("hget",)) == {"evalsha": 2, "script|load": 1}


def test_every_token_bucket_has_a_ttl(server, url, trained_model_file):
    backend = pushed(url, trained_model_file)
    backend.learn([(raw, "ham", None) for raw in sample_messages()[:5]])
    c = server.client()
    keys = list(c.scan_iter(match=backend.prefix + b"*:b:*", count=1000))
    assert keys and all(c.ttl(k) > 80 * 86400 for k in keys)


def test_prune_through_the_store_drops_what_prune_drops_in_the_file(url, model_file, tmp_path):
    model = load_model(model_file)
    old = np.flatnonzero(model.doc_freq <= 1)[::2]  # half the rare tokens: last seen 200 days ago
    model.last_seen[old] -= 200
    save_model(model, model_file)
    backend = pushed(url, model_file)
    r = run("prune", "--store", url, "--older-than", 90, "--dry-run")
    assert r.returncode == 0 and f"would drop {len(old)} of".encode() in r.stderr, r.stderr
    r = run("prune", "--store", url, "--older-than", 90)
    assert r.returncode == 0, r.stderr
    r2 = run("prune", "--model", model_file, "--older-than", 90)
    assert r.stderr.split(b";")[0] == r2.stderr.split(b";")[0]  # "dropped N of M tokens"
    a, b = load_model(model_file), backend.model()
    assert sorted(a.vocabulary.tokens()) == sorted(b.vocabulary.tokens())
    st, counts, _ = backend.read([])
    np.testing.assert_allclose(counts[2:4], a.estimator.feature_count_.sum(axis=1), rtol=1e-12)
    assert counts[4] == len(a.vocabulary)


def test_learning_ages_out_the_old_rare_tokens_of_the_buckets_it_writes(url, model_file):
    model = load_model(model_file)
    rare = np.flatnonzero(model.doc_freq <= 1)
    model.last_seen[rare] -= 200
    save_model(model, model_file)
    backend = pushed(url, model_file)
    before = len(backend.model().vocabulary)
    backend.learn([(raw, "spam", None) for raw in sample_messages()[:10]])
    pulled = backend.model()
    st, counts, _ = backend.read([])
    assert counts[4] == len(pulled.vocabulary) < before  # swept, and |V| kept in step
    np.testing.assert_allclose(counts[2:4], pulled.estimator.feature_count_.sum(axis=1), rtol=1e-9)


# -- many hosts -------------------------------------------------------------------------------------


class Spamd:
    """``spamnb serve --spamd 127.0.0.1:PORT --store URL --allow-tell-served`` in a process
    (TELL may change the shared model: what several hosts sharing one want)."""

    def __init__(self, url, folder: Path, *extra):
        self.port = _free_port()
        # a file, not a pipe: a busy server's lines never fill it (beside the socket's 0700 folder, made by serve)
        self.log_path = folder.parent / f"{folder.name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(SPAMNB + ["serve", "--socket", str(folder / "s"), "--store", url, "--spamd",
                                                   f"127.0.0.1:{self.port}", "--allow-tell-served", *extra],
                                         stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                if self.ask(b"PING SPAMC/1.5\r\n\r\n") == b"SPAMD/1.5 0 PONG\r\n":
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("spamnb serve did not start")

    def ask(self, data):
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            return _read_all(s)

    def check(self, raw):
        reply = self.ask(request("CHECK", raw))
        assert reply.startswith(b"SPAMD/1.1 0 EX_OK"), reply
        return float(reply.split(b";")[1].split(b"/")[0])

    def tell(self, raw, label):
        reply = self.ask(request("TELL", raw, Message_class=label, Set="local"))
        assert reply.startswith(b"SPAMD/1.1 0 EX_OK"), reply
        return b"DidSet: local" in reply

    def stop(self):
        self.proc.terminate()
        self.proc.wait(20)
        self.proc_log = self.log_path.read_text("utf-8", "replace")


def test_two_hosts_share_one_model_and_learn_each_message_once(url, model_file, small_corpus, tmp_path):
    """Two spamd servers on one store: a TELL on one changes the other's next verdict;
    8 learners (4 per host) tell 200 messages, each told twice from different hosts:
    every count is what learning them once into the file gives, nothing twice."""
    store = pushed(url, model_file)
    hosts = [Spamd(url, tmp_path / "a"), Spamd(url, tmp_path / "b")]
    try:
        probe = sample_messages()[0]
        before = hosts[1].check(probe)
        assert hosts[0].tell(probe, "spam")
        assert hosts[1].check(probe) > before
        assert not hosts[1].tell(probe, "spam")  # known already, whichever host taught it
        labels = gold_labels()
        names = sorted(p.name for p in (SAMPLE_MAILDIR / "cur").iterdir())
        msgs = [(raw, labels[n]) for raw, n in zip(sample_messages(), names)][1:]
        known = set(load_model(model_file).registry)
        for m in iter_index(str(SHIPPED_ARCHIVE)):  # messages the model has not learned
            if len(msgs) == 200:
                break
            if message_key(m.raw) not in known:
                msgs.append((m.raw, m.label))
        assert len(msgs) == 200
        told = [[] for _ in range(8)]
        for i, (raw, label) in enumerate(msgs):  # each message to two learners, one per host
            told[i % 4].append((raw, label))
            told[4 + (i + 1) % 4].append((raw, label))
        did = []

        def learner(j):
            for raw, label in told[j]:
                did.append(hosts[j // 4].tell(raw, label))

        threads = [threading.Thread(target=learner, args=(j,)) for j in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        learned_once = {message_key(raw) for raw, _ in msgs}
        assert len(did) == 400 and sum(did) == len(learned_once)  # each learned by exactly one of its two tells
    finally:
        for h in hosts:
            h.stop()
    file_ = FileBackend(model_file)
    file_.learn([(probe, "spam", None)] + [(raw, label, None) for raw, label in msgs])
    a, b = file_.model(), store.model()
    assert a.registry == b.registry
    ids = b.vocabulary.ids(a.vocabulary.tokens())
    assert len(a.vocabulary) == len(b.vocabulary) and (ids >= 0).all()
    np.testing.assert_allclose(a.estimator.feature_count_, b.estimator.feature_count_[:, ids], rtol=0, atol=1e-9)
    np.testing.assert_array_equal(a.doc_freq, b.doc_freq[ids])
    np.testing.assert_array_equal(a.estimator.class_count_, b.estimator.class_count_)


# -- failures never lose or hold mail --------------------------------------------------------------


def test_an_unreachable_store_is_one_line_and_mail_passes_through(tmp_path):
    url = f"unix://{tmp_path}/none.sock"
    raw = sample_messages()[0]
    r = run("filter", "--store", url, input=raw)
    assert (r.returncode, r.stdout) == (3, raw)
    assert b"cannot reach the store" in r.stderr and b"Traceback" not in r.stderr
    r = run("learn", "--spam", "--store", url, SAMPLE_MAILDIR / "cur" / sorted(
        p.name for p in (SAMPLE_MAILDIR / "cur").iterdir())[0])
    assert r.returncode == 1 and r.stderr.count(b"\n") == 1 and b"cannot reach the store" in r.stderr


def test_a_refused_push_is_one_line_naming_the_refusal(tmp_path, trained_model_file):
    """A primary that refuses writes (``min-replicas-to-write`` with no replica) refuses the
    push in one line: Redis' reason, not the pipeline's command with the model's bytes."""
    srv = RedisServer(tmp_path, "--min-replicas-to-write", "1")
    try:
        r = run("store", "push", trained_model_file, srv.url())
        assert r.returncode == 1 and r.stderr.count(b"\n") == 1, r.stderr
        assert b"NOREPLICAS" in r.stderr and b"pipeline" not in r.stderr and b"\xef\xbf\xbd" not in r.stderr
    finally:
        srv.stop()


SPAMC = shutil.which("spamc")


def spamc(port, raw):
    """The real spamc, as a mail host runs it: ``(seconds, result)``."""
    start = time.monotonic()
    r = subprocess.run([SPAMC, "-d", "127.0.0.1", "-p", str(port)], input=raw, capture_output=True, timeout=60)
    return time.monotonic() - start, r


@pytest.mark.skipif(SPAMC is None, reason="spamc is not installed (apt-get install spamc)")
def test_serve_starts_while_the_store_is_down_and_scans_once_it_is_back(tmp_path, trained_model_file):
    """A host booting during the store's outage answers at once (mail passes unchanged, one
    line each), and scans the first message after the store returns, without a restart."""
    from spamnb.storage.where import open_backend

    (tmp_path / "redis").mkdir()
    srv = RedisServer(tmp_path / "redis")
    srv.stop()
    url = srv.url()
    backend = open_backend(None, url)
    with pytest.raises(StoreUnavailable, match="cannot reach the store"):
        backend.view()
    health = upkeep.health(backend)  # what --metrics reports: asked of the store now, down
    assert (health.size, health.journal_bytes, health.up, health.last_success) == (None, None, False, None)
    host = Spamd(url, tmp_path / "h")
    try:
        raw = sample_messages()[0]
        for _ in range(3):
            took, r = spamc(host.port, raw)
            assert (r.returncode, r.stdout) == (0, raw) and took < 2, (took, r)
        srv.start()
        pushed(url, trained_model_file)
        took, r = spamc(host.port, raw)
        assert r.returncode == 0 and b"X-Spam" in r.stdout and r.stdout != raw, r
        before = time.time()
        backend.view()
        health = upkeep.health(backend)
        assert health.up is True and before <= health.last_success <= time.time()
        assert health.size[0] > 0, health
    finally:
        host.stop()
        srv.stop()
    log = host.proc_log
    assert "serving meanwhile: mail passes unscanned until the store answers" in log
    assert log.count("event=error via=spamd") == 3 and "Traceback" not in log, log


def test_spamnb_store_in_the_environment_is_the_store_option(url, trained_model_file, monkeypatch):
    pushed(url, trained_model_file)
    raw = sample_messages()[0]
    want = run("filter", "--store", url, input=raw)
    assert want.returncode in (0, 1, 2) and b"model=store:" in want.stdout
    monkeypatch.setenv("SPAMNB_STORE", url)
    assert (run("filter", input=raw).stdout, run("filter", "-u", input=raw).returncode) == (want.stdout,
                                                                                         want.returncode)
    r = run("info")
    assert r.returncode == 0 and url.split("?")[0].encode() in r.stdout, r.stderr
    r = run("filter", "--model", trained_model_file, input=raw)  # an explicit file wins over the variable
    assert r.returncode in (0, 1, 2) and f"model={trained_model_file.name}".encode() in r.stdout
    r = run("filter", "--model", trained_model_file, "--store", url, input=raw)
    assert (r.returncode, r.stdout) == (3, raw) and b"not both" in r.stderr


def test_a_store_restarted_empty_says_so(url, server, trained_model_file):
    backend = pushed(url, trained_model_file)
    raw = sample_messages()[0]
    assert run("filter", "--store", url, input=raw).returncode in (0, 1, 2)
    server.client().delete(backend.prefix + b"meta")  # what a restart without persistence leaves
    r = run("filter", "--store", url, input=raw)
    assert (r.returncode, r.stdout) == (3, raw) and b"empty" in r.stderr, r.stderr
    r = run("info", "--store", url)
    assert r.returncode == 1 and b"holds no model: it is empty" in r.stderr


def test_a_read_only_replica_says_so_and_learns_nothing(tmp_path, trained_model_file):
    replica = RedisServer(tmp_path, "--replicaof", "127.0.0.1", str(_free_port()))  # its primary: nowhere
    try:
        with pytest.raises(StoreUnavailable, match="read-only replica"):
            pushed(replica.url(), trained_model_file)
        r = run("store", "push", trained_model_file, replica.url())
        assert r.returncode == 1 and b"read-only replica" in r.stderr and r.stderr.count(b"\n") == 1
        assert replica.client().dbsize() == 0
    finally:
        replica.stop()


def spamd_store(url):
    from spamnb.storage.where import open_backend

    return open_backend(None, url)


@pytest.mark.slow  # about 20 s of waiting out timeouts; .ci/run runs it
def test_a_slow_store_is_bounded_by_the_timeout(server, trained_model_file):
    url = server.url(prefix="slow:", timeout="0.5")
    pushed(url, trained_model_file)
    raw = sample_messages()[0]
    server.client().execute_command("CLIENT", "PAUSE", "20000", "ALL")
    try:
        start = time.monotonic()
        r = run("filter", "--store", url, input=raw)
        took = time.monotonic() - start
    finally:
        server.client().execute_command("CLIENT", "UNPAUSE")
    assert (r.returncode, r.stdout) == (3, raw) and b"did not answer in time" in r.stderr, r.stderr
    assert took < 15  # not the 20 s pause: the 0.5 s timeout (and a process start)


def test_spamd_cannot_scan_when_the_store_is_gone(tmp_path, trained_model_file):
    srv = RedisServer(tmp_path)
    url = srv.url()
    pushed(url, trained_model_file)
    host = Spamd(url, tmp_path / "h")
    try:
        raw = sample_messages()[0]
        assert not math.isnan(host.check(raw))
        srv.stop()
        reply = host.ask(request("CHECK", raw))
        assert reply.startswith(b"SPAMD/1.0 74 ") and b"store cannot answer" in reply, reply  # the log: why
        reply = host.ask(request("TELL", raw, Message_class="spam", Set="local"))
        assert reply.startswith(b"SPAMD/1.0 75 "), reply
        srv.start()  # back, and empty: said so
        reply = host.ask(request("CHECK", raw))
        assert reply.startswith(b"SPAMD/1.0 74 ") and b"store cannot answer" in reply, reply
    finally:
        host.stop()
        srv.stop()


def test_per_user_models_under_spamds_user(url, trained_model_file, tmp_path):
    store = spamd_store(url)
    store.for_user("alice").replace(FileBackend(trained_model_file).model())
    pushed(url, trained_model_file)
    host = Spamd(url, tmp_path / "h", "--store-users")
    try:
        raw = sample_messages()[3]
        before = host.check(raw)
        reply = host.ask(request("TELL", raw, Message_class="spam", Set="local", User="alice"))
        assert b"DidSet: local" in reply
        assert host.check(raw) == before  # the shared model did not learn it
        reply = host.ask(request("CHECK", raw, User="alice"))
        assert float(reply.split(b";")[1].split(b"/")[0]) > before
        reply = host.ask(request("TELL", raw, Message_class="spam", Set="local", User="bob"))
        assert reply.startswith(b"SPAMD/1.0 67 "), reply  # bob has no model: EX_NOUSER
    finally:
        host.stop()
    assert usermodels.Models(store, store_users=True).for_user("alice")[1]
    assert not usermodels.Models(store).for_user("alice")[1]  # without --store-users: the served model


def test_spamd_asks_the_store_about_a_user_without_a_model_once_not_per_request(server, url, trained_model_file,
                                                                                tmp_path):
    """``spamc -u bob`` to ``serve --spamd --store-users`` with no model of bob's in the
    store: the store is asked whether he has one at his first request, then not again
    for a while (:data:`spamnb.delivery.usermodels.Models.NO_MODEL_SECONDS`), and a model
    pushed for him is served once that has passed."""
    from test_spamd import SPAMC

    if SPAMC is None:
        pytest.skip("spamc is not installed (apt-get install spamc)")
    pushed(url, trained_model_file)
    host = Spamd(url, tmp_path / "h", "--store-users")
    watcher = server.client()
    asked = lambda: watcher.info("commandstats").get("cmdstat_hexists", {}).get("calls", 0)  # noqa: E731
    try:
        raw = sample_messages()[3]
        before = asked()
        for _ in range(10):
            r = subprocess.run([SPAMC, "-d", "127.0.0.1", "-p", str(host.port), "-u", "bob", "-c"], input=raw,
                               capture_output=True, timeout=60)
            assert re.fullmatch(rb"-?\d+\.\d/\d+\.\d\n", r.stdout), r
        assert asked() - before <= 1, asked() - before  # not a round trip per request
    finally:
        host.stop()
    models = usermodels.Models(spamd_store(url), store_users=True)
    assert not models.for_user("bob")[1]
    spamd_store(url).for_user("bob").replace(FileBackend(trained_model_file).model())
    assert not models.for_user("bob")[1]  # believed for NO_MODEL_SECONDS
    models.NO_MODEL_SECONDS = 0  # (as if they had passed)
    assert models.for_user("bob")[1]  # then asked again: his model


@pytest.mark.slow
def test_the_shipped_corpus_scores_the_same_through_the_store(url, tmp_path):
    """Every message of the shipped corpus, the model trained on all of it."""
    if not SHIPPED_ARCHIVE.exists():
        pytest.skip("the shipped corpus is not in this checkout")
    path = tmp_path / "sa.joblib"
    assert run("train", "--index", SHIPPED_ARCHIVE, "--model", path).returncode == 0
    backend = pushed(url, path)
    view, model = backend.view(), load_model(path)
    worst, n = 0.0, 0
    for m in iter_index(str(SHIPPED_ARCHIVE)):
        worst = max(worst, abs(decide(view, m.raw).score - decide(model, m.raw).score))
        n += 1
    assert n == 5943 and worst < 1e-9, worst


def test_imap_with_a_store_learns_into_the_logins_own_model(url, trained_model_file):
    """spamnb imap filter --store: the shared model judges until the user's first
    correction, which makes their model (from the shared one) in the store."""
    from spamnb.cli.imap import _judge_and_learn

    shared = pushed(url, trained_model_file)
    judge, learn = _judge_and_learn(None, True, store=url, user="alice@example.org")
    raw = sample_messages()[5]
    label, p, _ = judge(raw)
    learn([(raw, "spam" if label != "spam" else "ham")])
    alice = shared.for_user("alice@example.org")
    assert alice.exists() and judge(raw)[1] != p  # judged by her model now
    assert message_key(raw) in alice.model().registry and message_key(raw) not in shared.model().registry


def test_the_filters_fast_path_answers_from_the_store_as_the_click_command(url, trained_model_file, tmp_path):
    """`spamnb filter --store` skips click and numpy (spamnb.delivery.fastfilter.via_store):
    the same bytes and status as the click command, also when the store is gone."""
    from click.testing import CliRunner

    from spamnb.cli import main

    pushed(url, trained_model_file)
    gone = f"unix://{tmp_path}/none.sock"
    for raw in sample_messages()[:6]:
        for args in (["--store", url], ["--store", url, "--exit-zero", "--spam-cutoff", "0.6"], ["--store", gone]):
            fast = run("filter", *args, input=raw)
            res = CliRunner().invoke(main, ["filter", *args], input=raw)
            assert (fast.stdout, fast.returncode) == (res.stdout_bytes, res.exit_code)
            assert fast.stderr.decode() == res.stderr, args


def test_a_password_comes_from_a_file_and_is_never_shown(tmp_path, trained_model_file):
    srv = RedisServer(tmp_path, "--requirepass", "s3cret-pw", password="s3cret-pw")
    try:
        pw = tmp_path / "pw"
        pw.write_text("s3cret-pw\n")
        pw.chmod(0o600)
        url = f"unix://{srv.sock}?prefix=p:&password_file={pw}"
        r = run("store", "push", trained_model_file, url)
        assert r.returncode == 0, r.stderr
        assert b"s3cret" not in r.stderr
        raw = sample_messages()[0]
        assert run("filter", "--store", url, input=raw).returncode in (0, 1, 2)
        (tmp_path / "bad").write_text("wrong\n")
        r = run("filter", "--store", url.replace(str(pw), str(tmp_path / "bad")), input=raw)
        assert (r.returncode, r.stdout) == (3, raw) and b"wrong" not in r.stderr and b"s3cret" not in r.stderr
        r = run("info", "--store", f"unix://:s3cret-pw@{srv.sock}")
        assert r.returncode == 1 and b"password_file" in r.stderr
    finally:
        srv.stop()


def test_a_configuration_files_store_url_and_the_cutoffs_command(url, trained_model_file, tmp_path, monkeypatch):
    """``[store] url`` in a configuration file is ``--store``; a ``--model`` on the command
    line sets it aside (the fast path as the click command); ``spamnb cutoffs`` changes the
    store's cut-offs in place, and the file model keeps its own."""
    pushed(url, trained_model_file)
    raw = sample_messages()[0]
    conf = tmp_path / "conf" / "spamnb.toml"
    conf.parent.mkdir(mode=0o700)
    conf.write_text(f"[store]\nurl = {url!r}\n")
    conf.chmod(0o600)
    monkeypatch.setenv("SPAMNB_CONFIG", str(conf))
    monkeypatch.delenv("SPAMNB_MODEL", raising=False)
    want = run("filter", "--store", url, input=raw)
    for _ in range(2):  # the click command reads the file first, the fast path then
        r = run("filter", input=raw)
        assert (r.stdout, r.returncode) == (want.stdout, want.returncode) and b"model=store:" in r.stdout, r.stderr
        r = run("filter", "--model", trained_model_file, input=raw)
        assert r.returncode in (0, 1, 2) and f"model={trained_model_file.name}".encode() in r.stdout, r.stderr
    before = FileBackend(trained_model_file).model().cutoffs
    r = run("cutoffs", "--spam-cutoff", "0.5", "--ham-cutoff", "0.4")
    assert r.returncode == 0 and b"0.4" in r.stderr, r.stderr
    r = run("cutoffs")
    assert r.returncode == 0 and b"ham <= 0.4 < unsure <= 0.5 < spam" in r.stdout, (r.stdout, r.stderr)
    from spamnb.storage.where import open_backend

    assert tuple(open_backend(None, url).view().cutoffs) == (0.4, 0.5)
    assert FileBackend(trained_model_file).model().cutoffs == before


def test_a_running_server_decides_by_the_cutoffs_set_after_it_started(url, trained_model_file, tmp_path):
    """``spamnb cutoffs --store`` on one host: a spamd already serving the store on another
    decides the very next message by the new cut-offs (before, it kept the ones it read
    at start-up until the next push)."""
    pushed(url, trained_model_file)
    raw = sample_messages()[0]
    host = Spamd(url, tmp_path / "h")
    try:
        def required():
            reply = host.ask(request("CHECK", raw))
            return float(reply.split(b";")[1].split(b"/")[1].split(b"\r")[0])

        before = required()
        r = run("cutoffs", "--store", url, "--spam-cutoff", "0.999", "--ham-cutoff", "0.3")
        assert r.returncode == 0, r.stderr
        after = required()
        assert after != before and after == pytest.approx(verdict.threshold(0.999), abs=0.01), (before, after)
        r = run("cutoffs", "--store", url, "--spam-cutoff", "0.6", "--ham-cutoff", "0.3")
        assert required() == pytest.approx(verdict.threshold(0.6), abs=0.01)
    finally:
        host.stop()


# -- TLS (rediss://) and the documented ACL user ----------------------------------------------------

OPENSSL = shutil.which("openssl")


def _openssl(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def throwaway_ca(folder: Path, name: str) -> Path:
    """A self-signed CA (``NAME.crt``, ``NAME.key``) in ``folder``."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt",
             "-days", "2", "-subj", f"/CN=spamnb test {name}", cwd=folder)
    return folder / f"{name}.crt"


def server_certificate(folder: Path, ca: str, ip="127.0.0.1", name="server") -> tuple[Path, Path]:
    """A certificate for ``ip`` (its subjectAltName: redis-py checks the name) signed by ``ca``,
    and its key: ``NAME.crt``, ``NAME.key`` in ``folder``."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={ip}", cwd=folder)
    (folder / f"{name}.ext").write_text(f"subjectAltName=IP:{ip}\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=folder)
    return folder / f"{name}.crt", folder / f"{name}.key"


class TlsRedisServer:
    """A private redis-server speaking only TLS on a port of 127.0.0.1 (``--port 0``)."""

    def __init__(self, folder: Path):
        if OPENSSL is None:
            pytest.skip("openssl is not installed (apt-get install openssl): the test makes its CA with it")
        self.folder = folder
        self.ca = throwaway_ca(folder, "ca")
        self.other_ca = throwaway_ca(folder, "other-ca")
        cert, key = server_certificate(folder, "ca")
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", "0", "--bind", "127.0.0.1", "--tls-port", str(self.port),
             "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(self.ca),
             "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(folder)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode(errors="replace")
                if "tls" in out.lower():  # a build without TLS refuses the tls-* directives
                    version = subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True).stdout
                    pytest.skip(f"this redis-server has no TLS ({version.strip()}): {out.strip()[-200:]}")
                raise RuntimeError(f"redis-server did not start: {out[-500:]}")
            try:
                if self.client().ping():
                    return
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=True, ssl_ca_certs=str(self.ca))

    def url(self, scheme="rediss", user="", **params):
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"{scheme}://{user}127.0.0.1:{self.port}/0" + (f"?{query}" if query else "")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(20)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    srv = TlsRedisServer(tmp_path_factory.mktemp("redis-tls"))
    yield srv
    srv.stop()


def classify_jsonl(*args):
    r = run("classify", "--format", "jsonl", *args, SAMPLE_MAILDIR)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_rediss_with_the_servers_ca_pushes_and_classifies_as_the_file(tls_server, trained_model_file):
    url = tls_server.url(prefix="tls:", ssl_ca_certs=tls_server.ca)
    r = run("store", "push", trained_model_file, url)
    assert r.returncode == 0 and b"pushed" in r.stderr, r.stderr
    assert tls_server.client().hexists("tls:meta", "epoch")  # it went to the TLS server
    store, file = classify_jsonl("--store", url), classify_jsonl("--model", trained_model_file)
    assert len(store) == len(file) >= 10
    for a, b in zip(store, file):
        assert (a["path"], a["label"]) == (b["path"], b["label"])
        assert abs(a["score"] - b["score"]) < 1e-9, (a, b)


def one_line_error(r, *wanted):
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr.count(b"\n") == 1 and b"Traceback" not in r.stderr, r.stderr
    for text in wanted:
        assert text in r.stderr, r.stderr


def test_rediss_without_the_ca_or_with_another_is_one_line(tls_server, trained_model_file, tmp_path):
    for url in (tls_server.url(prefix="tls:"), tls_server.url(prefix="tls:", ssl_ca_certs=tls_server.other_ca)):
        r = run("store", "push", trained_model_file, url)
        one_line_error(r, b"cannot reach the store", b"CERTIFICATE_VERIFY_FAILED", b"?ssl_ca_certs=FILE")
        one_line_error(run("info", "--store", url), b"CERTIFICATE_VERIFY_FAILED")
    r = run("info", "--store", tls_server.url(ssl_ca_certs=tmp_path / "no-such-ca.pem"))
    one_line_error(r, b"cannot read ssl_ca_certs=", b"no-such-ca.pem")


def test_plain_redis_to_the_tls_port_is_one_line(tls_server, trained_model_file):
    url = tls_server.url("redis", prefix="tls:")
    one_line_error(run("store", "push", trained_model_file, url), b"cannot reach the store", b"use rediss://")
    raw = sample_messages()[0]
    r = run("filter", "--store", url, input=raw)
    assert (r.returncode, r.stdout) == (3, raw) and b"use rediss://" in r.stderr and b"Traceback" not in r.stderr


def documented_acl():
    """docs/many-hosts.md's spamnb user (its line of ``/etc/redis/users.acl``), as the words of
    ``ACL SETUSER``; its password ``>SPAMNB-PASSWORD``."""
    from docsnippets import acl

    return ["ACL", "SETUSER", "spamnb", *acl("spamnb")]


def test_the_documented_acl_user_can_do_everything_the_store_does(tls_server, trained_model_file, tmp_path):
    """The docs' ACL user (its commands only, its prefix only), over TLS with password_file:
    push, classify, learn, forget, prune, cut-offs, info and pull all work."""
    words = documented_acl()
    assert words[:3] == ["ACL", "SETUSER", "spamnb"] and ">SPAMNB-PASSWORD" in words
    tls_server.client().execute_command(*[">acl-pw-1" if w == ">SPAMNB-PASSWORD" else w for w in words])
    pw = tmp_path / "pw"
    pw.write_text("acl-pw-1\n")
    pw.chmod(0o600)
    url = tls_server.url(user="spamnb@", ssl_ca_certs=tls_server.ca, password_file=pw, prefix="spamnb:")
    r = run("store", "push", trained_model_file, url)
    assert r.returncode == 0, r.stderr
    assert len(classify_jsonl("--store", url)) >= 10
    spam = sorted((SAMPLE_MAILDIR / "cur").iterdir())[0]
    for args in (["learn", "--spam"], ["forget", "--spam"], ["learn", "--ham"]):
        r = run(*args, "--store", url, spam)
        assert r.returncode == 0, (args, r.stderr)
    for args in (["prune", "--older-than", "0"], ["cutoffs", "--spam-cutoff", "0.9"], ["info"]):
        r = run(*args, "--store", url)
        assert r.returncode == 0, (args, r.stderr)
    r = run("store", "pull", url, tmp_path / "pulled.joblib")
    assert r.returncode == 0 and b"acl-pw-1" not in r.stderr, r.stderr
    # the history in the store: recorded, marked and read (what spamnb web --store reads) as this user
    from spamnb.storage.redishistory import RedisHistory
    from spamnb.storage.redisstore import RedisBackend

    r = run("filter", "--store", url, "--history-store", input=spam.read_bytes())
    assert b"X-Spam-Status" in r.stdout and b"history" not in r.stderr, r.stderr
    # learned as ham above: learning it as spam moves it, a correction the history marks
    r = run("learn", "--spam", "--store", url, "--history-store", spam)
    assert r.returncode == 0 and b"history" not in r.stderr, r.stderr
    hist = RedisHistory(RedisBackend.from_url(url))
    hist.check()
    rows = hist.rows(hist.ids(), bodies=True)
    assert len(rows) == 1 and rows[0]["corrected"] == "spam" and rows[0]["raw"] == spam.read_bytes()
    assert hist.corrected_ids() == [rows[0]["id"]] and hist.count("queue") == 0
    # and the ACL really binds: another prefix, or a command it was not given, is refused
    r = run("info", "--store", url.replace("prefix=spamnb:", "prefix=other:"))
    assert r.returncode == 1 and b"Traceback" not in r.stderr and b"permission" in r.stderr.lower(), r.stderr


def test_imap_filter_with_a_store_opens_it_once_a_run_and_follows_a_new_push(server, url, trained_model_file,
                                                                               dovecot, tmp_path):
    """``spamnb imap filter --store`` for a login with no model there: the shared model
    judges every message through one client of the store (not a connection made per
    message), and a model pushed during the run judges the next message."""
    from click.testing import CliRunner

    from spamnb.cli import main
    from spamnb.cli.imap import _judge_and_learn

    pushed(url, trained_model_file)
    raws = sample_messages()[:12]
    for raw in raws:
        dovecot.append("INBOX", raw)
    pw = tmp_path / "pw"
    pw.write_text(dovecot.password + "\n")
    pw.chmod(0o600)
    watcher = server.client()  # one connection of its own, made here
    made = lambda: watcher.info("stats")["total_connections_received"]  # noqa: E731
    before = made()
    res = CliRunner().invoke(main, ["imap", "filter", "--host", dovecot.host, "--port", str(dovecot.port),
                                    "--user", dovecot.user, "--password-file", str(pw), "--security", "none",
                                    "--store", url, "--no-learn-verdicts"])
    assert res.exit_code == 0 and "classified 12" in res.stderr, res.stderr
    assert made() - before <= 2, made() - before  # the login's model and the shared one: a client each
    assert not spamd_store(url).for_user(dovecot.user).exists()

    judge, _ = _judge_and_learn(None, store=url, user=dovecot.user)
    raw = raws[0]
    label, p, _ = judge(raw)
    retrained = load_model(trained_model_file)
    retrained.learn([(raw, "ham" if label == "spam" else "spam")])
    spamd_store(url).replace(retrained)
    assert judge(raw)[1] != p  # the new model judges
    before = made()
    for raw in raws:
        judge(raw)
    assert made() == before  # no connection per message


# -- malformed values in the store: checked as a model file's are -----------------------------------

#: What a hand edit, another program or a damaged store can leave in a store's keys, each as
#: (what it changes, what the one-line error names).
MALFORMED = {
    "nan-counts": ("counts", "finite"), "inf-counts": ("counts", "finite"), "negative-counts": ("counts", "negative"),
    "nan-token": ("token", "a token's counts"), "negative-token": ("token", "a token's counts"),
    "short-token": ("token", "a token value is short"), "settings-not-json": ("settings", "settings:"),
    "unknown-tokenizer-key": ("settings", "unknown tokenizer config keys: bogus"),
    "wrong-type": ("settings", "alpha must be a finite number"), "missing-field": ("settings", "no features"),
    "learned-class": ("registry", "a learned message has no class"),
    "skip-headers-number": ("settings", "skip_headers must be a sequence of header names"),
}


def malform(client, backend, raw, kind):
    """Put the ``kind`` of malformed value in the store of ``backend``, where reading
    ``raw``'s verdict (or learning it) reads it; the settings under a new revision, as a
    writer's change is (so that readers holding the old ones read them again)."""
    from spamnb.mail.tokenizer import tokenize
    from spamnb.storage.redisstore import COUNTS, VALUE
    from spamnb.storage.scorer import token_hash

    meta = backend.prefix + b"meta"
    st = backend.settings(refresh=True)
    if kind.endswith("-counts"):
        bad = {"nan": math.nan, "inf": math.inf, "negative": -5.0}[kind.split("-")[0]]
        n = list(COUNTS.unpack(client.hget(meta, "counts")))
        n[2] = bad
        client.hset(meta, "counts", COUNTS.pack(*n))
    elif kind.endswith("-token"):
        for tok in tokenize(raw, backend.tokenizer()):  # the first of the message's tokens the store holds
            h = token_hash(tok)
            key, field = backend._bucket(st.epoch, h % st.buckets), h.to_bytes(8, "little")
            value = client.hget(key, field)
            if value is not None:
                break
        new = {"nan": VALUE.pack(math.nan, 1.0, 1, 0) + value[VALUE.size:],
               "negative": VALUE.pack(-3.0, 1.0, 1, 0) + value[VALUE.size:], "short": b"\x00" * 11}
        client.hset(key, field, new[kind.split("-")[0]])
    elif kind == "learned-class":
        key = message_key(raw)
        client.hset(backend._reg(st.epoch, int.from_bytes(key[:4], "little") % st.registry_buckets), key, b"x")
    else:
        s = json.loads(client.hget(meta, "settings"))
        if kind == "unknown-tokenizer-key":
            s["tokenizer"]["bogus"] = 1
        elif kind == "wrong-type":
            s["alpha"] = "0.1"
        elif kind == "missing-field":
            del s["features"]
        elif kind == "skip-headers-number":
            s["tokenizer"]["skip_headers"] = 5
        client.hset(meta, mapping={"settings": "{not json" if kind == "settings-not-json" else json.dumps(s),
                                   "rev": f"edited-{kind}"})


def keys_and_values(client, prefix):
    """Every key (a hash, all of them) under ``prefix`` with its fields and whether it has a
    TTL: what "nothing changed" compares."""
    return {k: (client.hgetall(k), client.ttl(k) > 0) for k in client.scan_iter(match=prefix + b"*", count=1000)}


def one_line(stderr: bytes, *words: bytes) -> bool:
    return stderr.count(b"\n") == 1 and b"Traceback" not in stderr and all(w in stderr for w in words)


def malformed_store(server, url, model_file, kind):
    """``(backend, raw, the error's words, the store's keys and values)``: a store holding
    the ``kind`` of malformed value where ``raw``'s verdict (or learning it) reads it."""
    backend = pushed(url, model_file)
    raw = sample_messages()[4]
    if kind == "learned-class":  # a message the model has learned: its class is what learning reads
        backend.learn([(raw, "spam", None)])
    malform(server.client(), backend, raw, kind)
    return backend, raw, [b"holds a malformed model", MALFORMED[kind][1].encode()], \
        keys_and_values(server.client(), backend.prefix)


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_value_in_the_store_is_refused_and_mail_passes_through(server, url, model_file, kind):
    """A store's values are checked as a model file's are: each malformed one is a
    MalformedStore (a ModelError: one line) for the verdict, for learning (before the learn
    script writes anything) and for reading the whole model; `spamnb filter --store`'s fast
    path delivers the message unchanged with one line, exit 3, and 0 with --exit-zero (a
    maildrop recipe must not defer the mail for as long as the store stays bad)."""
    from spamnb.storage.redisstore import MalformedStore
    from spamnb.storage.where import open_backend

    backend, raw, said, before = malformed_store(server, url, model_file, kind)
    words = MALFORMED[kind][1]
    fresh = open_backend(None, url)  # reads the settings anew, as every new process does
    if MALFORMED[kind][0] != "registry":  # a verdict reads no learned message
        with pytest.raises(MalformedStore, match=re.escape(words)):
            decide(fresh.view(), raw)
        for args, code in ((["filter", "--store", url], 3), (["filter", "--store", url, "--exit-zero"], 0)):
            r = run(*args, input=raw)
            assert (r.returncode, r.stdout) == (code, raw), (args, r.stderr)
            assert one_line(r.stderr, *said, b"message passed through unchanged"), (args, r.stderr)
    with pytest.raises(MalformedStore):
        fresh.learn([(raw, "ham", None)])
    with pytest.raises(MalformedStore):
        fresh.model()
    assert keys_and_values(server.client(), backend.prefix) == before


@pytest.mark.parametrize("kind", [k if k in ("settings-not-json", "nan-token", "skip-headers-number") else
                                  pytest.param(k, marks=pytest.mark.slow) for k in sorted(MALFORMED)])
def test_a_malformed_value_in_the_store_through_every_command(server, url, model_file, kind, tmp_path):
    """The click path of `filter --store` passes the message through as the fast path
    does; `learn`, `info` and `classify --store` say it in one line and exit 1; nothing in
    the store changes. (Two kinds in the default run: each command starts numpy.)"""
    backend, raw, said, before = malformed_store(server, url, model_file, kind)
    if MALFORMED[kind][0] != "registry":
        r = run("filter", "--store", url, "--evidence", "1", input=raw)  # --evidence: the click command
        assert (r.returncode, r.stdout) == (3, raw) and one_line(r.stderr, *said, b"passed through"), r.stderr
    (tmp_path / "m.eml").write_bytes(raw)
    for args in (["learn", "--ham", "--store", url, tmp_path / "m.eml"], ["info", "--store", url],
                 ["classify", "--store", url, SAMPLE_MAILDIR]):
        r = run(*args)
        assert r.returncode == 1 and one_line(r.stderr, *said), (args, r.stderr)
        assert not r.stdout.strip(b"label P(spam)score message\n"), (args, r.stdout[:300])
    assert keys_and_values(server.client(), backend.prefix) == before


def test_spamd_answers_a_scan_of_a_malformed_store_as_it_documents_and_a_push_repairs_it(url, model_file,
                                                                                          tmp_path):
    """`serve --spamd --store` meets each kind of malformed value as a model it cannot read:
    EX_IOERR (74) for the scan, and real spamc passes the message through unchanged (exit 0);
    the `store push` that the error line asks for replaces the malformed model."""
    from test_spamd import SPAMC

    pushed(url, model_file)
    host = Spamd(url, tmp_path / "h")
    try:
        raw = sample_messages()[4]
        want = host.ask(request("CHECK", raw))
        assert want.startswith(b"SPAMD/1.1 0 EX_OK"), want
        for kind in ("nan-counts", "short-token", "unknown-tokenizer-key", "settings-not-json"):
            malform(redis.Redis.from_url(url.split("?")[0]), spamd_store(url), raw, kind)
            reply = host.ask(request("CHECK", raw))
            assert reply.startswith(b"SPAMD/1.0 74 cannot read the model"), (kind, reply)
            if SPAMC is not None:
                r = subprocess.run([SPAMC, "-d", "127.0.0.1", "-p", str(host.port)], input=raw, capture_output=True,
                                   timeout=60)
                assert (r.returncode, r.stdout) == (0, raw), (kind, r.stderr)
            r = run("store", "push", model_file, url)  # what the error says to do
            assert r.returncode == 0, (kind, r.stderr)
            assert host.ask(request("CHECK", raw)) == want, kind
    finally:
        host.stop()


@pytest.mark.skipif(shutil.which("procmail") is None or shutil.which("maildrop") is None,
                    reason="procmail or maildrop is not installed (scripts/test.sh installs them when run as root)")
def test_procmail_and_maildrop_deliver_the_message_when_the_store_is_malformed(server, url, model_file, tmp_path):
    """docs/delivery.md's recipes (`filter --exit-zero`) with `$SPAMNB_STORE` naming a store
    that holds a malformed value: procmail delivers the message unchanged to the inbox, and
    maildrop does too instead of deferring it (EX_TEMPFAIL) for as long as the store stays bad."""
    from test_e2e import as_installed, delivered, make_maildir, passed_through, procmail_deliver, readme_block

    from conftest import strip_from_line

    backend = pushed(url, model_file)
    raw = strip_from_line(sample_messages()[4])  # procmail takes a From_ line for the envelope
    malform(server.client(), backend, raw, "nan-token")
    home = tmp_path / "home"
    make_maildir(home / "Maildir")
    log = procmail_deliver(home, raw, f"SPAMNB_STORE={url}")
    assert delivered(home / "Maildir") == [raw] and not (home / "Maildir" / ".Junk").exists()
    assert "holds a malformed model" in log and "Traceback" not in log, log
    for f in (home / "Maildir" / "new").iterdir():
        f.unlink()
    make_maildir(home / "Maildir" / ".Junk")
    rc = tmp_path / "mailfilter"
    rc.write_text(f'HOME="{home}"\n' + as_installed(readme_block("maildrop")))
    rc.chmod(0o600)
    env = {"HOME": str(home), "SPAMNB_STORE": url, **dict(s.split("=", 1) for s in passed_through())}
    proc = subprocess.run(["maildrop", str(rc)], input=raw, capture_output=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr  # not 75: delivered, not deferred
    assert delivered(home / "Maildir") == [raw] and delivered(home / "Maildir" / ".Junk") == []


def test_a_learn_gives_the_buckets_it_writes_the_stores_ttl(server, url, model_file):
    """Every bucket a learn writes lives keep_factor x age_days days from that write (only
    the push gave them one before: a bucket a learn made new lived forever), also when
    prune's rule says 0 days (an EXPIRE of 0 would delete what the learn just wrote)."""
    from spamnb.mail.tokenizer import tokenize
    from spamnb.storage.scorer import token_hash

    backend = pushed(url, model_file)
    c = server.client()
    for k in c.scan_iter(match=backend.prefix + b"*:b:*", count=1000):
        c.expire(k, 100)  # as if pushed long ago
    raws = sample_messages()[:5]
    backend.learn([(raw, "ham", None) for raw in raws])
    st = backend.settings()
    written = {backend._bucket(st.epoch, token_hash(t) % st.buckets) for raw in raws
               for t in tokenize(raw, backend.tokenizer())}
    assert written and all(c.ttl(k) > 80 * 86400 for k in written), sorted(c.ttl(k) for k in written)[:5]
    upkeep.age_out(backend, older_than_days=0, max_messages=0)  # learners age by this rule from now on
    backend.learn([(raws[0], "spam", None)])
    st = backend.settings(refresh=True)
    assert st.s["age_days"] == 0
    mine = {backend._bucket(st.epoch, token_hash(t) % st.buckets) for t in tokenize(raws[0], backend.tokenizer())}
    assert all(86000 < c.ttl(k) <= 86400 for k in mine), sorted(c.ttl(k) for k in mine)[:5]


def test_a_store_user_name_cannot_reach_another_users_keys(url):
    """A store user's model lives under ``P u:NAME:``: a name with ':' (``bob:u:alice``
    would be alice's keys under bob's), a wildcard, a space, or longer than 128 characters
    is refused, for IMAP logins too (they reach it without spamd's name check)."""
    from spamnb.cli.imap import _judge_and_learn
    from spamnb.storage.store import ModelError

    shared = spamd_store(url)
    for name in ("alice@example.org", "a" * 128):
        assert shared.for_user(name).prefix == shared.prefix + b"u:" + name.encode() + b":"
        _judge_and_learn(None, True, store=url, user=name)
    for name in ("a" * 129, "alice:meta", "bob:u:alice", "a*", "two words"):
        with pytest.raises(ModelError, match="cannot name a model in a store"):
            shared.for_user(name)
        with pytest.raises(ModelError, match="cannot name a model in a store"):
            _judge_and_learn(None, True, store=url, user=name)
