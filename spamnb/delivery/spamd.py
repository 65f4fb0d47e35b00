"""``spamnb serve --spamd ADDRESS``: SpamAssassin's spamc/spamd protocol.

Postfix (through ``spamc``), Exim's ``spam =`` ACL condition, Haraka and
MailScanner already speak this protocol to a content filter; answering it
puts spamnb where ``spamd`` is, with no process started per message. The
protocol is SpamAssassin's ``spamd/PROTOCOL``, versions 1.0 to 1.5, as its
``spamd`` implements it. One request per connection::

    CHECK SPAMC/1.5\\r\\n            a method, the protocol version
    User: alice\\r\\n                optional headers
    Content-length: 1234\\r\\n       (without it: the message runs to the end of input)
    \\r\\n
    <the message>

and the reply::

    SPAMD/1.1 0 EX_OK\\r\\n
    Spam: True ; 9.0 / 2.9\\r\\n
    \\r\\n

What each method answers (:func:`answer`):

* ``CHECK``: the ``Spam:`` line alone. ``SYMBOLS``: with the strongest tokens,
  comma-separated, as the body; ``REPORT``: with a text report of them;
  ``REPORT_IFSPAM``: the report for spam only (and ``Yes``/``No`` in the
  ``Spam:`` line). ``PROCESS``: the message with spamnb's ``X-Spam-*`` header
  lines added and incoming verdict fields removed, every other byte as sent;
  ``HEADERS``: only its header block.
  ``PING``: ``PONG``. ``SKIP``: nothing.
* ``TELL`` (only with ``--allow-tell``, as spamd): ``Message-class: spam|ham``
  with ``Set: local`` learns the message into the user's model (moving it when
  it was learned as the other class), ``Remove: local`` forgets it; the reply
  says ``DidSet: local`` / ``DidRemove: local`` when that changed the model.
  Who may teach what (:func:`tell`, docs/security.md): the served model, which
  scores everyone without a model of their own, learns only with
  ``--allow-tell-served`` as well; on a Unix socket ``User:`` must name the
  connecting process's own user (``SO_PEERCRED``; over TCP from this machine, the
  kernel's socket table) unless it runs as root or as the server's user. From
  another host ``User:`` is taken as sent, as spamd takes it from the addresses
  ``--allow`` admits.

**The score scale.** S and T in ``Spam: True ; S / T`` are log-odds:
S = log P(spam|x)/P(ham|x), the score of spamnb's ``X-Spam-Status``, and
T = log(c/(1 − c)) for the model's spam cut-off c (0.95: T = 2.9), so S > T
exactly when the verdict is spam; a clean message scores below 0. ``True``
is the spam verdict only: an unsure message says ``False`` (its
``X-Spam-Status`` says ``No, ... tests=SPAMNB_UNSURE``). One decimal each, as
spamd writes them (Haraka and Exim parse that form). ``PROCESS`` and
``HEADERS`` remove incoming verdict fields before adding spamnb's
(:func:`spamnb.delivery.hook.replace_verdicts`), whose ``X-Spam-Status`` has S
and T as ``score=`` and ``required=``, the form spamass-milter reads.

**Errors** are ``SPAMD/1.0 <code> <text>`` with the sysexits code: 76
EX_PROTOCOL for a bad request (unknown method, malformed header, a
``Content-length`` the message does not match), 79 EX_TIMEOUT for a request
not received in time, 74 EX_IOERR when the model cannot be read, 67
EX_NOUSER for ``TELL`` for a user with no model of their own, 69
EX_UNAVAILABLE for ``TELL`` without ``--allow-tell`` (or into the served model
without ``--allow-tell-served``), 77 EX_NOPERM for ``TELL`` for another user, 75 EX_TEMPFAIL when the
server is at its connection cap, the model's lock stays busy or the store cannot
be reached for a ``TELL`` (74 for a scan), 70
EX_SOFTWARE for anything else. An error reply never names a file of the
server (the log has the whole reason). spamc passes the message through unchanged on
any of them (unless run with ``-x``).

**Limits.** A declared ``Content-length`` over ``max_length`` (``--spamd-max-bytes``,
:data:`MAX_LENGTH`) is refused at once, nothing read (EX_DATAERR: spamc passes the
message through), and so is a message without one that runs past it: the disk,
memory and time one request takes are bounded by it, not by bandwidth x timeout.
Below it, a message over ``max_bytes`` is answered as unscanned (score 0.0,
``Spam: False``), as spamc does for its own ``-s`` limit; for ``PROCESS``
it is returned as it came (held on disk while it arrives, never in memory
beyond :data:`SPOOL_BYTES`), never dropped. Every
request has a deadline (reading it, then writing the reply), and the
connections served at once are capped (``--max-connections``): one beyond the
cap waits up to :data:`SLOT_WAIT` for a slot while no more than the cap wait
with it, else it is answered EX_TEMPFAIL and closed at once, so a slow or
stalled client holds one thread for at most the deadline and a flood of idle
ones at most twice the cap of descriptors.

**Per-user models.** The ``User:`` header picks ``USER_MODELS/<user>/model.joblib``
when ``--user-models`` is given and that file exists, or the user's model in the
store of ``--store`` when there is one (:meth:`spamnb.storage.backend.Backend.for_user`);
otherwise the served model scores. A user name must be a plain name (:data:`_PLAIN_NAME`).
``USER_MODELS/<user>/config.toml``, when there, may hold a ``[decision]`` table
of the user's own: it replaces the site's decision for that user
(:meth:`Models.decision_for`; a broken or untrusted one is logged and the site's applies).

**Exim** sends the message in mbox form, a ``From `` envelope line first: it is
scored (and learned) as the message without it, and kept in ``PROCESS``'s output.
"""

