"""``spamnb web`` over HTTP: the token, CSRF, escaping, paging, learning
(the browser's view is tests/test_web_browser.py)."""

from __future__ import annotations

import html
import re
import sqlite3
import subprocess
import time

import pytest

from spamnb.storage import history
from spamnb.storage.modelfile import load_model
from spamnb.web.data import Site
from spamnb.web.pages import clue_list
from test_e2e import SPAMNB
from test_fastpath import compiled, messages  # noqa: F401 (compiled: a fixture)
from webpage import HOSTILE, Web, WebHere, fill, hostile_message


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
        status, _, body = web.get(path, cookie=False)
        assert status == 403 and "token" in body and "/history" not in body, path
    status, _, body = web.get("/static/style.css", cookie=False)  # the one thing served without it
    assert status == 200 and "{" in body
    status, _, _ = web.get("/unsure?token=wrong", cookie=False)
    assert status == 403
    status, _, _ = web.get("/learn", cookie=False, data=b"id=1&label=spam&csrf=x")
    assert status == 403


def test_the_token_in_the_url_becomes_a_cookie_and_leaves_the_url(site):
    web, _, _ = site
    status, headers, _ = web.get(f"/history?q=x&token={web.token}", cookie=False)
    assert status == 303 and headers["Location"] == "/history?q=x"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(web.cookie + ";") and "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_first_page_is_the_unsure_queue_and_every_answer_has_a_strict_csp(site):
    web, _, _ = site
    status, headers, _ = web.get("/")
    assert status == 303 and headers["Location"] == "/unsure"
    status, headers, body = web.get("/unsure")
    assert status == 200
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp and "'unsafe-inline'" not in csp
    assert headers["X-Frame-Options"] == "DENY" and headers["Referrer-Policy"] == "no-referrer"
    assert body.count('<tr id="m') == 5 and "<script" not in body


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
    assert status == 303 and headers["Location"] == "/unsure"  # never off the site
    after = load_model(model).messages
    assert after[1] == before[1] + 1 and after[0] == before[0]
    _, _, body = web.get("/unsure")
    assert 'id="m1"' not in body and body.count('<tr id="m') == 4
    assert "Learned #1 as spam" in body and "Re-scored the unsure messages" in body
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
    assert status == 303 and "Set-Cookie" not in headers and headers["Location"] == want


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
                    assert clue_list(clues(raw)) in body, path
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
