"""``spamnb web`` over HTTP: the token, CSRF, escaping, paging, learning
(the browser's view is tests/test_web_browser.py)."""

from __future__ import annotations

import contextlib
import html
import re
import sqlite3
import subprocess
import time

import pytest

from spamnb.storage import history
from spamnb.verdict import threshold
from spamnb.storage.modelfile import load_model
from spamnb.web.data import Site
from spamnb.mail.tokennames import describe
from spamnb.web.pages import LIST_CHIPS, PAGE_CHIPS, clue_chips, learned_note
from test_e2e import SPAMNB
from test_fastpath import compiled, messages  # noqa: F401 (compiled: a fixture)
from webpage import HOSTILE, Web, WebHere, fill, hostile_message, multipart_form


@pytest.fixture
def site(compiled, tmp_path):
    mail = messages()[:12]
    hist = tmp_path / "h.sqlite"
    fill(hist, [*mail, hostile_message()], unsure={0, 1, 2, 3, 12})
    web = Web(compiled, hist)
    yield web, mail, compiled
    web.stop()


def csrf_of(body):
    return re.search(r'name="csrf" value="([0-9a-f]+)"', body).group(1)


def test_every_request_needs_the_token(site):
    web, _, _ = site
    for path in ("/", "/unsure", "/history", "/overview", "/model", "/message/1", "/nope"):
        status, _, body = web.get(path, owner=False)
        assert status == 403 and "token" in body and "/history" not in body, path
    status, _, body = web.get("/static/style.css", owner=False)  # the one thing served without it
    assert status == 200 and "{" in body
    status, _, _ = web.get("/unsure?token=wrong", owner=False)
    assert status == 403
    status, _, _ = web.get("/learn", owner=False, data=b"id=1&label=spam&csrf=x")
    assert status == 403


def test_the_token_in_the_url_leads_to_the_pages_own_address_and_sets_no_cookie(site):
    web, _, _ = site
    status, headers, _ = web.get(f"/history?q=x&token={web.token}", owner=False)
    assert status == 303 and headers["Location"] == web.root + "/history?q=x"
    assert web.token not in headers["Location"] and "Set-Cookie" not in headers
    assert web.get("/history?q=x")[0] == 200


def test_no_cookie_is_taken_for_the_token(site):
    """A browser sends 127.0.0.1's cookies to every port of it: a cookie, whatever its name and
    value (the token itself, the page's key), opens nothing."""
    web, _, _ = site
    port = web.base.rsplit(":", 1)[1]
    key = web.root.rsplit("/", 1)[1]
    for value in (web.token, key, "anything", ""):
        for name in (f"spamnb_token_{port}", "spamnb_token", "token"):
            cookie = {"Cookie": f"{name}={value}"}
            for path in ("/unsure", "/message/1", "/", *((f"/s/{value}/unsure",) if value != key else ())):
                status, _, body = web.get(path, owner=False, headers=cookie)
                assert status == 403 and "needs its token" in body, (name, value, path)
            status, _, _ = web.get("/learn", owner=False, headers=cookie, data=b"id=1&label=spam&csrf=x")
            assert status == 403


def test_a_wrong_or_partial_key_is_refused(site):
    web, _, _ = site
    key = web.root.rsplit("/", 1)[1]
    for root in ("/s/" + key[:-1], "/s/" + key + "x", "/s/" + key.upper(), "/s/", "/s", "/" + key):
        status, _, _ = web.get(root + "/unsure", owner=False)
        assert status == 403, root


def test_first_page_is_the_unsure_queue_and_every_answer_has_a_strict_csp(site):
    web, _, _ = site
    status, headers, _ = web.get("/")
    assert status == 303 and headers["Location"] == web.root + "/unsure"
    status, headers, body = web.get("/unsure")
    assert status == 200
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp and "'unsafe-inline'" not in csp
    assert headers["X-Frame-Options"] == "DENY" and headers["Referrer-Policy"] == "no-referrer"
    assert body.count('<tr id="m') == 5 and "<script" not in body


def test_the_site_tab_of_a_model_file_says_it_is_for_a_store(site):
    """Every page links the Site view; over a model file it says that the site's hosts beat
    into a store (``spamnb web --store``), without asking anything."""
    web, _, _ = site
    _, _, body = web.get("/unsure")
    assert f'<a href="{web.root}/site">Site</a>' in body
    status, headers, body = web.get("/site")
    assert status == 200 and "run <code>spamnb web --store URL</code>" in body
    assert "default-src 'none'" in headers["Content-Security-Policy"]


def test_hostile_fields_are_escaped_everywhere(site):
    web, mail, _ = site
    hostile_id = len(mail) + 1
    for path in ("/unsure", "/history", f"/message/{hostile_id}", "/history?q=" + "%3Cimg"):
        _, _, body = web.get(path)
        assert HOSTILE not in body and "<script>document" not in body, path
        assert html.escape(HOSTILE, quote=True) in body, path
    _, _, body = web.get(f"/message/{hostile_id}")
    assert "<img" not in body and "&lt;img src=&quot;http://example.org/track.png&quot;&gt;" in body


def test_a_post_needs_the_csrf_token(site):
    web, _, model = site
    before = load_model(model).messages.copy()
    status, _, body = web.get("/learn", data=b"id=1&label=spam&csrf=0123&back=/unsure")
    assert status == 403 and "CSRF" in body
    status, _, _ = web.get("/learn", data=b"id=1&label=spam&back=/unsure")
    assert status == 403
    assert (load_model(model).messages == before).all()