from __future__ import annotations

import errno
import ipaddress
import math
import os
import pwd
import re
import socket
import socketserver
import stat
import struct
import tempfile
import threading
import time

from spamnb import checks, verdict
from spamnb.delivery import events
from spamnb.delivery.hook import decide, replace_verdicts
from spamnb.delivery.pipeline import LEARN_TIMEOUT
from spamnb.delivery.server import BoundedThreads, ServerError, claim_socket_path
from spamnb.storage.backend import Backend, StoreUnavailable
from spamnb.storage.store import LockTimeout, ModelError, lock_timeout
from spamnb.verdict import Boundary, threshold

#: sysexits.h, as spamd answers with them.
EX = {"EX_OK": 0, "EX_USAGE": 64, "EX_DATAERR": 65, "EX_NOINPUT": 66, "EX_NOUSER": 67, "EX_NOHOST": 68,
      "EX_UNAVAILABLE": 69, "EX_SOFTWARE": 70, "EX_OSERR": 71, "EX_OSFILE": 72, "EX_CANTCREAT": 73,
      "EX_IOERR": 74, "EX_TEMPFAIL": 75, "EX_PROTOCOL": 76, "EX_NOPERM": 77, "EX_CONFIG": 78,
      "EX_TIMEOUT": 79}

SCANNING = ("CHECK", "SYMBOLS", "REPORT", "REPORT_IFSPAM", "PROCESS", "HEADERS")
METHODS = SCANNING + ("TELL", "PING", "SKIP")
#: spamd reads at most 255 header lines; a line longer than this is not a header.
MAX_HEADERS = 255
MAX_LINE = 8192
#: The strongest tokens SYMBOLS and REPORT name (explain's default).
N_SYMBOLS = 15
#: A user name that picks a per-user model: a login or mailbox name, never a path.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+=-]{0,127}\Z")
_REQUEST_LINE = re.compile(rb"([A-Z_]+) SPAMC/(\d+)\.(\d+)\r?\n\Z")
CHUNK = 64 * 1024
#: Seconds a connection beyond the cap waits for a slot before EX_TEMPFAIL (at most
#: ``--max-connections`` of them wait, each in its own thread; one more gets it at once).
SLOT_WAIT = 2.0
#: An unscanned message for PROCESS is held in memory up to this, then on disk.
SPOOL_BYTES = 8 * 1024 * 1024
#: The largest message a spamd client may send (``--spamd-max-bytes``): 10 MB, twenty
#: times spamc's own default limit (``spamc -s``, 500 KB), so that spamc's limit, not
#: this one, decides for its users; Exim's spam condition sends any size (put a size
#: condition before it, see docs/security.md). It bounds each request's memory
#: (scanned in memory up to it) and disk (an unscanned PROCESS is spooled).
MAX_LENGTH = 10 * 1024 * 1024
#: An unscanned message's header block is looked for in its first bytes only.
MAX_HEADER_BLOCK = 1 << 20


class SpamdError(Exception):
    """A request answered with an error line: ``SPAMD/1.0 <code> <text>``."""

    def __init__(self, name: str, text: str, detail: str = ""):
        super().__init__(text)
        self.name = name
        self.detail = detail  # for the server's log only: it may name server paths

    def logged(self) -> str:
        """The reply's text and the whole reason, each said once (a reason that starts
        as the reply does is the reply's text with more detail: it alone)."""
        if not self.detail:
            return str(self)
        if self.detail.startswith(str(self).split(":", 1)[0]):
            return self.detail
        return f"{self} ({self.detail})"

    def line(self) -> bytes:
        text = " ".join(str(self).split())  # one line, whatever the cause said
        if self.name == "EX_PROTOCOL":
            text = f"Bad header line: {text}"  # spamd's wording, which clients log
        return f"SPAMD/1.0 {EX[self.name]} {text}\r\n".encode("ascii", "replace")


# -- reading a request -------------------------------------------------------------


class _Reader:
    """Buffered reads from a socket, none past ``deadline`` (EX_TIMEOUT then)."""

    def __init__(self, sock, deadline):
        self.sock = sock
        self.deadline = deadline
        self.buf = b""
        self.eof = False

    def _fill(self) -> bool:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SpamdError("EX_TIMEOUT", "Timeout: (request not received in time)")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(CHUNK)
        except socket.timeout:
            raise SpamdError("EX_TIMEOUT", "Timeout: (request not received in time)") from None
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def line(self) -> bytes:
        """The next line with its ending; what is left at EOF (b"" for nothing)."""
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                out, self.buf = self.buf[:i + 1], self.buf[i + 1:]
                return out
            if len(self.buf) > MAX_LINE:
                raise SpamdError("EX_PROTOCOL", "(line too long)")
            if self.eof or not self._fill():
                out, self.buf = self.buf, b""
                return out

    def chunks(self, length=None):
        """The body's bytes in pieces: ``length`` of them, or up to EOF."""
        left = math.inf if length is None else length
        while left > 0:
            if not self.buf and (self.eof or not self._fill()):
                return
            piece = self.buf[:left] if left < len(self.buf) else self.buf
            self.buf = self.buf[len(piece):]
            left -= len(piece)
            yield piece


def parse_request_line(line: bytes) -> tuple[str, tuple[int, int]]:
    """``(method, (major, minor))`` of ``CHECK SPAMC/1.5``; EX_PROTOCOL otherwise."""
    m = _REQUEST_LINE.match(line)
    if not m or m.group(1).decode() not in METHODS:
        shown = line[:60].decode("ascii", "replace").strip()
        raise SpamdError("EX_PROTOCOL", f"(unknown request: {shown!r})")
    return m.group(1).decode(), (int(m.group(2)), int(m.group(3)))


