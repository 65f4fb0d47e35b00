"""The site in the store (spamnb.storage.redissite): each process's heartbeat, and the Site
view of ``spamnb web --store`` that shows them, against a real redis-server on a private
socket (tests/test_redis_store.py's). What a beat holds, that it costs a delivery nothing,
that a store down is one line, the up/silent/stopped rule, and hostile beats shown
escaped and clipped, never a 500. tests/test_web_browser.py shows it in Chromium with two
hosts and a Sentinel failover."""

from __future__ import annotations

import html
import re
import time

import pytest

from spamnb import __version__
from spamnb.delivery.events import Counts, Recorder
from spamnb.storage import redissite
from spamnb.storage.redisstore import RedisBackend
from spamnb.web import pages
from spamnb.web.storesite import StoreSite
from test_redis_history import acl_url
from test_redis_store import pushed, server, url  # noqa: F401 - the fixtures
from test_redis_store import pytestmark as redis_marks
from test_spamd import _free_port
from webpage import HOSTILE, Web

pytestmark = redis_marks


def recorded():
    """A recorder that saw what a day of a server sees: verdicts by two ways in, a message
    passed unscanned, a refused connection, a learn by TELL and by ``filter -u``, a forget."""
    rec = Recorder(lines=False)
    for via, label in (("spamd", "spam"), ("spamd", "spam"), ("spamd", "ham"), ("socket", "unsure")):
        rec.message(via, label, 1.0, 0.5, (0.2, 0.9), 100, 0.001)
    rec.message("socket", "ham", -9.0, 0.001, (0.2, 0.9), 100, 0.001, learned="ham")
    rec.error("ex_ioerr", "cannot read the model", via="spamd", unscanned=True)
    rec.error("refused", count=3)
    rec.learned("spam", "tell")
    rec.forgotten("spam", "tell")
    return rec


def hash_of(server, backend, member):
    return {k.decode(): v.decode() for k, v in server.client().hgetall(redissite.host_key(backend, member)).items()}


def test_a_beat_holds_who_since_when_and_the_counts_the_recorder_keeps(server, url):
    backend = RedisBackend.from_url(url)
    rec = recorded()
    beat = redissite.Heartbeat(backend, rec.counts, "serve", host="mx1")
    before = time.time()
    beat.beat()
    held = hash_of(server, backend, "mx1 serve")
    assert set(held) == set(redissite.FIELDS)
    assert (held["host"], held["role"], held["version"], held["stopped"]) == ("mx1", "serve", __version__, "0.0")
    assert {k: int(held[k]) for k in redissite.COUNTS} == {"ham": 2, "unsure": 1, "spam": 2, "unscanned": 1,
                                                           "errors": 4, "learned": 2, "forgotten": 1}
    assert float(held["started"]) == rec.counts.started <= before <= float(held["beat"]) <= time.time()
    assert float(held["every"]) == redissite.BEAT
    # the minute before: none yet, so since the start, with no message then
    assert (float(held["then"]), int(held["then_messages"])) == (rec.counts.started, 0)
    c = server.client()
    index = redissite.index_key(backend)
    assert c.zscore(index, "mx1 serve") == pytest.approx(float(held["beat"]))
    for key in (index, redissite.host_key(backend, "mx1 serve")):
        assert redissite.TTL - 5 < c.ttl(key) <= redissite.TTL  # a host gone for good leaves in a day


def test_messages_a_minute_come_from_the_beat_a_minute_before():
    counts = Counts()
    counts.started = 1000.0
    beat = redissite.Heartbeat.__new__(redissite.Heartbeat)  # its fields only: no store
    beat.counts, beat.host, beat.role, beat.version, beat.every = counts, "mx1", "serve", "v", 10.0
    beat.seen = redissite.collections.deque([(counts.started, 0)])
    for t in range(1010, 1100, 10):  # a message a second
        for _ in range(10):
            counts.message("spamd", "ham")
        fields = beat.fields(float(t))
    assert (float(fields["then"]), fields["then_messages"]) == (1030.0, 30)  # the newest beat a minute old
    row = redissite.checked(b"mx1 serve", 1090.0, [str(fields[k]).encode() for k in redissite.FIELDS], now=1091.0)
    assert row["up"] and row["per_minute"] == pytest.approx(60.0)


@pytest.mark.parametrize("age, stopped, state", [(5, 0, "up"), (29, 0, "up"), (31, 0, "silent"), (5, 1, "stopped"),
                                                 (600, 0, "silent")])
