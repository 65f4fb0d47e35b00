"""``spamnb serve --milter ADDRESS``: the milter door, for Postfix and Sendmail.

The MTA connects (``smtpd_milters = inet:127.0.0.1:PORT``, Sendmail's
``INPUT_MAIL_FILTER``) and sends each SMTP session's steps in the milter protocol
(:mod:`spamnb.delivery.milter_protocol`); at the end of each message's body this
door hands the message, assembled as the MTA will deliver it, to the one pipeline
(:func:`spamnb.delivery.usermodels.Models.filter`, as spamd's answer does) and
translates its :class:`spamnb.delivery.pipeline.Outcome`: the forged incoming
verdict fields removed (SMFIR_CHGHEADER to an empty value, by index), spamnb's
header lines (the Outcome's block) added, the body never touched; with
``--milter-reject`` a spam is refused instead (550 5.7.1), an unsure message is
tagged, never refused.

**Who**: loopback and ``--allow`` (TCP), a Unix socket's mode, checked before a
byte is read (:mod:`spamnb.delivery.access`). A message with one recipient is
scored by that user's model (its local part, without a ``+extension``), when
``--user-models``/``--store-users`` has one; with several, by the served model.

**Limits**: per listener, ``--max-connections`` served at once (Postfix holds one
connection per SMTP session), as spamd's. A packet over
:data:`~spamnb.delivery.milter_protocol.MAX_PACKET`, garbage, a connection closed
inside a message or an MTA that stalls (nothing for :data:`IDLE` seconds between
the steps of a session, or ``--timeout`` once a message's content has started)
closes that connection with one line: the MTA applies its
``milter_default_action`` (accept). A message over the limit (the smaller of
``--max-bytes`` and ``--spamd-max-bytes``) is accepted unscanned with one line,
never held beyond it.

**Errors**: whatever fails in scanning is one line (:func:`spamnb.delivery.pipeline.boundary`)
and the message is accepted unscanned, or with ``on_error = tempfail`` refused
for now (451 4.3.0).
"""

from __future__ import annotations

import dataclasses
import functools
import socket
import socketserver
import time

from spamnb.delivery import access, pipeline
from spamnb.delivery import milter_protocol as mp
from spamnb.delivery.access import client_ip
from spamnb.delivery.server import SLOT_WAIT, DoorServer, Listening, TCPListener, UnixListener
from spamnb.delivery.spamd_protocol import SpamdError
from spamnb.delivery.usermodels import plain_user
from spamnb.verdict import VERDICT_FIELDS

#: The verdict fields an incoming message may not bring (removed by index), as the MTA names them.
_VERDICT_NAMES = frozenset(name.lower().encode("ascii") for name in VERDICT_FIELDS)

#: Seconds an MTA may leave a session idle between its steps: the pace of its SMTP
#: client (Postfix waits smtpd_timeout, 300 s, for each command), with a margin. A
#: deadline shorter than that would close sessions the MTA still holds, and their
#: next message would pass unscanned.
IDLE = 660.0
REJECT = "550 5.7.1 Message refused as spam by spamnb"
TEMPFAIL = "451 4.3.0 Message not scanned for spam now, try again later"