def parse_headers(reader: _Reader, into=None) -> dict:
    """The request's headers (names as sent; spamd's are case-sensitive) up to the blank line;
    ``into``: the dict to read them into (what was read stays there when one is refused)."""
    headers = {} if into is None else into
    for _ in range(MAX_HEADERS + 1):
        line = reader.line()
        if not line.endswith(b"\n"):
            raise SpamdError("EX_PROTOCOL", "(EOF during headers)")
        line = line.rstrip(b"\r\n")
        if not line:
            return check_headers(headers)
        name, sep, value = line.partition(b":")
        if not sep or not name or not name.isascii() or b" " in name:
            raise SpamdError("EX_PROTOCOL", "(header not in 'Name: value' format)")
        headers[name.decode("ascii")] = value.strip().decode("latin-1")
    raise SpamdError("EX_PROTOCOL", "(too many headers)")


def check_headers(headers: dict) -> dict:
    """Headers as spamd accepts them; EX_PROTOCOL for one it would refuse."""
    length = headers.get("Content-length")
    if length is not None and not (length.isascii() and length.isdigit()):
        raise SpamdError("EX_PROTOCOL", "(Content-Length contains non-numeric bytes)")
    user = headers.get("User")
    if user is not None and any(ord(c) < 0x20 or ord(c) == 0x7F for c in user):
        raise SpamdError("EX_PROTOCOL", "(User header contains control chars)")
    if headers.get("Message-class", "spam").lower() not in ("spam", "ham"):
        raise SpamdError("EX_PROTOCOL", "(Message-class header contains invalid class)")
    if "Compress" in headers:
        raise SpamdError("EX_PROTOCOL", "(compression not supported: send the message uncompressed)")
    return headers


def envelope_split(raw: bytes) -> tuple[bytes, bytes]:
    """``(from_line, message)``: Exim's mbox ``From `` line apart from the message."""
    if raw.startswith(b"From "):
        end = raw.find(b"\n")
        if end >= 0:
            return raw[:end + 1], raw[end + 1:]
    return b"", raw


# -- replies -------------------------------------------------------------------------


def spam_line(label: str, score: float, threshold: float, method: str) -> bytes:
    """``Spam: True ; 9.0 / 2.9``: the verdict, S and T on the log-odds scale (module doc)."""
    is_spam = label == "spam"
    word = ("Yes" if is_spam else "No") if method == "REPORT_IFSPAM" else ("True" if is_spam else "False")
    return f"Spam: {word} ; {verdict.clamped(score):.1f} / {verdict.clamped(threshold):.1f}".encode("ascii")


def symbol(token: str, contribution: float) -> str:
    """One SYMBOLS item: the token (header-safe, no commas or spaces) and its weight.
    A comma, which separates the items, reads as %2C (spamc -y prints the list as it
    is: ``subject:a%2Cb``, not ``subject:a\\u002cb``); a space as _."""
    return f"{verdict.header_safe(token.replace(',', '%2C').replace(' ', '_'))}({contribution:+.2f})"


def report(label, p, score, t, evidence, name) -> bytes:
    """REPORT's body: the verdict and the tokens that decided it, as a table in
    SpamAssassin's report layout (points, then the rule: here the token)."""
    lines = [f"spamnb {verdict.__version__} naive Bayes verdict: {label}, P(spam)={p:.6f}, model {name}",
             "",
             f"Content analysis details:   ({score:.1f} points, {t:.1f} required)",
             "",
             "  pts token (log-odds it adds)",
             "----- " + "-" * 50]
    lines += [f"{c:+5.1f} {verdict.header_safe(tok)}" for tok, c in evidence or ()]
    return ("\r\n".join(lines) + "\r\n").encode("ascii", "replace")


def reply(headers=(), body=b"", *, length=True) -> bytes:
    """``SPAMD/1.1 0 EX_OK``, headers, blank line, body."""
    out = [b"SPAMD/1.1 0 EX_OK\r\n"]
    if length:
        out.append(b"Content-length: %d\r\n" % len(body))
    out += [h + b"\r\n" for h in headers]
    out.append(b"\r\n")
    out.append(body)
    return b"".join(out)


# -- the models ------------------------------------------------------------------------