def test_learning_from_the_page_is_spamnb_learn_and_rescores(site):
    web, mail, model = site
    _, _, body = web.get("/unsure")
    before = load_model(model).messages.copy()
    status, headers, _ = web.get("/learn", data=f"id=1&label=spam&csrf={csrf_of(body)}&back=//evil".encode())
    assert status == 303 and headers["Location"] == web.root + "/unsure"  # never off the site
    after = load_model(model).messages
    assert after[1] == before[1] + 1 and after[0] == before[0]
    _, _, body = web.get("/unsure")
    assert 'id="m1"' not in body and body.count('<tr id="m') == 4
    assert learned_note([history.fields(mail[0])["subject"]], "spam") + ". " in body
    assert "Re-scored the unsure messages" in body
    # the same message again through the command line: already learned, counted once
    proc = subprocess.run(SPAMNB + ["learn", "--spam", "--model", str(model), "-"], input=mail[0],
                          capture_output=True)
    assert proc.returncode == 0 and load_model(model).messages[1] == after[1]
    _, _, body = web.get("/history?verdict=unsure")
    assert "taught as" in body


@pytest.mark.parametrize("back, want", [
    ("//evil.example/", "/unsure"), ("http://evil.example/", "/unsure"), ("/unsure%5C..", "/unsure"),
    ("/x%0d%0aSet-Cookie:%20a=b", "/unsure"),  # a header smuggled into the redirect
    ("/history%3Fq%3D%253Cx%253E%26page%3D1", "/history?q=%3Cx%3E&page=1"),  # what the History page's form sends
])
def test_after_a_choice_the_page_goes_back_only_to_a_path_of_its_own(site, back, want):
    web, _, _ = site
    _, _, body = web.get("/unsure")
    status, headers, _ = web.get("/learn", data=f"id=2&label=ham&csrf={csrf_of(body)}&back={back}".encode())
    assert status == 303 and "Set-Cookie" not in headers and headers["Location"] == web.root + want


def test_learning_a_message_not_kept_is_refused(site):
    web, _, _ = site
    _, _, body = web.get("/unsure")
    status, _, text = web.get("/learn", data=f"id=99999&label=spam&csrf={csrf_of(body)}".encode())
    assert status == 400 and "not kept" in text
    status, _, text = web.get("/learn", data=f"id=1&label=evil&csrf={csrf_of(body)}".encode())
    assert status == 400


def test_search_by_subject_verdict_and_date(site):
    web, mail, _ = site
    from spamnb.storage.history import fields

    word = fields(mail[5])["subject"].split()[-1]
    _, _, body = web.get("/history?q=" + word)
    assert 'id="m6"' in body
    _, _, body = web.get("/history?verdict=unsure")
    assert body.count('<tr id="m') == 5
    _, _, body = web.get("/history?since=2000-01-01&until=2000-01-02")
    assert "No verdict matches" in body
    _, _, body = web.get("/history?q=%25")  # LIKE's wildcard is a plain character here
    assert "No verdict matches" in body or body.count('<tr id="m') < 13


def test_the_message_page_shows_the_envelope_when_known_as_text(compiled, tmp_path):  # noqa: F811
    """A verdict the milter recorded shows who sent it (the client's address, HELO, envelope
    sender and recipients, queue id), every value escaped; one recorded without an envelope shows
    none of those lines; the search finds a message by its envelope's recipient."""
    hist = tmp_path / "h.sqlite"
    first, second = messages()[:2]
    db = history.open_db(hist)
    history.write(db, [history.row(first, "ham", -9.0, 0.001, via="milter", raddr="192.0.2.9", envelope={
        "helo": "<b>helo</b>", "sender": "a\"<script>@example.org", "rcpt": "bob@example.com,carol@example.com",
        "qid": "4ABC123"}), history.row(second, "ham", -9.0, 0.001, via="filter")])
    db.close()
    web = Web(compiled, hist)
    try:
        status, _, page = web.get("/message/1")
        assert status == 200
        for shown in ("<dt>Client address</dt><dd>192.0.2.9</dd>", "<dt>HELO</dt><dd>&lt;b&gt;helo&lt;/b&gt;</dd>",
                      "<dt>Envelope sender</dt><dd>a&quot;&lt;script&gt;@example.org</dd>",
                      "<dt>Envelope recipients</dt><dd>bob@example.com,carol@example.com</dd>",
                      "<dt>Queue ID</dt><dd>4ABC123</dd>"):
            assert shown in page, shown
        assert "<b>helo" not in page and "<script>@" not in page
        _, _, page = web.get("/message/2")
        assert not any(f"<dt>{k}</dt>" in page for k in ("Client address", "HELO", "Envelope sender",
                                                         "Envelope recipients", "Queue ID"))
        _, _, page = web.get("/history?q=carol%40example")
        assert page.count('<tr id="m') == 1 and 'id="m1"' in page
    finally:
        web.stop()
    assert "Traceback" not in web.log


def test_a_large_history_is_read_a_page_at_a_time(compiled, tmp_path):
    hist = tmp_path / "big.sqlite"
    fill(hist, messages()[:3], unsure={0}, extra=20_000)
    web = Web(compiled, hist)
    try:
        _, _, body = web.get("/history")
        assert body.count('<tr id="m') == 25 and "page 1 of 801 (20003 messages)" in body
        assert len(body) < 100_000
        _, _, body = web.get("/history?page=800")
        assert body.count('<tr id="m') == 3 and "page 801 of 801" in body
        status, _, body = web.get("/overview")
        assert status == 200 and body.count("<svg") == 2  # no corrections yet: a sentence instead
        status, _, body = web.get("/model")
        assert status == 200 and "would drop" in body
    finally:
        web.stop()