class Session:
    """One MTA connection: what was negotiated, the session's envelope so far and the
    message being sent. :meth:`step` takes a packet and gives the packets to answer."""

    def __init__(self, srv, peer, mta_address):
        self.srv, self.peer, self.mta_address = srv, peer, mta_address
        self.actions = self.agreed = 0
        self.leadspc = False  # header values as sent, their leading space kept (negotiated)
        self.silent = frozenset()  # the steps not answered (negotiated)
        self.done = False
        self._reset()

    def _reset(self):
        """A new SMTP session (a connection, or ``K`` on it)."""
        self.qid, self.client, self.helo, self.message = None, None, None, None

    def started(self) -> bool:
        """Whether a message's content (a header field or body) has begun."""
        return self.message is not None and (bool(self.message.lines or self.message.body) or self.message.over)

    def deadline(self) -> float:
        return time.monotonic() + (self.srv.timeout_s if self.started() else IDLE)

    def step(self, cmd, data) -> list[bytes]:
        handle = _STEPS.get(cmd)
        if handle is None:
            raise mp.MilterError(f"unknown command {cmd!r}: not a milter client")
        out = handle(self, data)
        if out is None:  # a step answered CONTINUE, unless the negotiation said it is not answered
            return _NONE if cmd in self.silent else _CONTINUE
        return out

    # -- the steps (None: CONTINUE unless negotiated away) --

    def _optneg(self, data):
        reply, self.actions, self.agreed = mp.negotiate(data)
        self.leadspc = bool(self.agreed & mp.HDR_LEADSPC)
        self.silent = _silent(self.agreed)
        return [reply]

    def _macro(self, data):
        # The queue id ({i}) is one message's: Sendmail sends it with MAIL's macros, before
        # MAIL, Postfix with those of the end of the body; it goes when the message ends
        # (its answer, or ABORT), never read for the next one.
        qid = mp.macros(data)[1].get("i")  # the one macro used: what others an MTA sends are not kept
        if qid is not None:
            self.qid = qid[:mp.MAX_NAME]
        return []

    def _connect(self, data):
        self._reset()
        self.client = mp.connect(data)

    def _helo(self, data):
        self.helo = (mp.strings(data) or [b""])[0][:mp.MAX_NAME].decode("latin-1")

    def _mail(self, data):
        self.message = mp.Message(self.srv.limit)
        self.message.sender = mp.address(data)

    def _rcpt(self, data):
        self._current().add_rcpt(mp.address(data))

    def _nothing(self, data):
        return None

    def _header(self, data):
        self._current().add_header(data, self.leadspc)

    def _body(self, data):
        self._current().add_body(data)

    def _eob(self, data):
        msg = self._current()
        msg.add_body(data)
        self.message = None
        try:
            return self.srv.answer(self, msg)
        finally:
            self.qid = None  # this message's, never the next one's

    def _abort(self, data):
        self.message = None
        self.qid = None
        return []

    def _quit(self, data):
        self.done = True
        return []

    def _quit_nc(self, data):
        self._reset()
        return []

    def _current(self):
        if self.message is None:  # a step the MTA sends without MAIL (NOMAIL is never asked)
            self.message = mp.Message(self.srv.limit)
        return self.message

    # -- what the line says --

    def raddr(self):
        """The SMTP client's address (the MTA's own before CONNECT)."""
        return (self.client[1] if self.client else None) or self.mta_address

    def envelope(self, msg) -> dict:
        """The SMTP envelope of ``msg`` so far, for the line and the history: each value as a
        person reads it (:func:`readable`)."""
        return {"helo": readable(self.helo), "sender": readable(msg.sender) if msg else None,
                "rcpt": readable(msg.rcpt_list()) if msg else None, "qid": readable(self.qid)}

    def user(self, msg):
        """The user whose model scores ``msg``: its one recipient's local part (without
        a ``+extension``), a plain name; None for several recipients, or none."""
        if msg.more_rcpts or len(set(msg.rcpts)) != 1:
            return None
        local = msg.rcpts[0].rpartition("@")[0] or msg.rcpts[0]
        try:
            return plain_user(local.split("+", 1)[0])
        except SpamdError:
            return None


def readable(value):
    """A value the MTA sent (its bytes read as Latin-1, one character a byte) as a person
    reads it: UTF-8 when it is (an SMTPUTF8 address: "jöe", not "jÃ¶e"), else cp1252
    (:func:`spamnb.mail.mime.readable`); None as it is."""
    if value is None or value.isascii():
        return value
    from spamnb.mail.mime import readable as read

    return read(value.encode("latin-1"), "utf-8")


_NONE, _CONTINUE = (), (mp.packet(mp.CONTINUE),)


@functools.lru_cache(maxsize=16)
def _silent(agreed) -> frozenset:
    """The steps not answered under the protocol flags ``agreed``: once for the flags an MTA
    offers (Postfix offers the same to every connection), not per connection."""
    return frozenset(cmd for cmd in mp.STEP_NR if not mp.answers(cmd, agreed))
_STEPS = {mp.OPTNEG: Session._optneg, mp.MACRO: Session._macro, mp.CONNECT: Session._connect,
          mp.HELO: Session._helo, mp.MAIL: Session._mail, mp.RCPT: Session._rcpt, mp.DATA: Session._nothing,
          mp.HEADER: Session._header, mp.EOH: Session._nothing, mp.BODY: Session._body, mp.EOB: Session._eob,
          mp.UNKNOWN: Session._nothing, mp.ABORT: Session._abort, mp.QUIT: Session._quit,
          mp.QUIT_NC: Session._quit_nc}


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        srv = self.server
        conn = self.request
        session = Session(srv, srv.peer(conn, self.client_address), client_ip(self.client_address))
        conn.settimeout(None)  # blocking, its waits bounded by the kernel: one system call a read or write
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, mp.timeval(srv.timeout_s))
        reader = mp.PacketReader(conn)
        try:
            for cmd, data in reader.packets(session.deadline):  # the deadline asked only when it must wait
                replies = session.step(cmd, data)
                if replies:
                    conn.sendall(b"".join(replies))
                if session.done:
                    return
            if session.started():
                raise mp.MilterError("the MTA closed the connection inside a message", "dropped")
        except (mp.MilterError, OSError) as exc:
            srv.failed(session, exc)