class Models:
    """The served model, and per-user models (cached backends): ``USER_MODELS/<user>/model.joblib``
    with ``--user-models``, the user's model in the store of ``--store`` with ``store_users``
    (``--store-users``)."""

    CACHE = 256
    #: Names known to have no model of their own, kept apart from the cache of backends:
    #: ``User:`` is the client's to choose, so new names (a hostile client's, one per request)
    #: only ever evict each other, never a real user's loaded model; and at most this many.
    NO_MODEL_CACHE = 4096
    #: How long the store's "no model of that user" is believed (a model file is looked for
    #: at every request: a stat). A user's model pushed to the store is served within this.
    NO_MODEL_SECONDS = 10.0

    def __init__(self, served: Backend, user_models=None, log=None, *, store_users=False,
                 decision=verdict.MODELS_OWN, recorder=None):
        self.served = served
        self.store_users = store_users and served.per_user
        #: The decision options over every model's cut-offs (the [decision] table: swapped whole on reload).
        self.decision = decision
        self.recorder = recorder or events.NOTHING
        self.user_models = os.path.abspath(user_models) if user_models else None
        self.log = log or (lambda text: None)
        self._backends: dict[str, Backend] = {}
        self._decisions: dict[str, tuple] = {}
        self._lock = threading.Lock()
        self._failed: dict[str, str] = {}  # user model -> why it was last unreadable (said once)
        #: user name -> when (time.monotonic()) they were found to have no model (:data:`NO_MODEL_CACHE`)
        self.no_model: dict[str, float] = {}

    def fell_back(self, backend: Backend, exc) -> None:
        """Log that the user model of ``backend`` could not be read and the served model
        answered instead: once per model and reason, not once per message."""
        why = str(exc)
        with self._lock:
            if self._failed.get(backend.name) == why:
                return
            self._failed[backend.name] = why
        self.log(f"cannot read user model {backend.name}: {why}; scanning with {self.served.name} instead")

    @property
    def per_user(self) -> bool:
        return bool(self.user_models) or self.store_users

    def user_path(self, user):
        """``USER_MODELS/<user>/model.joblib``, or None (no --user-models, no user)."""
        return None if user is None else self._model_file(plain_user(user))

    def _model_file(self, name):
        """:meth:`user_path` of a name :func:`plain_user` has checked."""
        return os.path.join(self.user_models, name, "model.joblib") if self.user_models else None

    def decision_for(self, user) -> tuple:
        """The decision for ``user``: the ``[decision]`` table of their
        ``USER_MODELS/<user>/config.toml`` when it has one, else the site's
        (:attr:`decision`). Reread when the file changes."""
        path = self.user_path(user)
        if path is None:
            return self.decision
        conf = os.path.join(os.path.dirname(path), "config.toml")
        try:
            st = os.stat(conf)
        except OSError:
            return self.decision
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._decisions.get(conf)
        if cached is None or cached[0] != stamp:
            cached = (stamp, self._user_decision(conf))
            with self._lock:
                _put_bounded(self._decisions, conf, cached, self.CACHE)
        return cached[1] or self.decision

    def _user_decision(self, conf):
        from spamnb.storage import settings

        try:
            # the one resolver over the user's own file alone: the decision as a unit, its values numbers
            layers = settings.Layers([(settings.USER, conf, *settings.read(conf))], env={})
            found = settings.resolve("serve", env={}, layers=layers, names=verdict.DECISION_OPTIONS)
            decision = verdict.Decision.of({n: s.value for n, s in found.items()}).check()
        except (ValueError, TypeError) as exc:  # settings.ConfigError and verdict.DecisionError are ValueErrors
            self.log(f"spamd: {conf}: {exc}; the site's decision applies")
            return None
        return decision or None

    def where(self, user) -> str:
        """Where the model of ``user`` would be (for a message saying there is none)."""
        path = self.user_path(user)
        return f"spamnb train --model {path}" if path else f"spamnb store push MODEL {self.served.for_user(user).name}"

    def for_user(self, user) -> tuple[Backend, bool]:
        """``(backend, own)``: the user's model when there is one, else the served one."""
        if user is None or not self.per_user:
            return self.served, False
        name = plain_user(user)
        path = self._model_file(name)
        if self._has_none(name, path):
            return self.served, False
        with self._lock:
            backend = self._backends.pop(name, None)
        if backend is None:
            if path is not None:
                from spamnb.storage.filestore import FileBackend

                backend = FileBackend(path, allow_insecure=self.served.allow_insecure, log=self.log).resident()
            else:
                backend = self.served.for_user(name).resident()
        if not backend.exists():
            with self._lock:
                _put_bounded(self.no_model, name, time.monotonic(), self.NO_MODEL_CACHE)
            return self.served, False
        with self._lock:
            self.no_model.pop(name, None)
            _put_bounded(self._backends, name, backend, self.CACHE, dropped=lambda b: b.close())
        return backend, True

    def _has_none(self, name, path) -> bool:
        """Whether user ``name`` is known to have no model: ``path``, their model file, is
        still not there, or the store said so less than :data:`NO_MODEL_SECONDS` ago."""
        found = self.no_model.get(name)
        if found is None:
            return False
        return not os.path.isfile(path) if path is not None else time.monotonic() - found < self.NO_MODEL_SECONDS


def _put_bounded(cache: dict, key, value, cap, dropped=None):
    """``cache[key] = value`` as its most recent entry; the oldest entries over ``cap``
    go (``dropped(value)`` for each). The caller holds the lock."""
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > cap:
        old = cache.pop(next(iter(cache)))
        if dropped is not None:
            dropped(old)


def plain_user(user) -> str:
    """``user`` when it is a plain name (a login or mailbox name, never a path); EX_PROTOCOL otherwise."""
    if not _PLAIN_NAME.match(user) or ".." in user:
        raise SpamdError("EX_PROTOCOL", "(User header is not a plain user name)")
    return user


# -- answering -------------------------------------------------------------------------


def judge(model, msg: bytes, n_evidence: int, decision=verdict.MODELS_OWN):
    """The :class:`spamnb.verdict.Decided` verdict of ``msg`` under ``model``
    (its own cut-offs unless ``decision`` overrides them) and T, the spam cut-off as log-odds."""
    d = decide(model, msg, decision, n_evidence=n_evidence)
    return d, threshold(d.cutoffs[1])