def test_up_is_a_beat_younger_than_three_beats(age, stopped, state):
    now = 10_000.0
    values = {"beat": now - age, "every": 10.0, "stopped": now - age if stopped else 0.0, "ham": 1, "unsure": 0,
              "spam": 0, "then": now - age - 60, "then_messages": 0}
    row = redissite.checked(b"mx1 serve", now - age, [None if values.get(k) is None else str(values[k]).encode()
                                                      for k in redissite.FIELDS], now)
    assert row["up"] == (state == "up")
    assert (row["stopped"] is not None) == (state == "stopped")
    assert (row["per_minute"] is None) == (state != "up")  # a rate only for a host that is up
    assert f'class="state {state}"' in pages.host_state(row, now)


def test_beats_come_from_a_thread_and_cost_a_delivery_no_request(server, url):
    """Every ``every`` seconds from its own thread; a thousand deliveries' events in between
    send nothing to the store (the counts are a process's own); stopping writes a last beat
    that says so."""
    backend = RedisBackend.from_url(url)
    rec = Recorder(lines=False)
    beat = redissite.Heartbeat(backend, rec.counts, "serve", host="mx1", every=0.3).start()
    c = server.client()
    key = redissite.host_key(backend, "mx1 serve")
    deadline = time.monotonic() + 10
    while not c.exists(key) and time.monotonic() < deadline:
        time.sleep(0.02)
    c.config_resetstat()
    for _ in range(1000):
        rec.message("spamd", "ham", -9.0, 0.001, (0.2, 0.9), 100, 0.001)
    calls = sum(v["calls"] for k, v in c.info("commandstats").items() if k not in ("cmdstat_info",))
    assert calls <= 1  # at most a beat that fell in between: no request per message
    time.sleep(0.8)
    assert int(hash_of(server, backend, "mx1 serve")["ham"]) == 1000
    beat.close()
    assert not beat.thread.is_alive()
    held = hash_of(server, backend, "mx1 serve")
    assert float(held["stopped"]) > 0 and held["stopped"] == held["beat"]


def test_a_beat_still_under_way_when_it_stops_gets_no_last_beat_beside_it(server, url):
    """A beat that hangs (a store that does not answer) past close's wait is left alone: no
    last beat is written beside it, from another thread."""
    import threading

    backend = RedisBackend.from_url(url)
    beat = redissite.Heartbeat(backend, Counts(), "serve", host="mx1", every=60)
    hung, written = threading.Event(), []
    beat.beat = lambda stopped=False: written.append(stopped) if stopped else hung.wait(10)
    beat.start()
    try:
        beat.close(wait=0.2)
        assert beat.thread.is_alive() and written == []
    finally:
        hung.set()
    beat.thread.join(10)
    beat.close()  # once it ended: the last beat
    assert written == [True]


def test_a_store_that_stops_answering_is_one_line_and_one_when_it_answers_again(server, url):
    backend = RedisBackend.from_url(url + "&timeout=0.5")
    logged = []
    beat = redissite.Heartbeat(backend, Counts(), "serve", host="mx1", every=0.05, log=logged.append).start()
    try:
        time.sleep(0.3)
        server.stop()
        time.sleep(1.0)  # many beats lost
        assert len(logged) == 1 and logged[0].startswith("heartbeat: not written (and none until the store answers): "
                                                         "cannot write the heartbeat: cannot reach the store")
        server.start()
        deadline = time.monotonic() + 10
        while len(logged) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        assert logged[1:] == ["heartbeat: the store answers again"]
        assert backend._reach.ok is None  # a beat is not what the store's gauges report (the reads)
    finally:
        beat.close()


def test_serve_beats_what_it_answered_and_says_when_it_stopped(server, url, model_file, tmp_path):
    """A real ``serve --spamd --store``: it beats at once as it listens, its next beat (within
    one interval) holds the verdicts and the TELL it answered, and its last one, as it stops,
    says so; one heartbeat line in its log at most (none: the store answered throughout)."""
    import socket as sockets

    from test_redis_store import Spamd, sample_messages

    pushed(url, model_file)
    backend = RedisBackend.from_url(url)
    member = f"{redissite.host_name()} serve"
    host = Spamd(url, tmp_path / "h")
    try:
        deadline = time.monotonic() + 5
        while not hash_of(server, backend, member) and time.monotonic() < deadline:  # its first beat, as it listens
            time.sleep(0.05)
        assert hash_of(server, backend, member)["role"] == "serve"
        raws = sample_messages()[:3]
        for raw in raws:
            host.check(raw)
        host.tell(raws[0], "spam")
        deadline = time.monotonic() + redissite.BEAT + 10
        while time.monotonic() < deadline:
            held = hash_of(server, backend, member)
            if sum(int(held[k]) for k in ("ham", "unsure", "spam")) == 3:
                break
            time.sleep(0.2)
        assert sum(int(held[k]) for k in ("ham", "unsure", "spam")) == 3 and held["learned"] == "1", held
        assert held["stopped"] == "0.0" and int(held["errors"]) == 0
    finally:
        host.stop()
    held = hash_of(server, backend, member)
    assert float(held["stopped"]) > 0
    assert "heartbeat" not in host.proc_log and "Traceback" not in host.proc_log
    assert sockets.gethostname()[:255] == redissite.host_name()


