"""``spamnb web`` in a real browser: Debian's headless Chromium driven by selenium.

The browser and its driver are the system's (/usr/bin/chromium,
/usr/bin/chromedriver: Debian's chromium and chromium-driver, which
scripts/test.sh installs when it runs as root); nothing downloads a browser.
Without them, or without selenium, these tests skip and say why. Each page
is kept as a screenshot in out/web/ (see docs/web.md).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spamnb.storage import history
from spamnb.storage.modelfile import load_model
from test_fastpath import compiled, messages  # noqa: F401 (compiled: a fixture)
from webpage import HOSTILE, Web, fill, hostile_message, output_dir

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra has it)")
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402 (after the skip)
pytestmark = pytest.mark.skipif(
    not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
    reason="Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")


@pytest.fixture
def browser():
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="spamnb-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,1000",
                 f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def site(compiled, tmp_path):
    mail = messages()[:12]
    hist = tmp_path / "h.sqlite"
    fill(hist, [*mail, hostile_message()], unsure={0, 1, 2, 3, 7, 12})
    web = Web(compiled, hist)
    yield web, mail, compiled
    web.stop()


def shot(driver, name):
    driver.save_screenshot(str(output_dir() / f"{name}.png"))


def follow(driver, text):
    """Click the page's link ``text`` and wait for the page it leads to."""
    driver.find_element("link text", text).click()
    WebDriverWait(driver, 60).until(lambda b: b.current_url.endswith("/" + text.lower()))


def rows(driver):
    return [r.get_attribute("id") for r in driver.find_elements("css selector", "tbody tr")]


def test_open_with_the_token_and_mark_an_unsure_message_as_spam(browser, site):
    web, mail, model = site
    browser.get(web.url)
    assert browser.current_url == web.base + web.root + "/unsure"  # the token left the address bar
    assert browser.find_element("tag name", "h1").text == "Unsure mail"
    before_rows = rows(browser)
    assert before_rows[0] == "m13" and len(before_rows) == 6  # newest first
    shot(browser, "unsure")
    before = load_model(model).messages.copy()
    browser.find_element("css selector", "#m4 button.spam").click()
    WebDriverWait(browser, 60).until(lambda b: b.find_elements("css selector", ".flash"))  # the next page
    assert browser.current_url.startswith(web.base + web.root + "/unsure")
    assert load_model(model).messages[1] == before[1] + 1  # the model learned it, as spam
    after_rows = rows(browser)
    assert "m4" not in after_rows and len(after_rows) == 5
    flash = browser.find_element("css selector", ".flash").text
    assert f"Learned as spam: “{history.fields(mail[3])['subject']}”." in flash
    assert "Re-scored the unsure messages" in flash
    shot(browser, "unsure-after-learning")
    follow(browser, "History")  # the page's links carry its address
    assert "taught as" in browser.find_element("id", "m4").text
    shot(browser, "history")


def test_tick_several_unsure_messages_and_mark_them_ham_at_once(browser, site):
    web, mail, model = site
    browser.get(web.url)
    for row in ("m2", "m3", "m8"):
        browser.find_element("css selector", f"#{row} td.pick input").click()
    shot(browser, "unsure-batch")
    before = load_model(model).messages.copy()
    browser.find_element("css selector", "#batch button.ham").click()
    WebDriverWait(browser, 60).until(lambda b: b.find_elements("css selector", ".flash"))
    assert load_model(model).messages[0] == before[0] + 3 and load_model(model).messages[1] == before[1]
    assert not {"m2", "m3", "m8"} & set(rows(browser)) and len(rows(browser)) == 3
    named = ", ".join(f"“{history.fields(mail[i])['subject']}”" for i in (7, 2))  # the rows' order, newest first
    assert f"Learned as ham: {named} and “{history.fields(mail[1])['subject']}”." in \
        browser.find_element("css selector", ".flash").text


def test_a_hostile_subject_is_shown_as_text_and_never_runs(browser, site):
    web, mail, _ = site
    hostile = f"m{len(mail) + 1}"
    browser.get(web.url)
    subject = browser.find_element("css selector", f"#{hostile} a.subject")
    assert subject.text == HOSTILE
    assert browser.find_elements("css selector", "main img, main script") == []
    assert browser.title != "pwned"
    subject.click()
    WebDriverWait(browser, 60).until(lambda b: "/message/" in b.current_url)
    assert browser.title != "pwned" and HOSTILE in browser.find_element("css selector", "pre.source").text
    assert browser.find_elements("css selector", "main img, main script") == []
    shot(browser, "message-hostile")


