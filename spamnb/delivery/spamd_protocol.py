"""SpamAssassin's spamc/spamd protocol: reading a request, answering it.

Postfix (through ``spamc``), Exim's ``spam =`` ACL condition, Haraka and
MailScanner already speak this protocol to a content filter; answering it
puts spamnb where ``spamd`` is, with no process started per message. The
protocol is SpamAssassin's ``spamd/PROTOCOL``, versions 1.0 to 1.5, as its
``spamd`` implements it. This module holds the protocol: a request read
(:class:`Reader`, :func:`parse_request_line`, :func:`parse_headers`), the reply
to it (:func:`answer`, :func:`tell`, :func:`spam_line`, :func:`symbol`,
:func:`report`) and its errors (:class:`SpamdError`). The listeners that accept the
connections, and their limits, are :mod:`spamnb.delivery.spamd`; the per-user
models :mod:`spamnb.delivery.usermodels`. One request per connection::

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
  Who may teach what (:mod:`spamnb.delivery.access`, docs/security.md): the served
  model, which scores everyone without a model of their own, learns only with
  ``--allow-tell-served`` as well; a process on this machine (on a Unix socket, or
  over TCP from loopback or any other address of this machine) must name its own
  user in ``User:`` (``SO_PEERCRED``; over TCP the kernel's socket table) unless it
  runs as root, as the server's user, as a system account (an MTA's) or as one of
  ``--spamd-trusted-user``. From another host ``User:`` is taken as
  sent, as spamd takes it from the addresses ``--allow`` admits.

**The score scale.** S and T in ``Spam: True ; S / T`` are log-odds:
S = log P(spam|x)/P(ham|x), the score of spamnb's ``X-Spam-Status``, and
T = log(c/(1 − c)) for the model's spam cut-off c (0.95: T = 2.9), so S > T
exactly when the verdict is spam; a clean message scores below 0. ``True``
is the spam verdict only: an unsure message says ``False`` (its
``X-Spam-Status`` says ``No, ... tests=SPAMNB_UNSURE``). One decimal each, as
spamd writes them (Haraka and Exim parse that form). ``PROCESS`` and
``HEADERS`` remove incoming verdict fields before adding spamnb's
(the one pipeline's verdict block, as ``spamnb filter`` writes it), whose ``X-Spam-Status`` has S
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

**Exim** sends the message in mbox form, a ``From `` envelope line first: it is
scored (and learned) as the message without it, and kept in ``PROCESS``'s output.
"""

from __future__ import annotations

import math
import re
import socket
import time

from spamnb import verdict
from spamnb.delivery import access, pipeline
from spamnb.storage.backend import StoreUnavailable
from spamnb.storage.store import LockTimeout, ModelError, lock_timeout

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
_REQUEST_LINE = re.compile(rb"([A-Z_]+) SPAMC/(\d+)\.(\d+)\r?\n\Z")
CHUNK = 64 * 1024


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


class Reader:
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


def parse_headers(reader: Reader, into=None) -> dict:
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


# -- answering -------------------------------------------------------------------------


def namer(method, headers, rules=None, peer=None):
    """The ``may_name`` of :meth:`spamnb.delivery.usermodels.Models.pick` for a spamd
    request: :func:`may_name`, which refuses (EX_NOPERM) rather than answer no. Asked only
    for a user with a model of their own: only that tells users apart, and over TCP the
    question is a scan of the kernel's socket table."""
    def named(user):
        may_name(method, headers, rules, peer)
        return True
    return named


def answer(method, version, headers, raw, models, *, rules=None, peer=None, compact=None,
           raddr=None) -> bytes:
    """The reply to one whole request (the message in ``raw``), through the one pipeline
    (:func:`spamnb.delivery.pipeline.filter_one`); ``rules`` and ``peer``: the listener's
    access rules and who connected (:mod:`spamnb.delivery.access`: who may name which
    user, and TELL); ``raddr``: the client's IP address, for the line."""
    if method == "TELL":
        return tell(headers, raw, models, rules=rules, peer=peer, compact=compact, raddr=raddr)
    user = headers.get("User")
    envelope, msg = envelope_split(raw)

    try:
        out = models.filter(user, msg, via="spamd", may_name=namer(method, headers, rules, peer), raddr=raddr,
                            evidence=N_SYMBOLS if method in ("SYMBOLS", "REPORT", "REPORT_IFSPAM") else 0,
                            headers=method in ("PROCESS", "HEADERS"))
    except (ModelError, OSError) as exc:
        raise unreadable(exc) from None
    d, t = out.decided, out.required()
    line = spam_line(d.label, d.score, t, method)
    if method == "CHECK":
        return reply(headers=[line], length=False)
    if method in ("PROCESS", "HEADERS"):
        body = envelope + out.message()
        if method == "HEADERS":
            body = body[:find_header_end(body) or len(body)]
        if version < (1, 2):
            return b"SPAMD/1.0 0 EX_OK\r\n" + body
        return reply(headers=[line] if version >= (1, 3) else [], body=body)
    if method == "SYMBOLS":
        body = ",".join(symbol(tok, c) for tok, c in d.evidence or ()).encode("ascii")
        if version < (1, 3):
            body += b"\r\n"
    elif method == "REPORT" or d.label == "spam":
        body = report(d.label, d.p, d.score, t, d.evidence, out.name)
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


