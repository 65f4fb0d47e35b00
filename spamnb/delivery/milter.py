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

**How**: the listener accepts, checks and caps each connection as every door's
does; then one loop (:class:`_Sessions`, one epoll) waits for all of them, cuts and
steps their packets as they come, and hands only a message's answer to a pool of
threads kept between messages: a session waiting for its MTA holds no thread.

**Limits**: per listener, ``--max-connections`` served at once (Postfix holds one
connection per SMTP session), as spamd's. A packet over
:data:`~spamnb.delivery.milter_protocol.MAX_PACKET`, garbage, a connection closed
inside a message, an MTA that stalls (nothing for :data:`IDLE` seconds between
the steps of a session, or ``--timeout`` once a message's content has started) or
one that does not read its answers closes that connection with one line: the MTA applies its
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
import os
import select
import socket
import socketserver
import threading
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
        qid = mp.queue_id(data)  # the one macro used: what others an MTA sends are not kept
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


class _Conn:
    """One MTA connection served by the :class:`_Sessions` loop: its socket, its
    :class:`Session`, the bytes read not yet a whole packet, when it must have sent
    more, and what to do when it ends. ``armed``: waiting in the loop's epoll for the
    MTA (the loop's to end on its deadline); False while a thread works on it."""

    __slots__ = ("sock", "fd", "session", "packets", "deadline", "armed", "ended")

    def __init__(self, sock, session, ended):
        self.sock, self.fd, self.session, self.ended = sock, sock.fileno(), session, ended
        self.packets = mp.Packets()
        self.deadline = session.deadline()
        self.armed = False


class _Sessions:
    """The milter door's connections, served from one thread: Postfix and Sendmail hold a
    connection for each SMTP session, idle most of its life (the client's pace), so a
    thread each would be held by waiting; here the waiting is one epoll for them all,
    the packets are cut and stepped as they come, and only the end of a message, the
    answer (the pipeline, perhaps the store), goes to a pool of at most
    ``--max-connections`` threads kept between messages. Each connection is armed once
    (EPOLLONESHOT): the loop or one of the pool works on it at a time, never both."""

    #: Seconds between two looks for connections past their deadline (a stalled MTA is
    #: closed this much after its deadline at most).
    LOOK = 0.25

    def __init__(self, srv, workers):
        from concurrent.futures import ThreadPoolExecutor

        self.srv = srv
        self.conns = {}  # fd -> _Conn
        self.lock = threading.Lock()
        self.epoll = select.epoll()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.epoll.register(self.wake_r, select.EPOLLIN)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spamnb-milter")
        self.stopping = False
        self.listener = None  # the listening socket's descriptor while this loop accepts
        self.refusing = False  # shut down: never (again) accepting
        self.accepting = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="spamnb-milter-sessions", daemon=True)
        self.thread.start()

    def add(self, sock, client_address, ended, at_once=False):
        """Serve ``sock`` (accepted, allowed, within the cap); ``ended()`` once it is closed.
        ``at_once`` (in the loop, which accepted it): what came with the connection is read
        now (over TCP the negotiation: the listener accepts once the first bytes are in)."""
        srv = self.srv
        try:
            sock.settimeout(None)  # blocking, its sends bounded by the kernel; reads never wait (MSG_DONTWAIT)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, mp.timeval(srv.timeout_s))
        except OSError:  # reset already: nothing to serve
            ended()
            return
        conn = _Conn(sock, Session(srv, srv.peer(sock, client_address), client_ip(client_address)), ended)
        with self.lock:
            if not self.stopping:
                self.conns[conn.fd] = conn
        if self.stopping:  # a connection let in as the server stops: closed, its MTA applies its default
            ended()
            return
        if at_once:
            self._guarded(self._first_read, conn)
        else:
            self._arm(conn, first=True)

    def _first_read(self, conn):
        self.epoll.register(conn.fd, select.EPOLLONESHOT)  # known to the epoll, not armed: read now
        self._read(conn)

    # -- the loop --

    def _run(self):
        look = time.monotonic() + self.LOOK
        while True:
            for fd, _ in self.epoll.poll(self.LOOK):
                if fd == self.wake_r:  # stop: the loop ends once its connections are closed
                    os.read(fd, 64)
                    continue
                if fd == self.listener:
                    self._accept()
                    continue
                conn = self.conns.get(fd)
                if conn is not None and conn.armed:
                    conn.armed = False
                    self._guarded(self._read, conn)
            now = time.monotonic()
            if now >= look:
                look = now + self.LOOK
                self._guarded_call(self.srv.service_actions)  # the refused connections' counted line
                for conn in [c for c in list(self.conns.values()) if c.armed and c.deadline <= now]:
                    conn.armed = False
                    self._guarded(self._end, conn, mp.MilterError("the MTA sent nothing in time", "ex_timeout"))
            if self.stopping:
                with self.lock:
                    if not self.conns:
                        return

    # -- accepting, in the loop --

    def accept(self, listening_socket):
        """Accept the listener's connections in this loop from now on (its ``serve_forever``),
        unless :meth:`stop_accepting` was asked already."""
        with self.accepting:
            if self.refusing:
                return
            listening_socket.setblocking(False)  # a connection gone before accept() is no wait
            self.listener = listening_socket.fileno()
            self.epoll.register(self.listener, select.EPOLLIN)

    def stop_accepting(self):
        """No connection accepted once this returns (its ``shutdown``)."""
        with self.accepting:
            self.refusing = True
            if self.listener is not None:
                try:
                    self.epoll.unregister(self.listener)
                except (OSError, ValueError):
                    pass
                self.listener = None

    def _accept(self):
        with self.accepting:
            if self.listener is not None:  # the listener's own checks: allowed, within the cap, counted
                self._guarded_call(self.srv._handle_request_noblock)  # (BaseServer's accept step)

    @staticmethod
    def _guarded_call(work):
        try:
            work()
        except Exception:  # noqa: BLE001 - the loop goes on; socketserver said what failed
            pass

    def _guarded(self, work, conn, *args):
        """``work(conn, *args)``; a bug in it closes that connection with one line, never
        the loop or the pool thread (the other sessions go on)."""
        try:
            work(conn, *args)
        except Exception as exc:  # noqa: BLE001 - the server goes on: only this connection ends
            try:
                self._end(conn, mp.MilterError(f"internal error: {exc!r}", "ex_software"))
            except Exception:  # noqa: BLE001 - its line could not be written: closed all the same
                pass

    def _read(self, conn):
        try:
            data = conn.sock.recv(65536, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            self._arm(conn)
            return
        except OSError as exc:
            self._end(conn, exc)
            return
        if not data:
            if conn.packets.pending() or conn.session.started():
                self._end(conn, mp.MilterError("the MTA closed the connection inside a message", "dropped"))
            else:
                self._end(conn)
            return
        conn.packets.add(data)
        self._steps(conn, fresh=True)

    def _steps(self, conn, fresh):
        """The whole packets read, stepped (the end of a message handed to the pool); then
        armed again, its deadline counted anew when a packet was whole (``fresh``: from
        the loop's read, the one before it was cut)."""
        session, packets = conn.session, conn.packets
        stepped = False
        try:
            while (got := packets.take()) is not None:
                cmd, data = got
                stepped = True
                if cmd == mp.EOB:
                    self.pool.submit(self._guarded, self._answer, conn, data)
                    return
                replies = session.step(cmd, data)
                if replies:
                    self._send_now(conn, b"".join(replies))
                if session.done:
                    self._end(conn)
                    return
        except (mp.MilterError, OSError) as exc:
            self._end(conn, exc)
            return
        if stepped or not fresh or not packets.pending():
            conn.deadline = session.deadline()
        self._arm(conn)

    def _answer(self, conn, data):
        """The end of a message (in the pool): its answer sent, then the packets after it."""
        try:
            conn.sock.sendall(b"".join(conn.session.step(mp.EOB, data)))
        except (mp.MilterError, OSError) as exc:
            self._end(conn, exc)
            return
        self._steps(conn, fresh=False)

    @staticmethod
    def _send_now(conn, data):
        """A reply sent from the loop, never waiting: an MTA that does not read its answers
        (its buffer and ours full) is closed, not waited for."""
        try:
            sent = conn.sock.send(data, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(data):
            raise mp.MilterError("the MTA does not read the answers", "ex_timeout")

    def _arm(self, conn, first=False):
        conn.armed = True
        try:
            if first:
                self.epoll.register(conn.fd, select.EPOLLIN | select.EPOLLONESHOT)
            else:
                self.epoll.modify(conn.fd, select.EPOLLIN | select.EPOLLONESHOT)
        except OSError as exc:
            conn.armed = False
            self._end(conn, exc)

    def _end(self, conn, exc=None):
        """Close ``conn`` (with one line for ``exc``): out of the epoll before its socket
        closes (its number is the next connection's)."""
        with self.lock:
            if self.conns.pop(conn.fd, None) is None:
                return
        try:
            self.epoll.unregister(conn.fd)
        except (OSError, ValueError):
            pass
        try:
            if exc is not None:
                self.srv.failed(conn.session, exc)
        finally:
            conn.ended()

    def stop(self):
        """Once the connections are closed (the server's :meth:`_MilterServer.close` shut
        their reads: a message being answered is answered): the loop and the pool end."""
        with self.lock:
            if self.stopping:
                return
            self.stopping = True
        os.write(self.wake_w, b"x")
        self.thread.join()
        self.pool.shutdown(wait=True)
        self.epoll.close()
        os.close(self.wake_r)
        os.close(self.wake_w)


class _ServedInLoop(socketserver.ThreadingMixIn):
    """The milter's listeners under :class:`~spamnb.delivery.server.BoundedThreads`' cap,
    accepting in the :class:`_Sessions` loop: a connection within the cap is served
    there, no thread of its own; one beyond it waits for a slot in a thread (as every
    door's does), then joins the loop, its thread holding the slot until the loop has
    closed it. ``serve_forever`` hands the listener to the loop and waits for
    ``shutdown``, after which none is accepted."""

    def serve_forever(self, poll_interval=0.5):
        self.sessions.accept(self.socket)
        self._shut.wait()

    def shutdown(self):
        self.sessions.stop_accepting()
        self._shut.set()

    def process_request(self, request, client_address):
        if self.waiting(request):
            super().process_request(request, client_address)  # a thread: BoundedThreads waits for the slot
            return

        def ended():
            self.shutdown_request(request)
            self.release(request)

        self.sessions.add(request, client_address, ended, at_once=True)

    def process_request_thread(self, request, client_address):
        done = threading.Event()
        self.sessions.add(request, client_address, done.set)
        done.wait()
        self.shutdown_request(request)


class _MilterServer(DoorServer, _ServedInLoop):
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
        self.sessions = _Sessions(self, max_connections)
        self._shut = threading.Event()  # shutdown() asked: serve_forever returns

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
        sessions = getattr(self, "sessions", None)  # (none when it closes before it was configured)
        if sessions is not None:
            sessions.stop()
        self.server_close()


#: Seconds the kernel holds a TCP connection that has sent nothing before it is accepted
#: (TCP_DEFER_ACCEPT): an MTA sends its negotiation as it connects, so the loop accepts
#: and reads it in one wake-up; Postfix's milter_connect_timeout is 30 s too.
DEFER_ACCEPT = 30


class TCPServer(TCPListener, _MilterServer, socketserver.TCPServer):
    door = access.MILTER

    def __init__(self, host, port, allowed):
        super().__init__(host, port, allowed, None)
        try:
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT)
        except (AttributeError, OSError):  # not Linux: accepted at once, read at the next wake-up
            pass


class UnixServer(UnixListener, _MilterServer, socketserver.UnixStreamServer):
    door = access.MILTER

    def __init__(self, path, mode):
        super().__init__(path, mode, None)


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
