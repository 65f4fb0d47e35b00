"""``spamnb web``: the HTTP server of the page, on the standard library's ``http.server``.

Why no web framework: the page is a handful of server-drawn HTML pages and
two kinds of form; ``http.server`` (threaded) does that, and every rule
that keeps it safe is short enough to read here:

* **Who may connect**: loopback by default; another address only with
  ``--allow CIDR``, checked on each connection before a byte is read (the
  spamd listener's rule, :func:`spamnb.checks.exposure`). No
  header (``X-Forwarded-For``, a proxy's) is trusted for this: a proxy in
  front still needs the token.
* **The token**: a random token (``secrets``, 192 bits) made at start and
  printed in the URL, as Jupyter does. Every request needs it: in the URL
  once, which sets an ``HttpOnly``, ``SameSite=Strict`` cookie and redirects
  to the same page without it (so it does not stay in the address bar, the
  history or a ``Referer``), then in the cookie. Without it: 403, nothing else.
* **CSRF**: every POST carries a token derived from the secret
  (HMAC-SHA256); a POST without the right one is refused.
* **Hostile mail**: the pages escape every value (:mod:`spamnb.web.pages`),
  have no script, and each answer carries a Content-Security-Policy
  (:data:`CSP`) that forbids scripts, inline styles, frames and any load
  from elsewhere.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import socket
import sys
import threading
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

from spamnb.delivery.spamd import client_allowed
from spamnb.verdict import cutoffs_from
from spamnb.web import pages
from spamnb.web.data import Site

CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")
MAX_POST = 16 * 1024
SAFE_BACK = re.compile(r"/[A-Za-z0-9/_?=&%.+-]*")


class Handler(BaseHTTPRequestHandler):
    server_version = "spamnb-web"

    def version_string(self):
        return self.server_version

    # -- the rules ----------------------------------------------------------------

    def authorised(self, query):
        """Whether the request carries the token (URL or cookie); a valid token in the URL
        answers with the cookie and a redirect to the same page without it."""
        srv = self.server
        given = query.pop("token", [""])[0]
        if given and hmac.compare_digest(given.encode(), srv.token.encode()):
            path = urlsplit(self.path).path
            rest = urlencode({k: v[0] for k, v in query.items()})
            self.send_response(303)
            self.send_header("Set-Cookie", f"{srv.cookie}={srv.token}; HttpOnly; SameSite=Strict; Path=/")
            self.send_header("Location", path + ("?" + rest if rest else ""))
            self.common_headers()
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        cookie = SimpleCookie()
        try:
            cookie.load(self.headers.get("Cookie", ""))
        except Exception:  # noqa: BLE001 - a malformed cookie is no cookie
            return False
        morsel = cookie.get(srv.cookie)
        return bool(morsel) and hmac.compare_digest(morsel.value.encode(), srv.token.encode())

    def common_headers(self):
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")

    def send(self, status, body, ctype="text/html; charset=utf-8"):
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.common_headers()
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def redirect(self, where):
        self.send_response(303)
        self.send_header("Location", where)
        self.send_header("Content-Length", "0")
        self.common_headers()
        self.end_headers()

    def refuse(self):
        self.send(403, pages.error_page(403, "This page needs its token: open the URL that `spamnb web` printed "
                                             "when it started.", nav=False))

    def log_message(self, fmt, *args):  # the request line only: never the token or a cookie
        if self.server.verbose:
            self.server.log(f"{self.client_address[0]} {self.command} {urlsplit(self.path).path}")

    # -- requests ---------------------------------------------------------------

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/static/style.css":  # no secret in it: the refusal page is styled too
            self.send(200, pages.STYLE, "text/css; charset=utf-8")
            return
        query = parse_qs(url.query, keep_blank_values=True, max_num_fields=20)
        ok = self.authorised(query)
        if ok is None:
            return
        if not ok:
            self.refuse()
            return
        try:
            with self.server.site.request():
                self.route_get(url.path, {k: v[0] for k, v in query.items()})
        except Exception as exc:  # noqa: BLE001 - a page's error is a page, the server goes on
            self.server.log(f"error on {url.path}: {exc.__class__.__name__}: {exc}")
            self.send(500, pages.error_page(500, f"{exc.__class__.__name__}: {exc}"))

    def do_POST(self):
        url = urlsplit(self.path)
        if not self.authorised(parse_qs(url.query, max_num_fields=20)):
            self.refuse()
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_POST:
            self.send(413, pages.error_page(413, "request too large"))
            return
        form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode("utf-8", "replace"),
                                            max_num_fields=20).items()}
        if not hmac.compare_digest(form.get("csrf", "").encode(), self.server.csrf.encode()):
            self.send(403, pages.error_page(403, "The form's CSRF token is missing or wrong: reload the page."))
            return
        if url.path != "/learn":
            self.send(404, pages.error_page(404, "no such page"))
            return
        back = form.get("back", "/unsure")
        if not SAFE_BACK.fullmatch(back) or back.startswith("//"):  # a path here, nothing a header could carry
            back = "/unsure"
        try:
            mid, label = int(form.get("id", "")), form.get("label", "")
            with self.server.site.request():
                moved = self.server.site.learn(mid, label)
        except ValueError as exc:
            self.send(400, pages.error_page(400, str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - said on the page; nothing was half done in the history
            self.server.log(f"learning failed: {exc.__class__.__name__}: {exc}")
            self.send(500, pages.error_page(500, f"not learned: {exc}"))
            return
        self.server.remember(f"Learned #{mid} as {label}. " + pages.moved_note(moved))
        self.redirect(back)

    def route_get(self, path, q):
        srv, site = self.server, self.server.site
        page = max(int(q["page"]), 0) if q.get("page", "").isdigit() else 0
        if path == "/":
            _, waiting = site.unsure()
            self.redirect("/unsure" if waiting else "/history")
        elif path == "/unsure":
            rows, total = site.unsure(page, bodies=True)
            clues = site.clues_of(rows)
            self.send(200, pages.unsure_page(rows, total, page, clues, srv.csrf, srv.flash()))
        elif path == "/history":
            params = {k: q.get(k, "") for k in ("q", "verdict", "since", "until")}
            rows, total = site.search(**params, page=page, bodies=True)
            clues = site.clues_of(rows)
            self.send(200, pages.history_page(rows, total, page, params, clues, srv.csrf, srv.flash()))
        elif path.startswith("/message/") and path[9:].isdigit():
            found = site.message(int(path[9:]))
            if found is None:
                self.send(404, pages.error_page(404, "no such message in the history"))
                return
            row, raw = found
            self.send(200, pages.message_page(row, raw, site.clues(raw) if raw else None, srv.csrf, srv.flash()))
        elif path == "/overview":
            import datetime

            facts, model = site.facts()
            today = datetime.date.today()
            days = [(today - datetime.timedelta(days=i)).isoformat() for i in range(29, -1, -1)]
            self.send(200, pages.overview_page(site.per_day(), days, site.score_bins(),
                                               cutoffs_from(model.cutoffs), site.corrections(days=30), facts))
        elif path == "/model":
            older = int(q["older_than"]) if q.get("older_than", "").isdigit() else 90
            most = int(q["max_messages"]) if q.get("max_messages", "").isdigit() else 1
            facts, _ = site.facts()
            self.send(200, pages.model_page(facts, site.prune_preview(older, most), older, most))
        else:
            self.send(404, pages.error_page(404, "no such page"))


class WebServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, site: Site, *, allowed, log=None, verbose=False):
        host = address[0]
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.site = site
        self.allowed = allowed
        self.log = log or (lambda text: print(f"spamnb web: {text}", file=sys.stderr, flush=True))
        self.verbose = verbose
        self.token = secrets.token_urlsafe(24)
        self.csrf = hmac.new(self.token.encode(), b"csrf", hashlib.sha256).hexdigest()
        self.notes = []
        self.notes_lock = threading.Lock()
        super().__init__(address, Handler)
        self.cookie = f"spamnb_token_{self.server_address[1]}"

    def verify_request(self, request, client_address):
        """Connections from outside the allowed networks are closed before a byte is read."""
        allowed = client_allowed(client_address, self.allowed)
        if not allowed:
            self.log(f"connection from {client_address[0]} refused (not in --allow)")
        return allowed

    def url(self):
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/?token={self.token}"

    def remember(self, note):
        """A note (what a choice did) for the next page shown."""
        with self.notes_lock:
            self.notes.append(note)

    def flash(self):
        with self.notes_lock:
            notes, self.notes = self.notes, []
        return "<br>".join(notes)