def test_a_request_without_the_token_is_refused(browser, site):
    web, _, _ = site
    for path in ("/unsure", "/history", "/overview"):
        browser.get(web.base + path)
        assert "needs its token" in browser.find_element("tag name", "main").text
        assert browser.find_elements("css selector", "table") == []
    browser.get(web.base + "/unsure?token=not-the-token")
    assert "needs its token" in browser.find_element("tag name", "main").text
    shot(browser, "refused")


def test_a_20000_row_history_is_paged_without_loading_it_all(browser, compiled, tmp_path):
    hist = tmp_path / "big.sqlite"
    fill(hist, messages()[:5], unsure={1, 3}, extra=20_000)
    web = Web(compiled, hist)
    try:
        browser.get(web.url)
        browser.get(web.base + web.root + "/history")
        assert len(rows(browser)) == 25
        assert "page 1 of 801 (20005 messages)" in browser.find_element("css selector", ".pager").text
        first = rows(browser)
        browser.find_element("css selector", "a[rel=next]").click()
        WebDriverWait(browser, 60).until(lambda b: "page=1" in b.current_url)
        assert "page 2 of 801" in browser.find_element("css selector", ".pager").text
        assert len(rows(browser)) == 25 and not set(rows(browser)) & set(first)
        # the page's size does not grow with the history
        assert len(browser.page_source) < 100_000
        search = browser.find_element("name", "q")
        search.send_keys("filler 1999")
        search.submit()
        WebDriverWait(browser, 60).until(lambda b: "q=filler" in b.current_url)
        assert rows(browser) == [f"m{i + 1}" for i in range(19999, 19989, -1)] + ["m2000"]  # ids count from 1
        shot(browser, "history-20000")
        follow(browser, "Overview")
        assert len(browser.find_elements("css selector", "main svg")) == 2
        shot(browser, "overview")
        follow(browser, "Model")
        assert "would drop" in browser.find_element("tag name", "main").text
        lookup = browser.find_element("css selector", "#lookup input[name=word]")
        lookup.send_keys("free")
        lookup.submit()
        WebDriverWait(browser, 60).until(lambda b: "word=free" in b.current_url)
        assert "the word “free”" in browser.find_element("css selector", "table.words").text
        shot(browser, "model")
    finally:
        web.stop()


class CookieLogger(ThreadingHTTPServer):
    """Another local user's page on another loopback port: it keeps every request it gets (its
    path and headers) and links to a second page of its own."""

    daemon_threads = True

    def __init__(self):
        self.received = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                server.received.append((self.path, dict(self.headers.items())))
                body = (b'<!doctype html><title>elsewhere</title><a id="next" href="/next">next</a>'
                        if self.path == "/" else b'<!doctype html><title>elsewhere</title><p id="done">seen</p>')
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


def test_nothing_the_page_uses_to_know_its_owner_reaches_another_port(browser, site):
    """The owner opens the page, reads a message, then follows a link to a page another local
    user serves on another loopback port. Browsers do not keep cookies apart by port: whatever
    that server received, replayed against the page, opens nothing: no message, no Unsure page
    (with its CSRF token), no learning."""
    web, _, model = site
    browser.get(web.url)
    browser.find_element("css selector", "#m1 a.subject").click()
    WebDriverWait(browser, 60).until(lambda b: b.current_url.endswith("/message/1"))
    elsewhere = CookieLogger()
    try:
        browser.get(f"http://127.0.0.1:{elsewhere.server_address[1]}/")
        browser.find_element("id", "next").click()
        WebDriverWait(browser, 60).until(lambda b: b.find_elements("id", "done"))
    finally:
        elsewhere.shutdown()
        elsewhere.server_close()
    received = elsewhere.received
    assert {"/", "/next"} <= {path for path, _ in received}, received
    before = load_model(model).messages.copy()
    for path, headers in received:
        replay = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection", "content-length")}
        for target in ("/message/1", "/unsure", "/", path):
            status, _, body = web.get(target, owner=False, headers=replay)
            assert status == 403 and "needs its token" in body, (target, replay)
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', web.get("/unsure", owner=False, headers=replay)[2])
        status, _, _ = web.get("/learn", owner=False, headers=replay,
                               data=f"id=1&label=spam&csrf={found.group(1) if found else ''}".encode())
        assert status == 403, replay
    assert (load_model(model).messages == before).all()
    key = web.root.rsplit("/", 1)[1]
    for path, headers in received:  # neither the token nor the page's address got there
        assert web.token not in repr((path, headers)) and key not in repr((path, headers))