def watch(monkeypatch):
    """``(connections, statements)``: the history connections this process opens from now
    on and every statement run on them (sqlite3's trace callback), the server's threads' too."""
    opened, statements = [], []
    real = history.open_db

    def counted(*args, **kwargs):
        db = real(*args, **kwargs)
        opened.append(db)
        db.set_trace_callback(statements.append)
        return db

    monkeypatch.setattr(history, "open_db", counted)
    return opened, statements


def test_a_list_page_reads_its_rows_and_messages_in_one_connection_and_the_same_queries_for_any_n(
        compiled, tmp_path, monkeypatch):
    """The review's N+1: each row of the Unsure and History pages was read again with its
    message (a connection and three queries a row). Now a page of 3 rows and one of 20 cost
    the same: one connection, the same statements; and each row still has its clues."""
    mail = messages()[:20]
    cost = {}
    for n in (3, 20):
        hist = tmp_path / f"h{n}.sqlite"
        fill(hist, mail[:n], unsure=set(range(n)))
        web = WebHere(compiled, hist)
        opened, statements = watch(monkeypatch)
        try:
            for path in ("/unsure", "/history"):
                opened.clear()
                statements.clear()
                status, _, body = web.get(path)
                assert status == 200 and body.count('<tr id="m') == n, path
                cost[path, n] = (len(opened), len(statements))
                clues = Site(compiled, False, hist).clues
                for raw in mail[:n]:  # the clues `spamnb explain` lists, under their row
                    assert clue_chips(clues(raw)) in body, path
        finally:
            web.stop()
            monkeypatch.undo()
    for path in ("/unsure", "/history"):
        assert cost[path, 3] == cost[path, 20], (path, cost)
        assert cost[path, 3] == (1, 2), (path, cost)  # one connection: the count and the page with its messages