class _MilterServer(DoorServer):
    what = "the milter protocol"
    via = "milter"

    def configure(self, models, *, limit, timeout, reject, on_error, log, max_connections, trusted_users=()):
        self.models = models
        self.limit, self.timeout_s = limit, timeout
        self.reject, self.on_error = reject, on_error
        self.log = log
        self.rules = dataclasses.replace(self.rules, trusted=tuple(trusted_users))
        # a connection beyond the cap waits up to SLOT_WAIT for a slot (a burst is served a moment later),
        # as many as are served at most; then, or beyond them at once, it is closed and the MTA applies
        # milter_default_action; no one client holds more than half of either
        self.bound_threads(max_connections, wait=SLOT_WAIT, shared=True)

    # -- one message's answer --

    def answer(self, session, msg) -> list[bytes]:
        """The replies at the end of ``msg``'s body: the verdict's header changes and
        ACCEPT, the refusal of a spam with ``reject``, or the error's answer."""
        rec = self.models.recorder
        facts = {"raddr": session.raddr(), "envelope": session.envelope(msg), "size": msg.size}
        if msg.over:
            rec.error("too_big", f"over {self.limit} bytes: accepted unscanned", via="milter", unscanned=True,
                      **facts)
            return [mp.packet(mp.ACCEPT)]
        raw = msg.raw()
        tempfail = self.on_error == "tempfail"

        def failed(reason, exc):
            if not rec.lines:
                self.log(f"milter: {reason}")
            return [mp.reply_code(TEMPFAIL) if tempfail else mp.packet(mp.ACCEPT)]

        with pipeline.boundary("milter", failed, recorder=rec, facts={**facts, "raw": raw},
                               unscanned=not tempfail) as boundary:
            return self._verdict(session, msg, raw, facts)
        return boundary.result

    def _verdict(self, session, msg, raw, facts):
        user = session.user(msg)
        refuse = self.reject

        def filed(label):  # the line's and the history's folder= of a refused spam
            return "refused" if refuse and label == "spam" else None

        out = self.models.filter(user, raw, via="milter", raddr=facts["raddr"], envelope=facts["envelope"],
                                 may_name=lambda u: self.rules.allows(session.peer, access.NAME_USER, user=u),
                                 folder=filed)  # the MTA places the lines: the Outcome never does

        if filed(out.label):
            return [mp.reply_code(REJECT)]
        changes = [mp.remove_header(i, name) for i, name in msg.indexes(_VERDICT_NAMES)] \
            if session.actions & mp.CHGHDRS else []
        changes += [mp.add_header(name, value) for name, value in mp.line_fields(out.decided.lines, session.leadspc)]
        return [*changes, mp.packet(mp.ACCEPT)]

    # -- a connection's end --

    def failed(self, session, exc):
        """One line for a connection closed on ``exc`` (garbage, a stall, one closed
        inside a message): the MTA then applies its default action to the message."""
        kind = exc.kind if isinstance(exc, mp.MilterError) else "dropped"
        text = str(exc) if isinstance(exc, mp.MilterError) else f"connection lost: {exc.strerror or exc}"
        msg = session.message
        if not self.models.recorder.lines:
            self.log(f"milter: connection closed: {text}")
        self.models.recorder.error(kind, f"{text}: connection closed", via="milter", unscanned=session.started(),
                                   raddr=session.raddr(), envelope=session.envelope(msg) if msg else None,
                                   size=msg.size if msg and session.started() else None)

    def close(self):
        """Stop: the sessions idle between messages end now (their reads see the end),
        a message being answered is answered; then the listener closes."""
        for conn in self.connections():
            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        self.server_close()


class TCPServer(TCPListener, _MilterServer, socketserver.TCPServer):
    door = access.MILTER

    def __init__(self, host, port, allowed):
        super().__init__(host, port, allowed, _Handler)


class UnixServer(UnixListener, _MilterServer, socketserver.UnixStreamServer):
    door = access.MILTER

    def __init__(self, path, mode):
        super().__init__(path, mode, _Handler)


def listening(addresses, models, *, limit, timeout, reject=False, on_error="accept", unix_mode=0o600,
              max_connections, log, trusted_users=()) -> Listening:
    """The milter servers of ``addresses`` to open (:func:`spamnb.delivery.server.open_listeners`)."""

    def listen(kind, where, networks):
        srv = UnixServer(where[0], unix_mode) if kind == "unix" else TCPServer(where[0], where[1], networks)
        srv.configure(models, limit=limit, timeout=timeout, reject=reject, on_error=on_error, log=log,
                      max_connections=max_connections, trusted_users=trusted_users)
        return srv

    def said(text, kind, where, exc):
        return f"cannot listen on {text} (--milter): {exc.strerror or exc}"

    return Listening("--milter", tuple(addresses), listen, said)