def answer(method, version, headers, raw, models: Models, *, allow_tell=False, compact=None,
           tell_served=False, peer_uid=None, raddr=None) -> bytes:
    """The reply to one whole request (the message in ``raw``); ``peer_uid``: the
    connecting process's user on a Unix socket (None over TCP); ``raddr``: the
    client's IP address, for the line."""
    if method == "TELL":
        return tell(headers, raw, models, allow_tell=allow_tell, compact=compact, tell_served=tell_served,
                    peer_uid=peer_uid, raddr=raddr)
    start = time.perf_counter()
    backend, own = models.for_user(headers.get("User"))
    envelope, msg = envelope_split(raw)
    want = N_SYMBOLS if method in ("SYMBOLS", "REPORT", "REPORT_IFSPAM") else 0
    decision = models.decision_for(headers.get("User"))
    try:
        d, t = judge(backend.view(), msg, want, decision)  # view(): refused unless trusted
    except (ModelError, OSError) as exc:
        if not own:
            raise unreadable(exc) from None
        # A user's model the server cannot read (copied by root at 0600, damaged, a store
        # that cannot answer): the message is still scanned, with the site's model, whose
        # name the verdict header carries; the log says why (once per user model and reason).
        models.fell_back(backend, exc)
        backend = models.served
        try:
            d, t = judge(backend.view(), msg, want, decision)
        except (ModelError, OSError) as exc2:
            raise unreadable(exc2) from None
    label, p, score, evidence = d.label, d.p, d.score, d.evidence
    models.recorder.message("spamd", label, score, p, d.cutoffs, len(raw), time.perf_counter() - start, raw=msg,
                            user=headers.get("User"), raddr=raddr)
    line = spam_line(label, score, t, method)
    name = verdict.model_name(backend.short_name, backend.is_default)
    if method == "CHECK":
        return reply(headers=[line], length=False)
    if method in ("PROCESS", "HEADERS"):
        out = envelope + replace_verdicts(msg, verdict.header_lines(label, p, score, name, required=t))
        if method == "HEADERS":
            out = out[:_find_header_end(out) or len(out)]
        if version < (1, 2):
            return b"SPAMD/1.0 0 EX_OK\r\n" + out
        return reply(headers=[line] if version >= (1, 3) else [], body=out)
    if method == "SYMBOLS":
        body = ",".join(symbol(tok, c) for tok, c in evidence or ()).encode("ascii")
        if version < (1, 3):
            body += b"\r\n"
    elif method == "REPORT" or label == "spam":
        body = report(label, p, score, t, evidence, name)
    else:
        body = b""  # REPORT_IFSPAM of a message that is not spam
    if version < (1, 3):
        return reply(headers=[line], body=body, length=False)
    return reply(headers=[line], body=body)


def unreadable(exc) -> SpamdError:
    """EX_IOERR for a model that cannot be read now: the reply says whether its store
    could not answer, the log says the whole reason (which may name a server path)."""
    text = "cannot read the model" + (": its store cannot answer now" if isinstance(exc, StoreUnavailable) else "")
    return SpamdError("EX_IOERR", text, str(exc))


def _find_header_end(out: bytes):
    """End of the header block of ``out`` with its blank line, or None (HEADERS' reply)."""
    ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := out.find(sep)) >= 0]
    return min(ends) if ends else None


def tell(headers, raw, models: Models, *, allow_tell, compact=None, tell_served=False, peer_uid=None,
         raddr=None) -> bytes:
    """TELL: learn (``Set: local``) or forget (``Remove: local``) into the user's model.

    Only the user's own model learns unless ``tell_served``: the served model
    scores everyone else, so one client's TELL would change their verdicts too.
    ``peer_uid`` (a Unix socket's peer): ``User:`` must be that user's name, unless
    the peer is root or the server's own user (an MTA or a script of the admin)."""
    if not allow_tell:
        raise SpamdError("EX_UNAVAILABLE",
                         "Service Unavailable: TELL commands are not enabled, set the --allow-tell switch.")
    set_local = "local" in headers.get("Set", "").lower()
    remove_local = "local" in headers.get("Remove", "").lower()
    if set_local and remove_local:
        raise SpamdError("EX_PROTOCOL", "Unable to set local and remove local in the same operation.")
    label = headers.get("Message-class", "").lower() or None
    if set_local and label is None:
        raise SpamdError("EX_PROTOCOL", "(Set: local needs Message-class: spam or ham)")
    user = headers.get("User")
    if peer_uid == UNKNOWN_PEER and user is not None:
        raise SpamdError("EX_NOPERM", f"TELL for user {user[:64]!r} refused: the connecting process on this "
                                      f"machine could not be identified (its socket is gone)")
    if peer_uid is not None and user is not None and peer_uid not in (0, os.geteuid()) \
            and user != _user_name(peer_uid):
        raise SpamdError("EX_NOPERM", f"TELL for user {user[:64]!r} refused: the connecting process runs as "
                                      f"another user (uid {peer_uid})")
    backend, own = models.for_user(user)
    if models.per_user and user is not None and not own:
        raise SpamdError("EX_NOUSER", f"no model of user {user!r} (the administrator makes one with "
                                      f"spamnb train or spamnb store push)", models.where(user))
    if backend.is_default:
        raise SpamdError("EX_UNAVAILABLE", "the default model does not learn: train a model of your own")
    if backend is models.served and not tell_served:
        raise SpamdError("EX_UNAVAILABLE", "TELL into the shared model is not enabled (send User: with a "
                                           "model of its own, or start the server with --allow-tell-served)")
    _, msg = envelope_split(raw)
    done, forgot = {}, None
    if set_local:
        # a store emptied meanwhile (a Redis restarted without its data) starts again from the default model
        done = _update(backend, [(msg, label, None)], forget=False, compact=compact, create=_seed)
    elif remove_local:
        for cls in (label,) if label else ("spam", "ham"):
            try:
                done, forgot = _update(backend, [(msg, cls, None)], forget=True, compact=compact), cls
                break
            except ValueError:  # not learned as that class: nothing to forget there
                continue
    did = []
    if set_local and done.get("learned", 0) + done.get("moved", 0):
        did.append(b"DidSet: local")
        models.recorder.learned(label, "tell", raw=msg, user=user, was=_other(label) if done.get("moved") else None,
                                raddr=raddr)
    if remove_local and done.get("forgotten", 0):
        did.append(b"DidRemove: local")
        models.recorder.forgotten(forgot, "tell", raw=msg, user=user, raddr=raddr)
    return reply(headers=did, length=False)


