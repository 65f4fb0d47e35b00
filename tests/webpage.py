"""A running ``spamnb web`` over a model and a history made for the test
(tests/test_web.py over HTTP, tests/test_web_browser.py in Chromium)."""

from __future__ import annotations

import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from spamnb.storage import history
from test_e2e import SPAMNB

HOSTILE = "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>"


def hostile_message() -> bytes:
    return (f"From: \"<b>evil</b>\" <x@example.org>\nSubject: {HOSTILE}\nMessage-ID: <h@example.org>\n"
            f"Content-Type: text/html\n\n<html><body>{HOSTILE}<img src=\"http://example.org/track.png\">"
            f"</body></html>\n").encode()


def fill(path, messages, *, unsure=(), extra=0, t0=None):
    """A history at ``path``: ``messages`` recorded as ham (those whose index is in
    ``unsure`` as unsure), newest last, plus ``extra`` small ham rows before them."""
    t0 = time.time() - 3600 if t0 is None else t0
    db = history.open_db(path)
    try:
        small = b"From: a@example.org\nSubject: filler %d\n\nhello\n"
        for start in range(0, extra, 5000):
            history.write(db, [history.row(small % i, "ham", -8.0 - i % 7, 0.001, via="filter",
                                           t=t0 - 86400 * 20 + i * 60) for i in range(start, min(start + 5000, extra))],
                          keep_recent=10)
        history.write(db, [history.row(raw, "unsure" if i in unsure else "ham", 0.5 if i in unsure else -9.0,
                                       0.6 if i in unsure else 0.001, via="filter", t=t0 + i)
                           for i, raw in enumerate(messages)], keep_recent=10 ** 6)
    finally:
        db.close()


def multipart_form(fields):
    """``(body, headers)`` of a multipart/form-data POST, as a browser sends the Scan form:
    ``fields`` are ``(name, bytes)``, or ``(name, bytes, file name)`` for a file."""
    boundary = "----spamnbTestBoundary" + "7MA4YWxkTrZu0gW"
    body = b""
    for name, value, *filename in fields:
        head = f'Content-Disposition: form-data; name="{name}"'
        if filename:
            head += f'; filename="{filename[0]}"\r\nContent-Type: application/octet-stream'
        body += f"--{boundary}\r\n{head}\r\n\r\n".encode() + value + b"\r\n"
    return body + f"--{boundary}--\r\n".encode(), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


class Web:
    """``spamnb web`` in a subprocess; ``url`` is the one it printed (with the token). ``where``:
    the options naming what it shows, instead of ``--model MODEL --history HIST``."""

    def __init__(self, model, hist, *extra, max_files=None, where=None):
        def limit():  # the process's own limit of open files (its soft limit), as a test sets it
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        where = where or ["--model", str(model), "--history", str(hist)]  # or ["--store", URL]
        self.proc = subprocess.Popen(SPAMNB + ["web", *where, "--listen", "127.0.0.1:0", *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=limit if max_files else None)
        self.lines = []
        deadline = time.monotonic() + 60
        self.url = None
        while time.monotonic() < deadline and self.url is None:
            line = self.proc.stderr.readline()
            if not line:
                raise AssertionError("spamnb web exited: " + "".join(self.lines))
            self.lines.append(line)
            m = re.search(r"open (http://\S+)", line)
            if m:
                self.url = m.group(1)
        if self.url is None:
            self.stop()
            raise AssertionError("spamnb web did not start")
        self.at(self.url)

    def at(self, url):
        """Where the server is, its token, and the page's own address (``/s/KEY``), where the
        printed URL sends a browser."""
        self.base = url.split("/?", 1)[0]
        self.token = url.rsplit("token=", 1)[1]
        self.cookie = None
        status, headers, _ = self.get(f"/?token={self.token}", owner=False)
        assert status == 303 and headers["Location"].endswith("/"), (status, dict(headers))
        self.root = headers["Location"][:-1]
        if headers["Set-Cookie"]:  # a page before this one kept its token in a cookie: so that a test can
            self.cookie = headers["Set-Cookie"].split(";")[0]  # be run against it and seen to fail

    def get(self, path, *, owner=True, data=None, headers=(), timeout=60):
        """``(status, headers, body)`` of one request (redirects not followed): at the page's own
        address (as its owner's browser asks), else (``owner=False``) as ``path`` is."""
        req = urllib.request.Request(self.base + (self.root if owner else "") + path, data=data,
                                     headers=dict(headers))
        if owner and self.cookie:
            req.add_header("Cookie", self.cookie)
        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(req, timeout=timeout) as r:
                return r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read().decode()

    def scan(self, csrf, *fields):
        """``(status, headers, body)`` of the Scan form sent with ``fields`` (``(name, bytes[,
        file name])``) and the CSRF token ``csrf``."""
        body, headers = multipart_form([("csrf", csrf.encode()), *fields])
        return self.get("/scan", data=body, headers=headers)

    def stop(self):
        """Stop it; what it wrote to stderr after its address is kept in ``log``."""
        if self.proc.stderr.closed:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
        self.log = self.proc.stderr.read()
        self.proc.wait(20)
        self.proc.stderr.close()


class WebHere(Web):
    """The same server in this process, on a thread: a test can watch what it does
    (the connections it opens, the statements it runs)."""

    def __init__(self, model, hist, *, allowed=None):
        from spamnb.delivery.access import LOOPBACK
        from spamnb.web.app import WebServer
        from spamnb.web.data import Site

        self.logged, self.cookie = [], None
        self.server = WebServer(("127.0.0.1", 0), Site(model, False, hist), allowed=allowed or LOOPBACK,
                                log=self.logged.append)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        if allowed:  # this test's client may not be let in
            self.base, self.token, self.root = self.server.url().split("/?")[0], self.server.token, self.server.root
        else:
            self.at(self.server.url())

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def output_dir() -> Path:
    """Where the tests keep what they draw (screenshots): out/web/ of the checkout."""
    path = Path(__file__).resolve().parent.parent / "out" / "web"
    path.mkdir(parents=True, exist_ok=True)
    return path