def test_every_page_and_a_choice_use_at_most_one_connection_closed_after_it(compiled, tmp_path, monkeypatch):
    hist = tmp_path / "h.sqlite"
    fill(hist, messages()[:6], unsure={0, 1, 2})
    web = WebHere(compiled, hist)
    opened, _ = watch(monkeypatch)
    try:
        for path in ("/", "/unsure", "/history?q=a&verdict=ham&page=1", "/message/1", "/message/999", "/overview",
                     "/model"):
            opened.clear()
            status, _, _ = web.get(path)
            assert status in (200, 303, 404) and len(opened) <= 1, (path, len(opened))
        opened.clear()
        status, _, _ = web.get("/learn", data=f"id=1&label=spam&csrf={web.server.csrf}".encode())
        assert status == 303 and len(opened) == 1  # the message, its mark, re-scoring the queue
        deadline = time.monotonic() + 10  # the answer is sent before the request's connection is closed
        while not all(map(closed, opened)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(map(closed, opened))
        _, _, body = web.get("/history?verdict=unsure")
        assert "taught as" in body and body.count('<tr id="m') == 3
    finally:
        web.stop()


def closed(db):
    try:
        db.total_changes
    except sqlite3.ProgrammingError:
        return True
    return False


def test_listening_beyond_loopback_needs_allow(compiled, tmp_path):
    proc = subprocess.run(SPAMNB + ["web", "--model", str(compiled), "--listen", "0.0.0.0:0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--allow CIDR" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run(SPAMNB + ["web", "--model", str(compiled), "--listen", "/tmp/x"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "HOST:PORT" in proc.stderr


# -- requests the page cannot make sense of ------------------------------------------------


def raw_exchange(web, request: bytes, timeout=20) -> bytes:
    """Everything the server sends back on one connection for ``request``, until it closes it."""
    import socket

    host, port = web.base.rsplit("/", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_more_than_20_query_fields_is_a_400_with_or_without_the_key(site):
    web, _, _ = site
    many = "&".join(f"f{i}=1" for i in range(21))
    for owner in (True, False):
        for path in ("/unsure", "/history", "/message/1", "/learn"):
            status, _, body = web.get(f"{path}?{many}", owner=owner)
            assert status == 400 and "too many fields" in body, (owner, path)
        status, _, body = web.get(f"/learn?{many}", owner=owner, data=b"id=1&label=spam&csrf=x")
        assert status == 400 and "too many fields" in body
    status, _, _ = web.get("/history?" + "&".join(f"f{i}=1" for i in range(20)))
    assert status == 200  # 20 are fine
    web.stop()
    assert "Traceback" not in web.log, web.log


@pytest.mark.parametrize("path, want", [
    ("/unsure?page=99999999999999999999999", 400), ("/history?page=99999999999999999999999", 400),
    ("/unsure?page=%C2%B2", 400), ("/history?page=-1", 400), ("/history?page=1e3", 400),
    ("/history?page=999999999", 200),  # far past the end: an empty page
    ("/model?older_than=%C2%B2", 400), ("/model?max_messages=99999999999999999999", 400),
    ("/message/99999999999999999999999", 404), ("/message/%C2%B2", 404),
    ("/message/-1", 404), ("/message/", 404), ("/message/1x", 404),
])
def test_odd_or_huge_numbers_are_400_or_404_never_500(site, path, want):
    web, _, _ = site
    status, _, body = web.get(path)
    assert status == want, (path, status, body[-300:])
    web.stop()
    assert "Traceback" not in web.log and "error on" not in web.log, web.log


def test_a_post_with_the_token_in_its_url_gets_one_answer(site):
    """The printed token is exchanged for the page's address on a GET only: a POST with it in its
    URL is refused, with one answer on the connection (it was a 303 and then a 403)."""
    web, _, _ = site
    _, _, body = web.get("/unsure")
    form = f"id=1&label=spam&csrf={csrf_of(body)}".encode()
    host = web.base.rsplit("/", 1)[1]
    for path in (f"/learn?token={web.token}", f"{web.root}/learn?token={web.token}"):
        got = raw_exchange(web, f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                                f"application/x-www-form-urlencoded\r\nContent-Length: {len(form)}\r\n\r\n".encode()
                           + form)
        assert got.count(b"HTTP/1.") == 1, got[:400]
        if path.startswith("/learn"):
            assert got.startswith(b"HTTP/1.0 403"), got[:100]
    status, _, text = web.get("/learn", data=f"id=99999999999999999999999&label=spam&csrf={csrf_of(body)}".encode())
    assert status == 400 and "not kept" in text


# -- connections ---------------------------------------------------------------------------


def test_an_idle_connection_is_closed_after_the_timeout(compiled, tmp_path):
    import socket

    hist = tmp_path / "h.sqlite"
    fill(hist, messages()[:2], unsure={0})
    web = WebHere(compiled, hist)
    web.server.idle_timeout = 0.5
    try:
        host, port = web.base.rsplit("/", 1)[1].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n")  # and nothing more
            start = time.monotonic()
            assert sock.recv(100) == b""  # closed by the server, not by this socket's 10 s
            assert time.monotonic() - start < 5
    finally:
        web.stop()


def test_many_idle_connections_do_not_take_the_page_from_its_owner(compiled, tmp_path):
    """Idle connections beyond the process's open files (its soft limit, here 128): the page
    still answers its owner, at once."""
    import socket

    hist = tmp_path / "h.sqlite"
    fill(hist, messages()[:2], unsure={0})
    web = Web(compiled, hist, max_files=128)
    idle = []
    try:
        host, port = web.base.rsplit("/", 1)[1].rsplit(":", 1)
        for _ in range(300):
            try:
                sock = socket.create_connection((host, int(port)), timeout=1)
                sock.sendall(b"GET / HTTP/1.1\r\n")
                idle.append(sock)
            except OSError:  # the server's queue is full: the old server stopped accepting here
                break
        start = time.monotonic()
        status, _, body = web.get("/unsure", timeout=20)
        assert status == 200 and 'id="m1"' in body and time.monotonic() - start < 15
    finally:
        for sock in idle:
            sock.close()
        web.stop()
    assert "Traceback" not in web.log, web.log[-2000:]


def test_the_pages_cap_closes_the_oldest_idle_connections_beyond_it(compiled, tmp_path):
    """At most ``max_connections`` open: with the cap at 3, six idle connections (of one client
    allowed them all) see the three oldest closed, the three newest still open; 64 by default,
    half of them for one client."""
    import socket

    from spamnb.web import app

    hist = tmp_path / "h.sqlite"
    fill(hist, messages()[:2], unsure={0})
    web = WebHere(compiled, hist)
    srv = web.server
    assert (app.MAX_CONNECTIONS, srv.max_connections, app.SHARE, srv.share) == (64, 64, 32, 32)
    srv.max_connections, srv.share = 3, 3
    host, port = srv.server_address[:2]
    idle = []
    try:
        for _ in range(6):
            idle.append(socket.create_connection((host, port), timeout=5))
            time.sleep(0.05)  # each accepted in turn
        time.sleep(0.3)
        closed = []
        for sock in idle:
            sock.settimeout(0.5)
            try:
                closed.append(sock.recv(100) == b"")
            except TimeoutError:
                closed.append(False)
        assert closed == [True, True, True, False, False, False], closed
    finally:
        for sock in idle:
            sock.close()
        web.stop()


def test_a_flood_never_closes_a_connection_that_made_a_request_with_the_key(compiled, tmp_path):
    """At the bound, a new connection closes the oldest one that has not made a request with the
    page's key: the owner's, older than the flood but already past the key (its form still on
    its way), is served."""
    import socket

    hist = tmp_path / "h.sqlite"
    fill(hist, messages()[:2], unsure={0})
    web = WebHere(compiled, hist)
    srv = web.server
    srv.max_connections = 3
    host, port = srv.server_address[:2]
    form = f"csrf={srv.csrf}&label=spam&back=/unsure".encode()
    flood = []
    try:
        owner = socket.create_connection((host, port), timeout=20)
        owner.sendall(f"POST {srv.root}/learn HTTP/1.1\r\nHost: x\r\nContent-Length: {len(form)}\r\n\r\n".encode()
                      + form[:5])
        deadline = time.monotonic() + 10
        while not any(srv.open.values()):  # its request line read, the key found: it is the owner's
            assert time.monotonic() < deadline, "the owner's request was not read"
            time.sleep(0.01)
        for _ in range(2 * srv.max_connections):
            flood.append(socket.create_connection((host, port), timeout=5))
            time.sleep(0.05)  # each accepted in turn: every one beyond the bound closes the oldest idle one
        owner.sendall(form[5:])
        answer = owner.recv(1000)
        assert answer.startswith(b"HTTP/1.0 303") and f"Location: {srv.root}/unsure".encode() in answer, answer
    finally:
        for sock in flood:
            sock.close()
        web.stop()


def test_a_connection_from_outside_allow_is_closed_before_a_byte_is_read(compiled, tmp_path):
    import ipaddress
    import socket

    hist = tmp_path / "h.sqlite"
    fill(hist, messages()[:2], unsure={0})
    web = WebHere(compiled, hist, allowed=[ipaddress.ip_network("127.0.0.2/32")])  # this client is 127.0.0.1
    try:
        host, port = web.base.rsplit("/", 1)[1].rsplit(":", 1)
        with socket.create_connection((host, int(port)), source_address=("127.0.0.1", 0), timeout=10) as sock:
            try:
                sock.sendall(f"GET {web.root}/unsure HTTP/1.0\r\n\r\n".encode())
                got = sock.recv(100)
            except ConnectionResetError:
                got = b""
        assert got == b""
        assert any("refused (not in --allow)" in line for line in web.logged), web.logged
    finally:
        web.stop()


# -- hostile values in every field the page shows --------------------------------------------

HOSTILE_TOKENS = b"zq<xv zq\"yv zq'wv zq\"'v qq<ss>\"tt"


@pytest.fixture
def hostile_site(compiled, tmp_path):
    """A model that learned tokens holding ``<``, ``"`` and ``'`` as spam (five messages), and a
    queue with a message of those tokens recorded unsure under a hostile From and Subject (it
    moves to spam when the queue is scored again)."""
    learned = []
    for i in range(5):
        path = tmp_path / f"spam{i}.eml"
        path.write_bytes(b"From: s%d@example.net\nSubject: offer %d\nMessage-ID: <s%d@example.net>\n\n%s\n"
                         % (i, i, i, HOSTILE_TOKENS))
        learned.append(str(path))
    proc = subprocess.run(SPAMNB + ["learn", "--spam", "--model", str(compiled), *learned], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    hostile = (b"From: \"<b>evil</b> \\\"o'k\\\"\" <x@example.org>\nSubject: <i>moved</i> \"q\" 'r' <u>\n"
               b"Message-ID: <h2@example.org>\n\n" + HOSTILE_TOKENS + b"\n")
    mail = messages()[:3]
    hist = tmp_path / "h.sqlite"
    fill(hist, [*mail, hostile], unsure={0, 1, 3})
    web = Web(compiled, hist)
    yield web, hostile, compiled
    web.stop()


def test_hostile_from_and_clue_tokens_are_escaped_on_every_page(hostile_site):
    web, hostile, model = hostile_site
    sender = history.fields(hostile)["sender"]
    assert "<b>" in sender
    clues = Site(model, False, web.base).clues(hostile)
    shown = [tok for _, group, _, _ in clues.sides(*LIST_CHIPS) for tok, _ in group]
    odd = [tok for tok in shown if set(tok) & set("<\"'")]
    assert len(odd) >= 3, shown  # the hostile tokens are among the strongest clues
    for path in ("/unsure", "/history", "/message/4"):
        status, _, body = web.get(path)
        assert status == 200
        assert html.escape(sender, quote=True) in body and "<b>evil" not in body, path
        for tok in odd:
            assert f'title="{html.escape(tok, quote=True)} (' in body, (path, tok)
            assert html.escape(describe(tok), quote=True) in body, (path, tok)
        assert "qq<ss>" not in body and "zq<xv" not in body, path


def test_the_search_box_shows_a_hostile_query_as_text(site):
    web, _, _ = site
    status, _, body = web.get("/history?q=%22%3E%3Cb%3Ehi%27%3C%2Fb%3E")
    assert status == 200
    assert 'value="&quot;&gt;&lt;b&gt;hi&#x27;&lt;/b&gt;"' in body and "<b>hi" not in body


def test_the_rescore_note_shows_a_hostile_subject_as_text(hostile_site):
    web, hostile, _ = hostile_site
    subject = history.fields(hostile)["subject"]
    _, _, body = web.get("/unsure")
    status, _, _ = web.get("/learn", data=f"id=1&label=ham&csrf={csrf_of(body)}".encode())
    assert status == 303
    _, _, body = web.get("/unsure")
    note = re.search(r'<p class="flash">(.*?)</p>', body, re.S).group(1)
    assert "#4 " in note, note  # the hostile message moved (unsure to spam) and is named
    assert html.escape(subject, quote=True) in note and "<i>moved" not in note


def test_the_model_page_and_overview_count_what_was_learned_anywhere(site):
    """learn and forget made elsewhere append to the journal, not the snapshot: the Model page
    and the Overview's model size show them at once."""
    web, mail, model = site

    def shown(path):
        status, _, body = web.get(path)
        assert status == 200
        return re.search(r"<dt>messages</dt><dd>(\d+) ham, (\d+) spam</dd>", body).groups()

    ham, spam = map(int, shown("/model"))
    assert shown("/overview") == (str(ham), str(spam))
    msg = b"From: new@example.com\nSubject: something new\nMessage-ID: <new1@example.com>\n\nnew words here\n"
    proc = subprocess.run(SPAMNB + ["learn", "--spam", "--model", str(model), "-"], input=msg, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert shown("/model") == (str(ham), str(spam + 1)) and shown("/overview") == (str(ham), str(spam + 1))
    proc = subprocess.run(SPAMNB + ["forget", "--spam", "--model", str(model), "-"], input=msg, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert shown("/model") == (str(ham), str(spam))


def test_the_unsure_page_learns_a_batch_in_one_post(site):
    web, mail, model = site
    _, _, body = web.get("/unsure")
    assert body.count('form="batch"') == 5 and 'id="batch"' in body
    before = load_model(model).messages.copy()
    status, headers, _ = web.get("/learn", data=f"id=2&id=4&id=2&label=spam&csrf={csrf_of(body)}&back=/unsure".encode())
    assert status == 303 and headers["Location"] == web.root + "/unsure"
    after = load_model(model).messages
    assert after[1] == before[1] + 2 and after[0] == before[0]  # each once
    _, _, body = web.get("/unsure")
    assert 'id="m2"' not in body and 'id="m4"' not in body and body.count('<tr id="m') == 3
    assert learned_note([history.fields(mail[i])["subject"] for i in (1, 3)], "spam") + ". " in body
    _, _, body = web.get("/history?verdict=unsure")
    assert body.count("taught as") == 2
    # nothing ticked: nothing learned, and said; a row not kept: nothing of the batch learned
    status, headers, _ = web.get("/learn", data=f"label=ham&csrf={csrf_of(body)}&back=/unsure".encode())
    assert status == 303 and "tick the messages" in web.get("/unsure")[2]
    status, _, text = web.get("/learn", data=f"id=1&id=99999&label=ham&csrf={csrf_of(body)}".encode())
    assert status == 400 and "not kept" in text
    assert (load_model(model).messages == after).all()
    status, _, _ = web.get("/learn", data=b"id=1&id=3&label=ham")  # and a batch needs the CSRF token too
    assert status == 403 and (load_model(model).messages == after).all()


def test_subjects_are_shown_decoded_and_a_choice_names_its_messages_by_them(compiled, tmp_path):
    """Raw UTF-8 and RFC 2047 subjects read as written on every page; a choice is named by its
    messages' subjects (quoted, clipped, escaped), three of them, and the rest counted."""
    body = b"\n\nPlease find the offer attached.\n"
    mail = [b"Subject: Prognose f\xc3\xbcr Sie\nMessage-ID: <p1@x>" + body,
            b"Subject: =?utf-8?q?Gr=C3=BC=C3=9Fe_aus_K=C3=B6ln?=\nMessage-ID: <p2@x>" + body,
            b"Subject: <b>bold</b> " + b"very long " * 20 + b"\nMessage-ID: <p3@x>" + body,
            b"Message-ID: <p4@x>" + body]
    hist = tmp_path / "h.sqlite"
    fill(hist, mail, unsure={0, 1, 2, 3})
    web = WebHere(compiled, hist)
    try:
        for path in ("/unsure", "/history", "/message/1", "/message/2"):
            _, _, page = web.get(path)
            assert "Prognose für Sie" in page or "Grüße aus Köln" in page, path
            assert "Ã" not in page and "=?utf-8?" not in page.split("<pre")[0], path
        status, _, _ = web.get("/learn", data=f"id=1&id=2&id=3&id=4&label=ham&csrf={web.server.csrf}".encode())
        assert status == 303
        note = re.search(r'<p class="flash">(.*?)</p>', web.get("/unsure")[2], re.S).group(1)
        assert note.startswith("Learned as ham: “Prognose für Sie”, “Grüße aus Köln”, “&lt;b&gt;bold&lt;/b&gt; "
                               "very long very long") and "<b>" not in note, note
        assert "…” and 1 more. " in note and "#" not in note.split(". ")[0], note
        assert learned_note([""], "spam") == "Learned as spam: (no subject)"
    finally:
        web.stop()


def test_clues_are_shown_in_words_with_what_they_add_to_the_score(site):
    web, mail, model = site
    _, _, body = web.get("/unsure")
    clues = Site(model, False, web.base).clues(mail[0])
    assert clues.terms and clue_chips(clues) in body
    for _, group, _, _ in clues.sides(*LIST_CHIPS):
        for tok, c in group:
            assert f'title="{html.escape(tok, quote=True)} (' in body
            assert f'>{html.escape(describe(tok))}' in body and f"<b>{c:+.2f}</b>" in body


CHIP = re.compile(r'<li class="(s|h|prior)( more)?"[^>]*>(.*?) <b>([+-][0-9]+\.[0-9]{2})</b> <small>([^<]*)</small></li>')


def chips_of(page):
    """``[(class, more, text, contribution, share)]`` of the chips of a message's page."""
    section = page.split("<h2>What moved its score</h2>", 1)[1].split("</ul>", 1)[0]
    return [(cls, bool(more), text, float(c), shown) for cls, more, text, c, shown in CHIP.findall(section)]


def spam_with_a_high_score(model):
    """A spam of the shipped sample that ``model`` scores above +10, and that score."""
    from conftest import gold_labels, SAMPLE_MAILDIR

    site = Site(model, False, "unused")
    for name, label in sorted(gold_labels().items()):
        raw = (SAMPLE_MAILDIR / "cur" / name).read_bytes()
        if label == "spam" and site.clues(raw).score > 10:
            return raw, site.clues(raw)
    raise AssertionError("no sample spam scores above +10")


def test_a_spams_chips_add_up_to_its_score_and_the_largest_pushes_toward_spam(compiled, tmp_path):
    """The chips say what moved this message's score: each clue's contribution (weight times
    count), spam-pushing first; with the rest ("N more") and the prior they add up to the
    score, within the rounding of what is shown; the shares add up to 100% (within rounding)."""
    raw, clues = spam_with_a_high_score(compiled)
    hist = tmp_path / "h.sqlite"
    fill(hist, [raw], unsure={0})
    web = WebHere(compiled, hist)
    try:
        status, _, page = web.get("/message/1")
    finally:
        web.stop()
    assert status == 200
    chips = chips_of(page)
    assert f"= score <b>{clues.score:+.2f}</b>" in page
    assert abs(sum(c for _, _, _, c, _ in chips) - clues.score) <= 0.005 * len(chips) + 1e-9, (chips, clues.score)
    named = [chip for chip in chips if chip[0] != "prior" and not chip[1]]
    assert max(named, key=lambda chip: abs(chip[3]))[0] == "s" and max(c for *_, c, _ in named) > 0
    spam = [chip for chip in named if chip[0] == "s"]
    assert chips[0][0] == "s" and len(spam) >= PAGE_CHIPS[0]  # spam-ward first, ten of them at least
    # and as many as make the verdict on their own: with the prior and every ham-ward clue, above the cut-off
    toward = clues.sides(*PAGE_CHIPS, enough=True)[0][1]
    against = sum(c for _, c in clues.terms if c < 0)
    assert len(toward) == len(spam) and clues.label == "spam"
    assert clues.prior + against + sum(c for _, c in toward) > threshold(clues.cutoffs[1])
    if len(toward) > PAGE_CHIPS[0]:  # and no more than it takes
        assert clues.prior + against + sum(c for _, c in toward[:-1]) <= threshold(clues.cutoffs[1])
    assert [c for *_, c, _ in spam] == sorted((c for *_, c, _ in spam), reverse=True)
    assert all(c > 0 for cls, _, _, c, _ in chips if cls == "s") and all(c < 0 for cls, _, _, c, _ in chips
                                                                          if cls == "h")
    assert [chip[0] for chip in chips if chip[1]] == ["s", "h"]  # one "N more" a side
    shares = [int(text[:-1]) for *_, text in chips if text != "&lt;1%"]
    assert abs(sum(shares) - 100) <= len(chips)
    counted = [(tok, n) for tok, n in clues.counts.items() if n > 1 and tok in dict(clues.sides()[0][1])]
    for tok, n in counted:  # a clue seen n times says so
        assert f"{html.escape(describe(tok))} ×{n} <b>" in page


def test_the_model_page_looks_a_word_up(site):
    web, _, model = site
    status, _, body = web.get("/model?word=Free")
    assert status == 200 and "<h2>Word lookup</h2>" in body
    rows = load_model(model).lookup("Free")
    assert rows and body.count("<tr><td><code>") == len(rows)
    for r in rows:
        assert f'<code>{html.escape(r["token"])}</code>' in body and f'<td>{r["weight"]:+.3f}</td>' in body
    status, _, body = web.get("/model?word=%3Cb%3Ezq%22never")
    assert status == 200 and "&lt;b&gt;zq&quot;never: not in the model" in body and "<b>zq" not in body
    assert 'value="&lt;b&gt;zq&quot;never"' in body


@pytest.mark.parametrize("column, value", [("t", 1e300), ("t", 1e12), ("corrected_t", 1e300)])
def test_an_out_of_range_time_in_the_history_file_is_the_page_naming_the_row(compiled, tmp_path, column, value):
    """A time no date can show, in the history file (a hand edit): the History page is the error
    page naming the verdict, never a 500 of OverflowError; the Overview counts by day in SQL
    and answers."""
    hist = tmp_path / "h.sqlite"
    fill(hist, messages()[:3])
    with contextlib.closing(sqlite3.connect(hist)) as db:
        db.execute(f"UPDATE verdicts SET {column} = ?, corrected = 'spam' WHERE id = 2", (value,))
        db.commit()
    web = Web(compiled, hist)
    try:
        status, _, page = web.get("/history")
        text = html.unescape(page)
        assert status == 500 and f"malformed row (verdict 2: its " in text and "OverflowError" not in text, page
        assert web.get("/overview")[0] == 200
    finally:
        web.stop()
    assert "Traceback" not in web.log


def test_a_choice_whose_mark_fails_is_learned_said_so_and_marks_no_row(compiled, tmp_path, monkeypatch):
    """The history refuses the second row's mark (locked, full) after the model learned the
    page's two messages: the marks are one transaction, so neither row is marked and both stay
    in the queue; the page redirects saying "learned, but not marked in the history"."""
    from spamnb.storage import history as hist_mod

    hist = tmp_path / "h.sqlite"
    fill(hist, messages()[:4], unsure={0, 1})
    web = WebHere(compiled, hist)
    real, calls = hist_mod.mark, []

    def mark(db, row_id, label):
        calls.append(row_id)
        if len(calls) == 2:
            raise sqlite3.OperationalError("database is locked")
        return real(db, row_id, label)

    monkeypatch.setattr(hist_mod, "mark", mark)
    try:
        status, _, body = web.get("/learn", data=f"id=1&id=2&label=spam&csrf={web.server.csrf}".encode())
        assert status == 303, body
        _, _, body = web.get("/unsure")
        subjects = [history.fields(raw)["subject"] for raw in messages()[:2]]
        assert learned_note(subjects, "spam") + ", but not marked in the history: database is locked" in body
        assert body.count('<tr id="m') == 2  # both still waiting
    finally:
        web.stop()
    with sqlite3.connect(hist) as db:
        assert db.execute("SELECT count(*) FROM verdicts WHERE corrected IS NOT NULL").fetchone()[0] == 0
    assert calls == [1, 2]


# -- the Scan page: a message pasted or uploaded --------------------------------------------------


def fresh(raw: bytes, n: int) -> bytes:
    """``raw`` as a message the model never learned: a Message-ID of its own (its identity)."""
    head, sep, body = raw.partition(b"\n\n")
    lines = [line for line in head.split(b"\n") if not line.lower().startswith(b"message-id:")]
    return b"\n".join([*lines, b"Message-ID: <scan-%d@example.org>" % n]) + sep + body


def verdict_shown(page):
    """``(label, score)`` of the Scan page's verdict badge."""
    label, score = re.search(r'<section id="verdict"><p><span class="v ([a-z]+)">[a-z]+ ([+-][0-9.]+)</span>',
                             page).groups()
    return label, float(score)


def test_a_pasted_spam_is_scored_by_the_pipeline_explained_and_learned_once(compiled, tmp_path):
    """Pasted as a browser sends a textarea (CRLF lines): the verdict, score, P(spam) and chips
    of the one pipeline under the model now; Learn as spam teaches it once (the counts move
    once, the history's row of it is marked, the queue re-scored), and again is "already
    learned"."""
    raw, _ = spam_with_a_high_score(compiled)
    raw = fresh(raw, 1)
    hist = tmp_path / "h.sqlite"
    fill(hist, [raw, *messages()[:2]], unsure={0})
    web = WebHere(compiled, hist)
    try:
        status, _, page = web.get("/scan")
        assert status == 200 and 'enctype="multipart/form-data"' in page and 'type="file" name="file"' in page
        status, _, page = web.scan(web.server.csrf, ("message", raw.replace(b"\n", b"\r\n")), ("file", b"", ""))
        assert status == 200, page[-500:]
        clues = Site(compiled, False, hist).clues(raw)  # the same bytes: the page made the lines LF again
        assert verdict_shown(page) == ("spam", round(clues.score, 1)) and f"P(spam) = {clues.p:.6f}" in page
        assert f"= score <b>{clues.score:+.2f}</b>" in page and chips_of(page)[0][0] == "s"
        before = load_model(compiled).messages.copy()
        raw64 = re.search(r'name="raw64" value="([A-Za-z0-9+/=]+)"', page).group(1)
        status, _, page = web.scan(web.server.csrf, ("raw64", raw64.encode()), ("label", b"spam"))
        subject = html.escape(history.fields(raw)["subject"])
        assert status == 200 and f"Learned as spam: “{subject}”." in page and "Re-scored the unsure" in page
        after = load_model(compiled).messages
        assert after[1] == before[1] + 1 and after[0] == before[0]
        status, _, page = web.scan(web.server.csrf, ("raw64", raw64.encode()), ("label", b"spam"))
        assert status == 200 and f"“{subject}” was already learned as spam: nothing changed." in page
        assert (load_model(compiled).messages == after).all()
        assert "taught as" in web.get("/history?verdict=unsure")[2]  # its row in the history, marked
        assert 'id="m1"' not in web.get("/unsure")[2]
    finally:
        web.stop()


def test_an_uploaded_file_is_scanned_as_its_bytes_and_its_subject_read_as_written(site):
    web, mail, _ = site
    _, _, page = web.get("/unsure")
    raw = fresh(mail[0], 2).replace(b"Subject:", b"Subject: Prognose f\xc3\xbcr Sie, was:", 1) + b"\xff\xfe\x00\n"
    status, _, page = web.scan(csrf_of(page), ("message", b"ignored when a file is chosen"), ("file", raw, "m.eml"))
    assert status == 200 and "<dt>Subject</dt><dd>Prognose für Sie, was:" in page
    assert base64_of(page) == raw  # the Learn buttons send back exactly the bytes uploaded


def base64_of(page):
    import base64

    return base64.b64decode(re.search(r'name="raw64" value="([^"]*)"', page).group(1))


@pytest.mark.parametrize("case", ["script", "binary", "huge", "over", "empty", "urlencoded", "cut", "raw64", "label",
                                  "csrf"])
def test_a_hostile_scan_is_answered_never_a_500(site, case):
    """HTML and script in the Subject and the body shown as text; 10 MB pasted, a 4.5 MB file: one
    clear sentence (413), nothing scanned; random bytes scored; a form that is not one: 400;
    without the CSRF token: 403. Nothing learned by any."""
    import os

    web, mail, model = site
    csrf = csrf_of(web.get("/unsure")[2])
    before = load_model(model).messages.copy()
    fields = {"script": [("message", hostile_message())], "binary": [("file", os.urandom(200_000), "x.bin")],
              "huge": [("message", b"Subject: big\n\n" + b"spam " * 2_000_000)],
              "over": [("file", b"Subject: big\n\n" + b"x" * 4_500_000, "big.eml")],
              "empty": [("message", b" \r\n "), ("file", b"", "")], "raw64": [("raw64", b"%%%"), ("label", b"spam")],
              "label": [("message", mail[0]), ("label", b"evil")]}.get(case, [("message", mail[0])])
    if case == "urlencoded":
        status, _, page = web.get("/scan", data=f"csrf={csrf}&message=x".encode())
    elif case == "cut":
        body, headers = multipart_form([("csrf", csrf.encode()), ("message", mail[0])])
        status, _, page = web.get("/scan", data=body[:-40], headers=headers)
    else:
        status, _, page = web.scan("0123" if case == "csrf" else csrf, *fields)
    want = {"script": 200, "binary": 200, "huge": 413, "over": 413, "csrf": 403}.get(case, 400)
    assert status == want, (case, status, page[-600:])
    assert "<script>document" not in page and "<img src=x" not in page
    if case == "script":
        assert html.escape(HOSTILE, quote=True) in page and verdict_shown(page)
    if case in ("huge", "over"):
        assert "the page takes messages up to 4 MB" in page and "Nothing was scanned or learned" in page
        assert 'id="scan"' in page  # the form, to try again
    assert (load_model(model).messages == before).all()
    web.stop()
    assert "Traceback" not in web.log and "error on" not in web.log, web.log