# -- the Site view: every host's beat, and the store's servers ---------------------------------------


def site_rows(driver):
    """``{host: [cell texts]}`` of the Site view's hosts table."""
    out = {}
    for tr in driver.find_elements("css selector", "table.site tbody tr"):
        cells = [td.text for td in tr.find_elements("tag name", "td")]
        out[cells[0]] = cells
    return out


def servers_shown(driver):
    """``[(role, address, state)]`` of the Site view's servers table."""
    return [tuple(td.text for td in tr.find_elements("tag name", "td")[:3])
            for tr in driver.find_elements("css selector", "table.servers tbody tr")]


def reload_until(driver, test, what, timeout=60):
    """Reload the page until ``test(driver)`` holds (the page has no script: it shows what was
    true when it was drawn)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        driver.refresh()
        if test(driver):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout} s: {driver.find_element('tag name', 'main').text}")
        time.sleep(1)


def verdicts(cells):
    """The messages a host row counts (its "ham / unsure / spam" cell), None for "?"."""
    try:
        return sum(int(n) for n in cells[4].split(" / "))
    except ValueError:
        return None


@pytest.mark.slow  # about 60 s: a Sentinel group, two hosts that beat every 10 s, a failover
def test_the_site_view_shows_two_hosts_and_a_failover(browser, tmp_path, trained_model_file):
    """A primary, two replicas and a Sentinel (tools/harnesses/redis_sentinel.py); two ``serve
    --spamd`` hosts, mx1 and mx2 (a UTS namespace each), mail through the real spamc. The Site
    view shows both hosts up with the messages each answered, and the Sentinel's primary; the
    primary is killed (-9): after the failover the page names the new primary, the old one down,
    and both hosts beat again (mail sent after the failover is counted)."""
    import sys

    from conftest import ROOT
    from test_redis_history import NAMED, Host
    from test_redis_store import REDIS_SERVER, SPAMC, run, sample_messages, spamc

    if REDIS_SERVER is None or shutil.which("redis-sentinel") is None or SPAMC is None:
        pytest.skip("redis-server, redis-sentinel or spamc is not installed")
    if NAMED.args[0]:  # (skipif's condition) no UTS namespace here: the two hosts would share one name
        pytest.skip(NAMED.kwargs["reason"])
    sys.path.insert(0, str(ROOT))
    try:
        from tools.harnesses.redis_sentinel import Group, wait
    finally:
        sys.path.remove(str(ROOT))
    (tmp_path / "group").mkdir()
    g = Group(tmp_path / "group", replicas=2, sentinels=1, down_ms=1000, failover_ms=3000)
    hosts, web = [], None
    try:
        url = g.url(prefix="site:", timeout="1")
        assert run("store", "push", trained_model_file, url).returncode == 0
        hosts = [Host(url, tmp_path / "a", "mx1"), Host(url, tmp_path / "b", "mx2")]
        mail = sample_messages()[:5]
        for i, raw in enumerate(mail):  # three to mx1, two to mx2
            _, r = spamc(hosts[0 if i < 3 else 1].port, raw)
            assert r.returncode == 0 and b"X-Spam" in r.stdout, r
        web = Web(None, None, where=["--store", url])
        browser.get(web.url)
        follow(browser, "Site")
        reload_until(browser, lambda b: {h: verdicts(c) for h, c in site_rows(b).items()} == {"mx1": 3, "mx2": 2},
                     "both hosts' counts on the page", timeout=40)
        shown = site_rows(browser)
        assert all(cells[1] == "serve" and cells[2].startswith("up") for cells in shown.values()), shown
        old = g.ports[0]
        assert servers_shown(browser)[0] == ("primary", f"127.0.0.1:{old}", "up")
        assert sorted(s[1] for s in servers_shown(browser)[1:]) == sorted(f"127.0.0.1:{p}" for p in g.ports[1:])
        shot(browser, "site")

        g.kill(old)
        wait("the failover", lambda: g.primary()[1] != old, seconds=30)
        for raw in mail[:2]:  # mail after the failover, to mx2: counted once its beats reach the new primary
            _, r = spamc(hosts[1].port, raw)
            assert r.returncode == 0, r

        def after(b):  # the primary the Sentinel names now (a promotion under load may be tried twice)
            servers, rows_now, new = servers_shown(b), site_rows(b), g.primary()[1]
            return (servers and new != old and servers[0] == ("primary", f"127.0.0.1:{new}", "up")
                    and (f"127.0.0.1:{old}" in {s[1] for s in servers if s[2] == "down"})
                    and verdicts(rows_now.get("mx2", [""] * 5)) == 4
                    and all(c[2].startswith("up") for c in rows_now.values()))
        reload_until(browser, after, "the new primary, the old one down and both hosts beating", timeout=60)
        assert "mx1" in site_rows(browser)
        shot(browser, "site-after-failover")
        browser.save_screenshot("/tmp/site-view.png")
        assert "Sentinel group, service spamnb" in browser.find_element("tag name", "main").text
    finally:
        if web is not None:
            web.stop()
        logs = [h.stop() for h in hosts]
        g.stop()
    assert all("Traceback" not in log for log in logs), logs
    for log in logs:  # the failover: at most one line when the beats stopped, one when they resumed
        assert log.count("heartbeat: not written") <= 1 and log.count("heartbeat: the store answers again") <= 1, log
    assert "Traceback" not in web.log


def test_hostile_host_names_in_the_site_view_are_text_and_never_run(browser, tmp_path, trained_model_file):
    """Beats any host with the store's password can write: a host name of HTML that would run
    a script, one of terminal escapes and a bidi override, one of 100,000 characters, counts
    that are not numbers. Chromium shows them as text, clipped, runs nothing, and the page
    answers."""
    import time

    from test_redis_store import REDIS_SERVER, RedisServer, pushed, redis

    if REDIS_SERVER is None or redis is None:
        pytest.skip("redis-server or the redis package is not installed")
    srv = RedisServer(tmp_path)
    try:
        url = srv.url(prefix="hostile:")
        pushed(url, trained_model_file)
        c, now = srv.client(), time.time()
        beats = {HOSTILE + " serve": {"host": HOSTILE, "role": "serve", "spam": "<b>9</b>", "ham": "-1"},
                 "esc serve": {"host": "evil\x1b[2J\u202eroot\r\nmx9", "role": "serve", "version": "\x07" * 50},
                 "long serve": {"host": "L" * 100_000, "role": "serve", "ham": "9" * 40, "beat": "nan"}}
        for i, (member, fields) in enumerate(beats.items()):
            c.zadd(b"hostile:site", {member: now - i})
            c.hset(b"hostile:site:" + member.encode(), mapping={"beat": repr(now - i), "every": "10", **fields})
        web = Web(None, None, where=["--store", url])
        try:
            browser.get(web.url)
            follow(browser, "Site")
            assert browser.title != "pwned"
            assert browser.find_elements("css selector", "main img, main script, main b") == []
            shown = site_rows(browser)
            assert HOSTILE[:79] in "".join(shown)  # as text, clipped to 80 characters
            assert len(shown) == 3 and all(len(name) <= 80 for name in shown)
            assert not any(ch in "".join(shown) for ch in "\x1b\u202e\r\n\x07")
            hostile = next(cells for name, cells in shown.items() if name.startswith("<img"))
            assert hostile[4] == "? / ? / ?"  # counts that are not numbers
            shot(browser, "site-hostile")
        finally:
            web.stop()
        assert "Traceback" not in web.log
    finally:
        srv.stop()


# -- what moved a score, and the Scan page -----------------------------------------------------------


def short_spam(model):
    """The shortest spam of the shipped sample that ``model`` scores above +10 (typed into a
    textarea key by key: the shorter the quicker)."""
    from conftest import gold_labels, SAMPLE_MAILDIR
    from spamnb.web.data import Site

    site = Site(model, False, "unused")
    spam = sorted(((SAMPLE_MAILDIR / "cur" / name).read_bytes() for name, label in gold_labels().items()
                   if label == "spam"), key=len)
    return next(raw for raw in spam if site.clues(raw).score > 10)


def submit(driver, css):
    """Click the button ``css`` and wait for the page its form leads to (the old one gone)."""
    old = driver.find_element("tag name", "main")
    driver.find_element("css selector", css).click()
    WebDriverWait(driver, 120).until(lambda _: gone(old))


def gone(element) -> bool:
    """Whether ``element`` left the document (its page was replaced). Chromium says so as a
    stale element, or, when the new page is being built as it is asked, as an inspector
    error ("Node with given id does not belong to the document"): the same answer."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise
    return False


