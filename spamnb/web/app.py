"""``spamnb web``: the HTTP server of the page, on the standard library's ``http.server``.

Why no web framework: the page is a handful of server-drawn HTML pages and
three kinds of form (a search, the learn buttons, the Scan form's message, the one
multipart body: :func:`multipart`); ``http.server`` (threaded) does that, and every rule
that keeps it safe is short enough to read here:

* **Who may connect**: loopback by default; another address only with
  ``--allow CIDR``, checked on each connection before a byte is read (the
  rule every listener asks, :mod:`spamnb.delivery.access`; the listening
  address checked by :func:`spamnb.checks.exposure`). No
  header (``X-Forwarded-For``, a proxy's) is trusted for this: a proxy in
  front still needs the token.
* **The token and the page's address**: a random token (``secrets``, 192
  bits) made at start and printed in the URL, as Jupyter does. A GET with it
  is sent on to the page's own address, ``/s/KEY/...``, where KEY is derived
  from the token; every link and form of the page carries it, and every
  request needs it. No cookie: a browser sends the cookies of 127.0.0.1 to
  every port of it (``SameSite`` treats them as one site), so another local
  user's server on another port would receive them and could replay them
  here. The address is known only to pages of this origin (the same-origin
  policy keeps ports apart) and is never sent in a ``Referer``.
* **CSRF**: every POST carries a token derived from the secret
  (HMAC-SHA256); a POST without the right one is refused.
* **Connections**: each read waits at most :data:`IDLE_TIMEOUT` seconds, and at
  most :data:`MAX_CONNECTIONS` are open at once; when they are, a new one closes
  the oldest that has not yet made an authorised request, so idle or slow
  clients cannot use up the process's files or keep the owner out. One client
  (a local user, whichever address it connects from; another host's address)
  holds at most :data:`SHARE` (half): beyond, a new one of its own closes its
  own oldest, so another user's flood never closes the owner's connections.
* **Hostile mail**: the pages escape every value (:mod:`spamnb.web.pages`),
  have no script, and each answer carries a Content-Security-Policy
  (:data:`CSP`) that forbids scripts, inline styles, frames and any load
  from elsewhere.
* **Bad requests**: too many fields, a number that is not one or is out of
  range: 400 (or 404 for a message), one line, never a traceback. A body over its
  bound (:data:`MAX_POST`, the Scan form's :data:`MAX_SCAN_POST`): 413, after reading
  it (:meth:`Handler.too_large`), so that a browser shows the answer.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

from spamnb.delivery import access
from spamnb.verdict import cutoffs_from
from spamnb.web import pages
from spamnb.web.data import MAX_MESSAGE, PAGE, NotMarked, Site

CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")
MAX_POST = 16 * 1024
MAX_QUERY_FIELDS = 20  # a page's address has at most a handful
MAX_FORM_FIELDS = PAGE + 8  # a choice: the ids of a page's rows (a batch), the label, the CSRF token, back
SAFE_BACK = re.compile(r"/[A-Za-z0-9/_?=&%.+-]*")
NUMBER = re.compile(r"[0-9]{1,9}")  # a page, a count of days: ASCII digits (not "²"), below 10^9
MESSAGE_ID = re.compile(r"[0-9]{1,18}")  # a history row's id: ASCII digits that fit SQLite's integer
IDLE_TIMEOUT = 10.0  # seconds any read of a request may wait
MAX_CONNECTIONS = 64  # open at once; a new one beyond closes the oldest not yet authorised
SHARE = access.share(MAX_CONNECTIONS)  # held by one client at most; beyond, its own oldest not authorised


#: The Scan form's body: a message at the bound as a Learn button sends it back (base64), and
#: the form's own lines.
MAX_SCAN_POST = MAX_MESSAGE * 4 // 3 + 64 * 1024
#: A body over its bound is read and dropped up to this much before the 413 (a larger one is not
#: read: the connection closes after the answer).
DRAIN_MAX = 64 * 1024 * 1024
BOUNDARY = re.compile(r'boundary=(?:"([^"]{1,200})"|([^\s;"]{1,200}))', re.IGNORECASE)
FIELD_NAME = re.compile(rb';\s*name="([^"]*)"', re.IGNORECASE)


class BadRequest(ValueError):
    """A request this page cannot make sense of: answered 400 with its reason."""


def number(q, name, default, *, low=0):
    """The integer of query field ``name`` (``default`` when absent or empty); BadRequest
    for anything but ASCII digits below 10^9."""
    text = q.get(name, "")
    if text == "":
        return default
    if not NUMBER.fullmatch(text) or int(text) < low:
        raise BadRequest(f"{name} must be a whole number from {low} to 999999999")
    return int(text)


def fields(text, limit):
    """``{name: [values]}`` of a query or form; BadRequest beyond ``limit`` fields."""
    try:
        return parse_qs(text, keep_blank_values=True, max_num_fields=limit)
    except ValueError:
        raise BadRequest(f"too many fields (at most {limit})") from None


def multipart(body: bytes, ctype: str, limit: int) -> dict:
    """``{name: [bytes]}`` of a multipart/form-data body (the Scan form's: a file's bytes as
    sent, a textarea's as the browser encoded them); BadRequest for another body, one cut
    short, or beyond ``limit`` fields."""
    found = BOUNDARY.search(ctype)
    if not ctype.lower().startswith("multipart/form-data") or not found:
        raise BadRequest("the Scan form is sent as multipart/form-data")
    delimiter = b"\r\n--" + (found.group(1) or found.group(2)).encode("latin-1")
    parts = (b"\r\n" + body).split(delimiter)
    if len(parts) < 2 or not parts[-1].startswith(b"--"):
        raise BadRequest("the form came cut short: send it again")
    if len(parts) - 2 > limit:
        raise BadRequest(f"too many fields (at most {limit})")
    form = {}
    for part in parts[1:-1]:
        head, blank, value = part.partition(b"\r\n\r\n")
        disposition = next((line for line in head.split(b"\r\n") if line[:20].lower() == b"content-disposition:"),
                           b"")
        name = FIELD_NAME.search(disposition)
        if blank and name:
            form.setdefault(name.group(1).decode("utf-8", "replace"), []).append(value)
    return form


def pasted(form):
    """The message of the Scan form, or None: the one a Learn button sends back (base64 of the
    bytes scanned), else the file uploaded, else the text pasted, whose lines the browser sent
    with CRLF (HTML's rule for a textarea) and which are made LF again, as the mail file held
    them. BadRequest for base64 that is not."""
    if form.get("raw64"):
        try:
            return base64.b64decode(form["raw64"][0], validate=True) or None
        except (binascii.Error, ValueError):
            raise BadRequest("the message to learn did not come back whole: scan it again") from None
    raw = form.get("file", [b""])[0] or form.get("message", [b""])[0].replace(b"\r\n", b"\n")
    return raw if raw.strip() else None


class Handler(BaseHTTPRequestHandler):
    server_version = "spamnb-web"

    def version_string(self):
        return self.server_version

    def setup(self):
        self.timeout = self.server.idle_timeout  # every read of this connection waits at most this long
        super().setup()

    # -- the rules ----------------------------------------------------------------

    def may(self, action, *, key=False, csrf=False):
        """Whether this connection may do ``action`` (:mod:`spamnb.delivery.access`), having
        shown the page's key (or the printed token) and the form's CSRF token or not."""
        peer = access.Peer.tcp(access.WEB, self.client_address, key=key, csrf=csrf)
        return self.server.rules.allows(peer, action)

    def own_path(self, path):
        """The page's path below its own address (``/s/KEY``), or None when ``path`` is not under
        it (the key compared in constant time)."""
        srv = self.server
        if not path.startswith("/s/"):
            return None
        key, slash, rest = path[3:].partition("/")
        if not self.may(access.READ_PAGE, key=hmac.compare_digest(key.encode(), srv.key.encode())):
            return None
        srv.authorised(self.connection)
        return "/" + rest if slash else "/"

    def exchange(self, path, query):
        """A GET with the printed token in its URL: sent on (303) to the same page at the page's own
        address, without the token. Nothing is set in the browser: its cookies would go to every
        port of this host."""
        srv = self.server
        given = query.pop("token", [""])[0]
        if not self.may(access.READ_PAGE, key=hmac.compare_digest(given.encode(), srv.token.encode())):
            self.refuse()
            return
        if self.own_path(path) is None:  # the printed address, or a path of the page without its key
            path = srv.root + (path if path.startswith("/") else "/")
        rest = urlencode({k: v[0] for k, v in query.items()})
        self.redirect(path + ("?" + rest if rest else ""))

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

    def log_message(self, fmt, *args):  # the request line only: never the token or the page's key
        if self.server.verbose:
            path = urlsplit(getattr(self, "path", "") or "").path
            if path.startswith("/s/"):
                path = "/s/KEY/" + path[3:].partition("/")[2]
            self.server.log(f"{self.client_address[0]} {getattr(self, 'command', None) or '-'} {path}")

    # -- requests ---------------------------------------------------------------

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/static/style.css":  # no secret in it: the refusal page is styled too
            self.send(200, pages.STYLE, "text/css; charset=utf-8")
            return
        try:
            query = fields(url.query, MAX_QUERY_FIELDS)
        except BadRequest as exc:  # before the token: a request this page cannot read is nobody's
            self.send(400, pages.error_page(400, str(exc), nav=False))
            return
        if "token" in query:
            self.exchange(url.path, query)
            return
        path = self.own_path(url.path)
        if path is None:
            self.refuse()
            return
        root = self.server.root
        try:
            with self.server.site.request():
                self.route_get(path, {k: v[0] for k, v in query.items()})
        except BadRequest as exc:
            self.send(400, pages.error_page(400, str(exc), root=root))
        except Exception as exc:  # noqa: BLE001 - a page's error is a page, the server goes on
            self.server.log(f"error on {path}: {exc.__class__.__name__}: {exc}")
            self.send(500, pages.error_page(500, f"{exc.__class__.__name__}: {exc}", root=root))

    def do_POST(self):
        url = urlsplit(self.path)
        srv = self.server
        try:
            fields(url.query, MAX_QUERY_FIELDS)
        except BadRequest as exc:
            self.send(400, pages.error_page(400, str(exc), nav=False))
            return
        path = self.own_path(url.path)  # a token in the URL is never taken for a POST: one answer, 403
        if path is None:
            self.refuse()
            return
        form = self.read_form(path == "/scan")
        if form is None:  # answered
            return
        given = form.get("csrf", [""])[0]
        given = given.encode() if isinstance(given, str) else given
        csrf = hmac.compare_digest(given, srv.csrf.encode())
        if not self.may(access.TEACH_PAGE, key=True, csrf=csrf):  # (its key: own_path above)
            self.send(403, pages.error_page(403, "The form's CSRF token is missing or wrong: reload the page.",
                                            root=srv.root))
            return
        if path == "/scan":
            self.scan(form)
        elif path == "/learn":
            self.learn(form)
        else:
            self.send(404, pages.error_page(404, "no such page", root=srv.root))

    def read_form(self, scan):
        """The POST's form, or None when it was answered (too large, malformed): the Scan
        form's whole message as multipart/form-data (``scan``), else a urlencoded form."""
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= (MAX_SCAN_POST if scan else MAX_POST):
            self.too_large(length, scan)
            return None
        try:
            body = self.rfile.read(length)
            if scan:
                return multipart(body, self.headers.get("Content-Type", ""), MAX_FORM_FIELDS)
            return fields(body.decode("utf-8", "replace"), MAX_FORM_FIELDS)
        except BadRequest as exc:
            self.send(400, pages.error_page(400, str(exc), root=self.server.root))
            return None

    def learn(self, form):
        """A row's or a page's Learn button: the messages chosen, learned as the label,
        then back to the page (``back``) with what was learned said there."""
        srv = self.server
        back = form.get("back", ["/unsure"])[0]
        if not SAFE_BACK.fullmatch(back) or back.startswith("//"):  # a path here, nothing a header could carry
            back = "/unsure"
        label = form.get("label", [""])[0]
        try:
            mids = form.get("id", [])  # one (a row's button) or a page's selection (the batch buttons)
            bad = next((m for m in mids if not MESSAGE_ID.fullmatch(m)), None)
            if bad is not None:
                raise ValueError(f"message {bad[:20]!r} is not kept in the history: it cannot be learned from here")
            mids = list(dict.fromkeys(map(int, mids)))
            if not mids and label in ("spam", "ham"):  # a batch button with nothing ticked
                srv.remember("Nothing was learned: tick the messages first.")
                self.redirect(srv.root + back)
                return
            with srv.site.request():
                subjects, moved = srv.site.learn(mids, label)
        except ValueError as exc:
            self.send(400, pages.error_page(400, str(exc), root=srv.root))
            return
        except NotMarked as exc:  # learned: said with the next page, as a choice is
            srv.remember(f"{pages.learned_note(exc.subjects, label)}, but not marked in the history: "
                         f"{pages.e(str(exc))}. They stay in the queue: choose them again to mark them (a message "
                         f"is learned once).")
            self.redirect(srv.root + back)
            return
        except Exception as exc:  # noqa: BLE001 - said on the page; raised before any mark (the site's learn)
            srv.log(f"learning failed: {exc.__class__.__name__}: {exc}")
            self.send(500, pages.error_page(500, f"not learned: {exc}; nothing was marked in the history",
                                            root=srv.root))
            return
        srv.remember(f"{pages.learned_note(subjects, label)}. " + pages.moved_note(moved, srv.root))
        self.redirect(srv.root + back)

    def too_large(self, length, scan):
        """A body over the bound: 413, after reading it when it is at most :data:`DRAIN_MAX`, so
        that a browser still sending an upload reads the answer instead of a reset connection;
        the connection closes after it."""
        left = length if length <= DRAIN_MAX else 0
        try:
            while left > 0 and (chunk := self.rfile.read(min(left, 1 << 16))):
                left -= len(chunk)
        except OSError:  # the client stopped sending (the read's timeout): answered all the same
            pass
        self.close_connection = True
        srv = self.server
        if scan:
            self.send(413, pages.scan_page(srv.csrf, root=srv.root, error=pages.too_large_note(length)))
        else:
            self.send(413, pages.error_page(413, "request too large", root=srv.root))

    def scan(self, form):
        """The Scan form: the message pasted or uploaded, its verdict and what moved its score;
        with a label (its Learn buttons), learned first. Nothing is kept of it."""
        srv = self.server
        given = self.scan_input(form)
        if given is None:
            return
        raw, label = given
        try:
            with srv.site.request():
                note = self.taught(raw, label) if label else ""
                if note is None:
                    return
                clues = srv.site.clues(raw)
        except Exception as exc:  # noqa: BLE001 - the model cannot be read: a page, the server goes on
            srv.log(f"error on /scan: {exc.__class__.__name__}: {exc}")
            self.send(500, pages.error_page(500, f"{exc.__class__.__name__}: {exc}", root=srv.root))
            return
        self.send(200, pages.scan_page(srv.csrf, root=srv.root, raw=raw, clues=clues, flash=note))

    def scan_input(self, form):
        """``(raw, label)`` of the Scan form (label "" to scan only), or None when it holds no
        message to take: its answer (400, or 413 beyond :data:`MAX_MESSAGE`) sent."""
        srv = self.server
        label = form.get("label", [b""])[0].decode("ascii", "replace")
        try:
            raw = pasted(form)
        except BadRequest as exc:
            raw, error = None, pages.e(str(exc))
        else:
            error = "Paste a message or choose a file: there was nothing to scan." if raw is None else ""
        if error or len(raw) > MAX_MESSAGE:
            status, error = (400, error) if error else (413, pages.too_large_note(len(raw)))
            self.send(status, pages.scan_page(srv.csrf, root=srv.root, error=error))
            return None
        if label not in ("", "spam", "ham"):
            self.send(400, pages.error_page(400, "learn it as spam or ham", root=srv.root))
            return None
        return raw, label

    def taught(self, raw, label):
        """Learn the scanned message ``raw`` as ``label``: the note saying what it did, or None
        when learning failed (its 500 page sent, as the queue's buttons answer one)."""
        srv = self.server
        try:
            done, moved = srv.site.teach(raw, label)
        except Exception as exc:  # noqa: BLE001 - said on the page; nothing learned
            srv.log(f"learning failed: {exc.__class__.__name__}: {exc}")
            self.send(500, pages.error_page(500, f"not learned: {exc}", root=srv.root))
            return None
        return pages.taught_note(raw, label, done) + (" " + pages.moved_note(moved, srv.root) if moved is not None
                                                      else "")

    def route_get(self, path, q):
        srv, site = self.server, self.server.site
        root = srv.root
        page = number(q, "page", 0)
        if path == "/":
            _, waiting = site.unsure()
            self.redirect(root + ("/unsure" if waiting else "/history"))
        elif path == "/unsure":
            rows, total = site.unsure(page, bodies=True)
            clues = site.clues_of(rows)
            self.send(200, pages.unsure_page(rows, total, page, clues, srv.csrf, srv.flash(), root=root))
        elif path == "/history":
            params = {k: q.get(k, "") for k in ("q", "verdict", "since", "until")}
            rows, total = site.search(**params, page=page, bodies=True)
            clues = site.clues_of(rows)
            self.send(200, pages.history_page(rows, total, page, params, clues, srv.csrf, srv.flash(), root=root))
        elif path.startswith("/message/"):
            found = site.message(int(path[9:])) if MESSAGE_ID.fullmatch(path[9:]) else None
            if found is None:
                self.send(404, pages.error_page(404, "no such message in the history", root=root))
                return
            row, raw = found
            self.send(200, pages.message_page(row, raw, site.clues(raw) if raw else None, srv.csrf, srv.flash(),
                                              root=root))
        elif path == "/scan":
            self.send(200, pages.scan_page(srv.csrf, root=root, flash=srv.flash()))
        elif path == "/overview":
            import datetime

            facts, model = site.facts()
            today = datetime.date.today()
            days = [(today - datetime.timedelta(days=i)).isoformat() for i in range(29, -1, -1)]
            self.send(200, pages.overview_page(site.per_day(), days, site.score_bins(),
                                               cutoffs_from(model.cutoffs), site.corrections(days=30), facts,
                                               root=root))
        elif path == "/site":
            self.send(200, pages.site_page(site.site_view(), root=root))
        elif path == "/model":
            older, most = number(q, "older_than", 90), number(q, "max_messages", 1)
            word = q.get("word", "").strip()[:200]
            facts, _ = site.facts()
            self.send(200, pages.model_page(facts, site.prune_preview(older, most), older, most, word=word,
                                            found=site.lookup(word) if word else (), root=root))
        else:
            self.send(404, pages.error_page(404, "no such page", root=root))


class WebServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address, site: Site, *, allowed, log=None, verbose=False):
        host = address[0]
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.site = site
        self.rules = access.Rules(networks=tuple(allowed))
        self.log = log or (lambda text: print(f"spamnb web: {text}", file=sys.stderr, flush=True))
        self.verbose = verbose
        self.token = secrets.token_urlsafe(24)
        self.key = base64.urlsafe_b64encode(hmac.new(self.token.encode(), b"page", hashlib.sha256).digest()[:24]
                                            ).decode()
        self.root = f"/s/{self.key}"
        self.csrf = hmac.new(self.token.encode(), b"csrf", hashlib.sha256).hexdigest()
        self.notes = []
        self.notes_lock = threading.Lock()
        self.idle_timeout = IDLE_TIMEOUT
        self.max_connections = MAX_CONNECTIONS
        self.share = SHARE
        self.open = {}  # socket -> whether it made an authorised request; oldest first
        self.holders = {}  # socket -> who holds it (access.holder; None: not asked yet)
        self.addresses = {}  # socket -> its client's address
        self.open_lock = threading.Lock()
        super().__init__(address, Handler)

    def verify_request(self, request, client_address):
        """Connections the access rules refuse (outside loopback and ``--allow``) are closed
        before a byte is read."""
        allowed = self.rules.allows(access.Peer.tcp(access.WEB, client_address), access.CONNECT)
        if not allowed:
            self.log(f"connection from {client_address[0]} refused (not in --allow)")
        return allowed

    def process_request(self, request, client_address):
        """Each connection on a thread of its own, at most :attr:`max_connections` at once: at the
        bound, the oldest connection that has not made an authorised request is shut (an idle or
        slow client's), else the new one is closed unread. One client (a local user, another
        host's address: :func:`spamnb.delivery.access.holder`) holds at most :attr:`share` of
        them: beyond, its own oldest such connection is shut, never another client's."""
        who = self._holders(request, client_address)
        with self.open_lock:
            mine = [sock for sock in self.open if who is not None and self.holders.get(sock) == who]
            pool = mine if len(mine) >= self.share else self.open if len(self.open) >= self.max_connections else ()
            if pool:
                idle = next((sock for sock in pool if not self.open[sock]), None)
                if idle is None:
                    self.shutdown_request(request, locked=True)
                    return
                del self.open[idle]
                self.holders.pop(idle, None)
                try:
                    idle.shutdown(socket.SHUT_RDWR)  # its thread reads the end and closes it
                except OSError:
                    pass
            self.open[request] = False
            self.holders[request] = who
            self.addresses[request] = client_address
        super().process_request(request, client_address)

    def _holders(self, request, client_address):
        """The holder of ``request``, and of every open connection not asked yet; None while no
        client can reach its share (asked only then: a scan of the kernel's socket table each)."""
        with self.open_lock:
            if len(self.open) + 1 < min(self.share, self.max_connections):
                return None
            unknown = [(sock, self.addresses.get(sock)) for sock in self.open if self.holders.get(sock) is None]
        found = {sock: self._holder(sock, address) for sock, address in unknown}  # (the accept loop's alone)
        with self.open_lock:
            for sock, who in found.items():
                if sock in self.open:
                    self.holders[sock] = who
        return self._holder(request, client_address)

    @staticmethod
    def _holder(sock, client_address):
        try:
            return access.holder(access.Peer.tcp(access.WEB, client_address, sock))
        except OSError:
            return ("unknown", None)

    def authorised(self, sock):
        """The connection ``sock`` made a request with the page's key: no longer shut for a new one."""
        with self.open_lock:
            if sock in self.open:
                self.open[sock] = True

    def shutdown_request(self, request, locked=False):
        if not locked:
            with self.open_lock:
                self.open.pop(request, None)
        self.holders.pop(request, None)
        self.addresses.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        """One line in the log (a client that went away, a read that timed out), never a traceback."""
        exc = sys.exc_info()[1]
        self.log(f"connection from {client_address[0]}: {exc.__class__.__name__}: {exc}")

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