def _other(label):
    return "ham" if label == "spam" else "spam"


def _seed():
    from spamnb.storage.modelfile import default_seed

    return default_seed()


def _update(backend, items, *, forget, compact, create=None):
    """Learn or forget, as ``spamnb learn`` (upkeep such as a compaction through ``compact``;
    ``create()``: the model to start from when the store holds none)."""
    try:
        return backend.learn(items, forget=forget, timeout=lock_timeout(LEARN_TIMEOUT), warn=backend.log,
                             later=compact, create=create)
    except ModelError as exc:  # a busy lock or store is worth retrying; the rest is the model's
        if isinstance(exc, LockTimeout):
            name, text = "EX_TEMPFAIL", "timed out waiting for the model's lock, try again"
        elif isinstance(exc, StoreUnavailable):
            name, text = "EX_TEMPFAIL", "the model's store cannot be reached now, try again"
        else:
            name, text = "EX_IOERR", "the model cannot be updated"
        raise SpamdError(name, f"not learned: {text}", str(exc)) from None


def _user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


# -- the server -------------------------------------------------------------------------


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        srv = self.server
        conn = self.request
        start = time.monotonic()
        reader = _Reader(conn, start + srv.timeout_s)
        #: what is known of the request so far, for its error line (:meth:`_failed`)
        self.facts = {"raddr": client_ip(self.client_address)}

        def fail(reason, exc):  # the delivery paths' boundary: an error reply, spamc passes the mail
            if not isinstance(exc, SpamdError):  # a bug: one bad message never stops the server
                srv.log(f"spamd: {reason}")
                exc = SpamdError("EX_SOFTWARE", f"internal error: {exc.__class__.__name__}")
            else:
                srv.log(f"spamd: {exc.logged()}")
            self._failed(exc.name.lower(), str(exc))
            return exc.line()

        with Boundary(fail) as boundary:
            out = self._request(reader)
        if boundary.result is not None:
            out = boundary.result
        if out:
            self._send([out], time.monotonic() + srv.timeout_s)
        srv.models.recorder.answered(time.monotonic() - start)

    def _failed(self, kind, text):
        """The error line of this request: the mail went on unscanned unless it was a TELL
        (a learn not done) or no message came at all (PING, SKIP)."""
        facts = self.facts
        method = facts.get("method")
        raw = facts.get("raw")
        size = facts.get("size") if raw is None else len(raw)
        srv = self.server
        # a connection that sent no request (a port check) had no mail; a TELL's was delivered already
        unscanned = method in SCANNING or (method is None and facts.get("sent", False))
        srv.models.recorder.error(kind, text, via="spamd", unscanned=unscanned,
                                  raw=raw[:MAX_HEADER_BLOCK] if raw is not None else None, size=size,
                                  user=facts.get("headers", {}).get("User"), raddr=facts.get("raddr"),
                                  mid=facts.get("mid"))

    def _request(self, reader) -> bytes | None:
        srv = self.server
        facts = self.facts
        first = reader.line()
        facts["sent"] = bool(first)
        method, version = parse_request_line(first)
        facts["method"] = method
        headers = {}
        if method in ("PING", "SKIP"):
            if version >= (1, 5):  # 1.5 clients send a (usually empty) header block here too
                parse_headers(reader)
        elif version > (1, 0) or method == "TELL":  # 1.0 requests have no headers: the message follows
            headers = parse_headers(reader, facts.setdefault("headers", {}))
        if method == "PING":
            return b"SPAMD/1.5 0 PONG\r\n"
        if method == "SKIP":
            return None
        length = headers.get("Content-length")
        length = int(length) if length is not None else None
        facts["size"] = length
        if length is not None and length > srv.max_length:
            raise too_long(srv.max_length)
        if length is not None and length > srv.max_bytes:
            return self._unscanned(reader, method, version, headers, length)
        raw = facts["raw"] = b"".join(reader.chunks(length if length is not None else srv.max_bytes + 1))
        if length is not None and len(raw) != length:
            raise SpamdError("EX_PROTOCOL", f"(Content-Length mismatch: Expected {length} bytes, "
                                            f"got {len(raw)} bytes)")
        if len(raw) > srv.max_bytes:
            return self._unscanned(reader, method, version, headers, None, raw)
        # The peer's user is asked only for TELL, the one request that reads it: over TCP
        # it is a scan of the kernel's socket table (/proc/self/net/tcp, every connection
        # of the host, TIME_WAIT ones too), which took 29% of the server's CPU per CHECK
        # on a host with 736 lines there (issue 33; bench_ref.py --only server).
        peer_uid = srv.peer_uid(self.request, self.client_address) if method == "TELL" else None
        return answer(method, version, headers, raw, srv.models, allow_tell=srv.allow_tell,
                      compact=srv.compactor.soon, tell_served=srv.tell_served, peer_uid=peer_uid,
                      raddr=facts["raddr"])

    def _unscanned(self, reader, method, version, headers, length, head=b""):
        """A message over the limit: neither scored nor learned. PROCESS streams it
        back as it came, HEADERS returns its own header block, the others say 0.0."""
        srv = self.server
        if method == "TELL":
            raise SpamdError("EX_DATAERR", f"message over {srv.max_bytes} bytes: not learned")
        backend, _ = srv.models.for_user(headers.get("User"))
        try:
            t = threshold(srv.models.decision_for(headers.get("User")).cutoffs(backend.view().cutoffs)[1])
        except (ModelError, OSError) as exc:
            raise unreadable(exc) from None
        line = spam_line("ham", 0.0, t, method)
        srv.log(f"spamd: message over {srv.max_bytes} bytes answered unscanned")
        rest = reader.chunks(None if length is None else length - len(head))
        if length is None:
            rest = _at_most(rest, srv.max_length - len(head), srv.max_length)
        seen = _Seen(head, rest)  # its size and Message-ID, for its line
        rest = iter(seen)
        self.facts.pop("raw", None)
        self.facts["size"] = length
        try:
            return self._unscanned_reply(method, version, line, head, rest, srv)
        finally:
            if not seen.failed:  # (a failure has its own error line)
                srv.models.recorder.error("too_big", f"over {srv.max_bytes} bytes (--max-bytes): answered unscanned",
                                          via="spamd", unscanned=True, size=seen.size, mid=seen.mid(),
                                          user=headers.get("User"), raddr=self.facts["raddr"])

    def _unscanned_reply(self, method, version, line, head, rest, srv):
        if method == "PROCESS":
            # Read it all before answering: spamc (like most clients) reads nothing until it
            # has sent everything, so echoing while it sends would deadlock once the sockets'
            # buffers are full. Beyond SPOOL_BYTES it waits on disk, not in memory.
            with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
                spool.write(head)
                for piece in rest:
                    spool.write(piece)
                size = spool.tell()
                spool.seek(0)
                top = [b"SPAMD/1.0 0 EX_OK\r\n"] if version < (1, 2) else [
                    b"SPAMD/1.1 0 EX_OK\r\n", b"Content-length: %d\r\n" % size,
                    line + b"\r\n" if version >= (1, 3) else b"", b"\r\n"]
                self._send([*top, *iter(lambda: spool.read(CHUNK), b"")], time.monotonic() + srv.timeout_s)
            return None
        block = head
        for piece in rest:  # read what the client sends before answering (it may wait to finish sending)
            if method == "HEADERS" and len(block) < MAX_HEADER_BLOCK and _find_header_end(block) is None:
                block += piece
        if method == "HEADERS":
            body = block[:_find_header_end(block) or len(block)]
            if version < (1, 2):
                return b"SPAMD/1.0 0 EX_OK\r\n" + body
            return reply(headers=[line] if version >= (1, 3) else [], body=body)
        body = b"" if method == "CHECK" else b"message too large: not scanned\r\n"
        return reply(headers=[line], body=body, length=version >= (1, 3) and method != "CHECK")

    def _send(self, pieces, deadline):
        conn = self.request
        try:
            for piece in pieces:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout
                conn.settimeout(left)
                conn.sendall(piece)
        except (OSError, SpamdError) as exc:
            self.server.log(f"spamd: reply not delivered: {exc}")