def find_header_end(out: bytes):
    """End of the header block of ``out`` with its blank line, or None (HEADERS' reply)."""
    ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := out.find(sep)) >= 0]
    return min(ends) if ends else None


def may_name(method, headers, rules=None, peer=None):
    """EX_NOPERM unless who connected (``peer``; by default one this machine cannot
    identify) may act for the user the request names (``User:``): a process on this
    machine may name only its own user unless it is root, the server's user, a system
    account (an MTA's) or one of ``--spamd-trusted-user``
    (:data:`spamnb.delivery.access.NAME_USER`). Whoever names a
    user is scored by their model, reads their tokens (SYMBOLS, REPORT) and is recorded
    in the history as them. A scan asks it only when the user has a model of their own
    (a user without one is scored by the served model, as anyone is): over TCP the
    question is a scan of the kernel's socket table, which would cost every CHECK
    several times its scoring."""
    user = headers.get("User")
    if user is None:
        return
    rules = rules or access.Rules()
    peer = peer or access.Peer(access.SPAMD, uid=access.UNKNOWN_PEER)
    refused = rules.refusal(peer, access.NAME_USER, user=user)
    if refused:
        raise SpamdError("EX_NOPERM", f"{method} for user {user[:64]!r} refused: {refused}")


def tell(headers, raw, models, *, rules=None, peer=None, compact=None, raddr=None) -> bytes:
    """TELL: learn (``Set: local``) or forget (``Remove: local``) into the user's model.

    Who may is :mod:`spamnb.delivery.access`'s rule, of the listener (``rules``; by
    default TELL is not enabled) and of who connected (``peer``; by default one this
    machine cannot identify): only the user's own model learns unless the served
    model may (``--allow-tell-served``): it scores everyone else, so one client's
    TELL would change their verdicts too; a peer on this machine may name only its
    own user in ``User:``, unless it is root, the server's own user, a system account
    (an MTA's) or one of ``--spamd-trusted-user`` (a person's account an MTA or the
    admin's script runs as): :func:`may_name`."""
    rules = rules or access.Rules()
    peer = peer or access.Peer(access.SPAMD, uid=access.UNKNOWN_PEER)
    if not rules.allows(peer, access.LEARN_OWN):
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
    may_name("TELL", headers, rules, peer)
    backend, own = models.for_user(user)
    if models.per_user and user is not None and not own:
        raise SpamdError("EX_NOUSER", f"no model of user {user!r} (the administrator makes one with "
                                      f"spamnb train or spamnb store push)", models.where(user))
    if backend.is_default:
        raise SpamdError("EX_UNAVAILABLE", "the default model does not learn: train a model of your own")
    if backend is models.served and not rules.allows(peer, access.LEARN_SHARED):
        raise SpamdError("EX_UNAVAILABLE", "TELL into the shared model is not enabled (send User: with a "
                                           "model of its own, or start the server with --allow-tell-served)")
    _, msg = envelope_split(raw)
    done = {}
    if set_local:
        # a store emptied meanwhile (a Redis restarted without its data) starts again from the default model
        done = _update(backend, [(msg, label)], models, user, raddr, forget=False, compact=compact, create=_seed)
    elif remove_local:
        for cls in (label,) if label else ("spam", "ham"):
            try:
                done = _update(backend, [(msg, cls)], models, user, raddr, forget=True, compact=compact)
                break
            except ValueError:  # not learned as that class: nothing to forget there
                continue
    did = []
    if set_local and done.get("learned", 0) + done.get("moved", 0):
        did.append(b"DidSet: local")
    if remove_local and done.get("forgotten", 0):
        did.append(b"DidRemove: local")
    return reply(headers=did, length=False)


def _seed():
    from spamnb.storage.modelfile import default_seed

    return default_seed()


def _update(backend, items, models, user, raddr, *, forget, compact, create=None):
    """Learn or forget through the one pipeline (:func:`spamnb.delivery.pipeline.learn`),
    as ``spamnb learn`` (upkeep such as a compaction through ``compact``; ``create()``:
    the model to start from when the store holds none), recorded as the client's."""
    try:
        return pipeline.learn(backend, items, via="tell", forget=forget, recorder=models.recorder, user=user,
                              raddr=raddr, create=create, timeout=lock_timeout(pipeline.LEARN_TIMEOUT),
                              warn=backend.log, later=compact)
    except ModelError as exc:  # a busy lock or store is worth retrying; the rest is the model's
        if isinstance(exc, LockTimeout):
            name, text = "EX_TEMPFAIL", "timed out waiting for the model's lock, try again"
        elif isinstance(exc, StoreUnavailable):
            name, text = "EX_TEMPFAIL", "the model's store cannot be reached now, try again"
        else:
            name, text = "EX_IOERR", "the model cannot be updated"
        raise SpamdError(name, f"not learned: {text}", str(exc)) from None