def chips(driver):
    """``(class, text)`` of the chips of the page's section "What moved its score"."""
    return [(li.get_attribute("class"), li.text) for li in driver.find_elements("css selector", "ul.clues li")
            if li.get_attribute("class") != "break"]


def test_a_spams_page_shows_what_moved_its_score(browser, compiled, tmp_path):
    raw = short_spam(compiled)
    hist = tmp_path / "h.sqlite"
    fill(hist, [raw], unsure={0})
    web = Web(compiled, hist)
    try:
        browser.get(web.url)
        browser.find_element("css selector", "#m1 a.subject").click()
        WebDriverWait(browser, 60).until(lambda b: b.current_url.endswith("/message/1"))
        shown = chips(browser)
        assert shown[0][0] == "s" and shown[-1][0] == "prior" and ("s more" in dict(shown))
        first = shown[0][1]
        assert re.search(r" \+[0-9]+\.[0-9]{2} [0-9<]+%$", first), first  # its contribution and share
        total = browser.find_element("css selector", "p.sum").text
        assert total.startswith("prior ") and "= score +" in total
        values = [float(re.search(r" ([+-][0-9]+\.[0-9]{2}) ", text + " ").group(1)) for _, text in shown]
        assert abs(sum(values) - float(total.split("= score ")[1].split(",")[0])) <= 0.005 * len(values)
        shot(browser, "message-chips")
    finally:
        web.stop()