class _Seen:
    """The pieces of an unscanned message as they pass: its size, and its first bytes
    for its Message-ID."""

    def __init__(self, head, rest):
        self.rest = rest  # the pieces after ``head``, which the caller has already
        self.size = len(head)
        self.top = head[:65536]
        self.failed = True  # until every piece went by

    def __iter__(self):
        for piece in self.rest:
            yield self._saw(piece)
        self.failed = False

    def _saw(self, piece):
        self.size += len(piece)
        if len(self.top) < 65536:
            self.top += piece[:65536 - len(self.top)]
        return piece

    def mid(self):
        return events.message_id(self.top)


def client_ip(client_address):
    """The client's IP address (``raddr=``); None on a Unix socket."""
    if isinstance(client_address, tuple) and client_address:
        ip = str(client_address[0])
        return ip[7:] if ip.startswith("::ffff:") else ip
    return None


def too_long(cap):
    return SpamdError("EX_DATAERR", f"message over {cap} bytes (the server's --spamd-max-bytes): not scanned")


def _at_most(pieces, left, cap):
    """``pieces`` while they total at most ``left`` bytes; EX_DATAERR (over ``cap``) past it."""
    for piece in pieces:
        left -= len(piece)
        if left < 0:
            raise too_long(cap)
        yield piece


class _SpamdServer(BoundedThreads):
    daemon_threads = False
    block_on_close = True
    request_queue_size = 128

    def configure(self, models, *, max_bytes, timeout, allow_tell, log, compactor, max_connections,
                  tell_served=False, max_length=MAX_LENGTH):
        self.models = models
        self.max_length = max_length
        self.max_bytes = min(max_bytes, max_length)
        self.timeout_s = timeout
        self.allow_tell = allow_tell
        self.tell_served = tell_served
        self.log = log
        self.compactor = compactor
        # spamc passes a message through unfiltered when refused: a burst waits a moment instead,
        # as many as are served at most; beyond them (an idle flood) refused at once
        self.bound_threads(max_connections, busy=SpamdError("EX_TEMPFAIL", "too many connections").line(),
                           wait=SLOT_WAIT)

    def peer_uid(self, conn, client_address=None):
        """The connecting process's user; None where the socket cannot say (TCP)."""
        return None

    def unserved(self, kind, client_address, count):
        """Beyond ``--max-connections`` (and the wait): answered EX_TEMPFAIL; outside ``--allow``:
        closed unread. spamc passes the mail either way."""
        busy = kind == "busy"
        self.models.recorder.error("ex_tempfail" if busy else kind,
                                   "too many connections" if busy else "not in --allow: closed unread",
                                   via="spamd", unscanned=True, count=count,
                                   raddr=client_ip(client_address) if client_address else None)