@pytest.mark.slow  # about 11 s: a private Dovecot and a beat to wait for
def test_imap_filter_watch_beats_as_imap_and_its_login(server, url, model_file, dovecot, tmp_path):
    """``imap filter --watch --store`` against a real Dovecot beats as ``HOST imap LOGIN``: its
    verdicts show in a beat, and its stop in the last one."""
    import subprocess

    from test_e2e import SPAMNB
    from test_imap import _stop, _wait_for, account
    from test_redis_store import sample_messages

    pushed(url, model_file)
    backend = RedisBackend.from_url(url)
    member = f"{redissite.host_name()} imap {dovecot.user}"
    for raw in sample_messages()[:2]:
        dovecot.append("INBOX", raw)
    proc = subprocess.Popen(SPAMNB + ["imap", "filter", *account(dovecot, tmp_path), "--store", url, "--watch",
                                      "--interval", "2", "--no-learn-verdicts"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def verdicts():
            held = hash_of(server, backend, member)
            return held and sum(int(held[k]) for k in ("ham", "unsure", "spam"))
        assert _wait_for(lambda: verdicts() == 2, redissite.BEAT + 20), hash_of(server, backend, member)
    finally:
        code, err = _stop(proc)
    assert code == 0 and "Traceback" not in err, err
    held = hash_of(server, backend, member)
    assert held["role"] == f"imap {dovecot.user}" and float(held["stopped"]) > 0


def test_a_host_silent_for_a_day_leaves_the_index(server, url):
    backend = RedisBackend.from_url(url)
    c = server.client()
    index = redissite.index_key(backend)
    c.zadd(index, {"gone serve": time.time() - redissite.TTL - 60, "recent serve": time.time() - 60})
    redissite.Heartbeat(backend, Counts(), "serve", host="mx1").beat()
    assert sorted(c.zrange(index, 0, -1)) == [b"mx1 serve", b"recent serve"]


def test_the_documented_acl_user_beats_and_reads_the_beats(server, url, model_file, tmp_path):
    """docs/many-hosts.md's spamnb user (its commands, its prefix) writes a beat and reads the page's view."""
    backend = RedisBackend.from_url(acl_url(server, url, "site-doc", tmp_path))
    redissite.Heartbeat(backend, recorded().counts, "serve", host="mx1").beat()
    rows, more = redissite.hosts(backend)
    assert [(r["host"], r["role"], r["spam"], r["up"]) for r in rows] == [("mx1", "serve", 2, True)] and not more
    assert redissite.servers(backend)["role"] == "master"


def plant(server, backend, member, when, **fields):
    """A beat as any host with the store's password can write it: whatever it likes."""
    c = server.client()
    c.zadd(redissite.index_key(backend), {member: when})
    if fields:
        c.hset(redissite.host_key(backend, member) if isinstance(member, str) else backend.prefix + b"site:" + member,
               mapping=fields)


def test_the_site_view_shows_each_host_its_state_and_the_store(server, url, model_file):
    """Two hosts up with their counts, one that stopped, one silent for five minutes, one
    that beat two hours ago (not shown); the store's one Redis and its role."""
    pushed(url, model_file)
    backend = RedisBackend.from_url(url)
    redissite.Heartbeat(backend, recorded().counts, "serve", host="mx1").beat()
    redissite.Heartbeat(backend, Counts(), "imap alice", host="mx2").beat()
    redissite.Heartbeat(backend, Counts(), "serve", host="mx3").beat(stopped=True)
    now = time.time()
    plant(server, backend, "mx4 serve", now - 300, host="mx4", role="serve", beat=repr(now - 300), every="10",
          stopped="0", spam="7", version="0.0.9")
    plant(server, backend, "mx5 serve", now - 7200, host="mx5", role="serve", beat=repr(now - 7200))
    web = Web(None, None, where=["--store", url])
    try:
        status, _, page = web.get("/site")
    finally:
        web.stop()
    assert status == 200 and "Traceback" not in web.log
    rows = re.findall(r'<tr class="host">(.*?)</tr>', page)
    names = [re.search(r'<td class="name">(.*?)</td>', r).group(1) for r in rows]
    assert names[-1] == "mx4" and set(names) == {"mx1", "mx2", "mx3", "mx4"}  # newest first; mx5 too old
    by = dict(zip(names, rows))
    assert 'class="state up"' in by["mx1"] and "<td>serve</td>" in by["mx1"]
    assert '<td class="n">2 / 1 / 2</td><td class="n">1</td><td class="n">4</td><td class="n">2 / 1</td>' in by["mx1"]
    assert f"<td>{__version__}</td>" in by["mx1"]
    assert "<td>imap alice</td>" in by["mx2"] and 'class="state up"' in by["mx2"]
    assert 'class="state stopped"' in by["mx3"]
    assert 'class="state silent">silent</span> since' in by["mx4"] and "(5 min)" in by["mx4"]
    assert "One Redis (no Sentinels in the URL): its role is <strong>master</strong>" in page
    assert '<a href="' + web.root + '/site" class="on">Site</a>' in page


HUGE = "x" * 100_000


@pytest.mark.parametrize("member, fields", [
    (HOSTILE, {"host": HOSTILE, "role": HOSTILE, "version": HOSTILE, "spam": "<b>1</b>"}),
    ("evil\x1b[2J\r\nhost serve", {"host": "a\x00b\x1b[31m\u202eevil\n", "ham": "-1", "unsure": "1e3", "spam": "NaN"}),
    (HUGE + " serve", {"host": HUGE, "version": HUGE, "ham": "9" * 40, "beat": "1e300", "started": "inf",
                       "then": "nan", "then_messages": "x", "every": "0"}),
    (b"\xff\xfe bad-utf8", {b"host": b"\xff\xfe\xc3", b"role": b"\xc3\x28", b"learned": b"\xff"}),
    ("nohash serve", {}),
])
def test_hostile_beats_are_shown_escaped_and_clipped_never_a_500(server, url, model_file, member, fields):
    """A host name of HTML, of control characters (a terminal's escapes, a line break, a bidi
    override, NUL), 100,000 characters, bytes that are not UTF-8, counts that are not numbers,
    times no clock gives, an index entry without its hash: the page answers 200 and shows
    each as text, clipped, with "?" for what is not a count."""
    pushed(url, model_file)
    backend = RedisBackend.from_url(url)
    plant(server, backend, member, time.time() - 5, **{
        (k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()})
    view = StoreSite(backend).site_view()
    page = pages.site_page(view)
    assert "<script" not in page and "<img" not in page and "<b>1" not in page
    body = html.unescape(page.split("<tbody>", 1)[1].split("</tbody>", 1)[0])
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", body)  # every control character replaced
    assert len(page) < 10_000  # clipped: a name of 100,000 characters is not sent
    row = view["hosts"][0]
    assert all(row[k] is None or isinstance(row[k], int) and row[k] >= 0 for k in redissite.COUNTS)
    if "ham" in fields or b"learned" in fields or "spam" in fields:
        assert "?" in body
    web = Web(None, None, where=["--store", url])
    try:
        status, _, served = web.get("/site")
    finally:
        web.stop()
    assert status == 200 and "Traceback" not in web.log and "<script" not in served


def test_at_most_fifty_hosts_are_shown_the_newest(server, url, model_file):
    pushed(url, model_file)
    backend = RedisBackend.from_url(url)
    now = time.time()
    for i in range(60):
        plant(server, backend, f"h{i:02d} serve", now - 600 + i, host=f"h{i:02d}", beat=repr(now - 600 + i))
    rows, more = redissite.hosts(backend)
    assert len(rows) == redissite.MAX_HOSTS == 50 and more
    assert [r["host"] for r in rows] == [f"h{i:02d}" for i in range(59, 9, -1)]
    assert "Other hosts beat in the last hour too: the 50 whose beats are newest are shown." in \
        pages.site_page(StoreSite(backend).site_view())


def test_sentinels_that_do_not_answer_are_said_on_the_page():
    """A Sentinel URL whose Sentinels are not there: the page answers, saying that no Sentinel
    answered (each one's error) and that the store did not answer for the hosts."""
    ports = [_free_port(), _free_port()]
    backend = RedisBackend.from_url(f"redis+sentinel://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/spamnb/0"
                                    f"?prefix=t:&timeout=0.5")
    started = time.monotonic()
    view = StoreSite(backend).site_view()
    assert time.monotonic() - started < 5
    page = pages.site_page(view)
    assert view["error"] and "The store did not answer: cannot read the heartbeats" in page
    assert page.count("did not answer (") == 2 and "No Sentinel answered" in page
    assert "A Sentinel group, service <code>spamnb</code>" in page
    assert '<meta http-equiv="refresh" content="10">' in page  # a view to watch: it loads itself again


def test_a_model_file_has_no_site():
    page = pages.site_page(None)
    assert "run <code>spamnb web --store URL</code>" in page
    assert 'http-equiv="refresh"' not in page