def test_paste_a_spam_see_its_verdict_and_chips_and_teach_it_once(browser, compiled, tmp_path):
    raw = short_spam(compiled).replace(b"Subject:", b"Message-ID: <pasted-1@example.org>\nSubject:", 1)
    hist = tmp_path / "h.sqlite"
    fill(hist, messages()[:2])
    web = Web(compiled, hist)
    try:
        browser.get(web.url)
        follow(browser, "Scan")
        browser.find_element("id", "message").send_keys(raw.decode("latin-1"))
        shot(browser, "scan-form")
        submit(browser, "#scan button")
        assert browser.find_element("css selector", "#verdict .v").text.startswith("spam +")
        assert chips(browser)[0][0] == "s" and "P(spam) = 0.99" in browser.find_element("id", "verdict").text
        shot(browser, "scan-result")
        before = load_model(compiled).messages.copy()
        submit(browser, "#teach button.spam")
        assert browser.find_element("css selector", ".flash").text.startswith("Learned as spam: “")
        assert load_model(compiled).messages[1] == before[1] + 1
        submit(browser, "#teach button.spam")  # again: nothing more
        assert "was already learned as spam: nothing changed" in browser.find_element("css selector", ".flash").text
        assert load_model(compiled).messages[1] == before[1] + 1 and load_model(compiled).messages[0] == before[0]
        shot(browser, "scan-learned")
    finally:
        web.stop()
    assert "Traceback" not in web.log


def test_hostile_pastes_and_uploads_are_shown_as_text_or_refused_in_a_sentence(browser, site, tmp_path):
    web, _, model = site
    before = load_model(model).messages.copy()
    browser.get(web.url)
    follow(browser, "Scan")
    browser.find_element("id", "message").send_keys(hostile_message().decode())
    submit(browser, "#scan button")
    assert browser.title != "pwned" and browser.find_elements("css selector", "main img, main script") == []
    assert HOSTILE in browser.find_element("css selector", "#verdict dl").text
    uploads = {"binary.bin": os.urandom(100_000), "huge.eml": b"Subject: big\n\n" + b"spam " * 2_000_000}
    for name, data in uploads.items():
        (tmp_path / name).write_bytes(data)
        browser.find_element("id", "file").send_keys(str(tmp_path / name))
        submit(browser, "#scan button")
        if name == "binary.bin":
            assert browser.find_element("css selector", "#verdict .v").text.split()[0] in ("ham", "unsure", "spam")
        else:  # 10 MB: the page, not a reset connection, saying why
            text = browser.find_element("css selector", ".flash.error").text
            assert "This message is 10.0 MB: the page takes messages up to 4 MB" in text, text
            shot(browser, "scan-too-large")
    assert (load_model(model).messages == before).all()
    web.stop()
    assert "Traceback" not in web.log