class TCPServer(_SpamdServer, socketserver.TCPServer):
    allow_reuse_address = True

    def __init__(self, host, port, allowed):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.allowed = allowed
        super().__init__((host, port), _Handler)

    def verify_request(self, request, client_address):
        """Connections from outside the allowed networks are closed before a byte is read."""
        if client_allowed(client_address, self.allowed):
            return True
        self.log(f"spamd: connection from {client_address[0]} refused (not in --allow)")
        self.tally_unserved("not_allowed", client_address)
        return False

    def close(self):
        self.server_close()

    def peer_uid(self, conn, client_address=None):
        """The local user of a peer on this machine (the kernel's socket table, as identd
        reads it); None for a peer on another host; :data:`UNKNOWN_PEER` for one on this
        machine the table does not list (a client that reset its connection after
        sending: TELL then trusts no ``User:``)."""
        try:  # the address accept() gave: a reset connection has no peer name any more
            peer = client_address or conn.getpeername()
            ip = ipaddress.ip_address(peer[0])
        except (OSError, ValueError):
            return UNKNOWN_PEER
        mapped = getattr(ip, "ipv4_mapped", None)  # an IPv4 client of a dual-stack socket
        if not (mapped or ip).is_loopback:
            return None
        try:
            mine = conn.getsockname()
        except OSError:
            return UNKNOWN_PEER
        family = conn.family
        if mapped:  # listed in the IPv4 table
            family = socket.AF_INET
            peer, mine = (str(mapped), peer[1]), (str(ipaddress.ip_address(mine[0]).ipv4_mapped), mine[1])
        uid = loopback_peer_uid(family, peer, mine)
        return UNKNOWN_PEER if uid is None else uid

    def where(self):
        host, port = self.server_address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class UnixServer(_SpamdServer, socketserver.UnixStreamServer):
    def __init__(self, path, mode):
        claim_socket_path(path)
        old = os.umask(0o177)
        try:
            super().__init__(path, _Handler)
        finally:
            os.umask(old)
        os.chmod(path, mode)
        self.path = path

    def where(self):
        return self.path

    def peer_uid(self, conn, client_address=None):
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1]

    def close(self):
        self.server_close()
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except OSError:
            pass


#: A peer on this machine whose user cannot be told: fails TELL's identity check.
UNKNOWN_PEER = -1


def loopback_peer_uid(family, peer, mine):
    """The uid owning the TCP socket at ``peer`` connected to ``mine``, from
    ``/proc/net/tcp`` (``tcp6`` for an AF_INET6 socket); None when it is not listed."""
    def hexed(address):
        if family == socket.AF_INET:
            raw = socket.inet_pton(socket.AF_INET, address[0])
        else:
            raw = socket.inet_pton(socket.AF_INET6, address[0].split("%")[0])
        words = struct.unpack(f"={len(raw) // 4}I", raw)  # each 32-bit word in host order
        return "".join(f"{w:08X}" for w in words) + f":{address[1]:04X}"

    try:
        want = (hexed(peer), hexed(mine))
        # /proc/self/net: /proc/net is hidden under systemd's ProcSubset=pid (the spamd unit's)
        with open("/proc/self/net/tcp" if family == socket.AF_INET else "/proc/self/net/tcp6") as f:
            next(f)  # the column names
            for line in f:
                fields = line.split()
                if len(fields) > 7 and (fields[1], fields[2]) == want:
                    return int(fields[7])
    except (OSError, ValueError, StopIteration):
        return None
    return None


# -- addresses -------------------------------------------------------------------------

LOOPBACK = checks.loopback()
DEFAULT_PORT = 783


def client_allowed(client_address, allowed) -> bool:
    """Whether a TCP client's address is in the ``allowed`` networks (an IPv4 client
    on an IPv6 socket as its IPv4 address)."""
    try:
        ip = ipaddress.ip_address(client_address[0])
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return any(ip in net for net in allowed)


def check_listening(addresses, allow=()):
    """``([listen address...], networks)`` of ``--spamd`` and ``--allow``
    (:func:`spamnb.checks.listening`), ValueError naming the option when one is bad or
    listens beyond loopback without ``allow``: ``serve`` asks before it loads any model."""
    try:
        nets = checks.networks(allow)
    except ValueError as exc:
        raise ValueError(f"--allow {exc}") from None
    try:
        return checks.listening(addresses, nets, "--allow CIDR (e.g. --allow 192.0.2.0/24)"), nets
    except ValueError as exc:
        raise ValueError(f"--spamd {exc}") from None


def open_servers(addresses, models, *, allow=(), max_bytes, timeout, allow_tell=False, unix_mode=0o600,
                 max_connections, compactor, log, tell_served=False, max_length=MAX_LENGTH):
    """The listening spamd servers of ``addresses`` (ValueError/ServerError/OSError when one cannot)."""
    listen, nets = check_listening(addresses, allow)
    servers = []
    try:
        for text, (kind, *where) in zip(addresses, listen):
            try:
                srv = UnixServer(where[0], unix_mode) if kind == "unix" else TCPServer(where[0], where[1],
                                                                                      LOOPBACK + nets)
            except OSError as exc:
                hint = (" (a port below 1024 needs root or CAP_NET_BIND_SERVICE: see contrib/systemd, "
                        "or pick a port above 1023 and give spamc -p PORT)"
                        if kind == "tcp" and where[1] < 1024 and exc.errno == errno.EACCES else "")
                raise ServerError(f"cannot listen on {text}: {exc.strerror or exc}{hint}") from None
            srv.configure(models, max_bytes=max_bytes, timeout=timeout, allow_tell=allow_tell, log=log,
                          compactor=compactor, max_connections=max_connections, tell_served=tell_served,
                          max_length=max_length)
            servers.append(srv)
    except BaseException:
        for srv in servers:
            srv.close()
        raise
    return servers


