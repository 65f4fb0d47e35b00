"""``spamnb serve``: a resident filter that loads the model once.

``spamnb filter`` (:mod:`spamnb.delivery.fastfilter`) sends each message over a Unix
socket and gets the filtered message back, so a delivery costs a small
process start and a round trip instead of loading the model. The server is
only a shortcut: when it is not running, declines, or fails in any way, the
client does the work itself, with the same result.

Guarantees
----------
* Any failure while answering (a damaged model, a malformed store value, a bug) is a
  refusal, never a dropped connection: the client then answers by itself, behind its
  own failure boundary (:func:`spamnb.delivery.pipeline.boundary`).
* Same answer as the cold path: the server holds the model's compiled scorer
  when it is fresh and scores exactly as the fast path does, else the full
  :class:`SpamModel`, formatting as the click command does (λ = 0 models).
  It answers only for the model the client resolved (same real path), and
  declines what it does not do (evidence, bad options, learning for a model
  without a scorer: the client then runs the click command, which reports them).
* Fresh model: each request stats the model file (dev, inode, size, mtime,
  ctime) and its journal; when the file changed (``train``, a compaction) the
  new model is loaded completely before it is swapped in; when only the journal
  grew (``learn``, ``forget``, ``filter -u``, in this process or any other) its
  new records are added to a copy of the changes held, which is then swapped
  in. Requests already running keep the model they started with; concurrent
  requests wait for one shared reload.
* Learning: a request with the learn flag (``filter -u``) is learned here,
  through the journal as ``spamnb learn`` does, before the reply; when that
  takes the journal past its bound a compaction runs in a thread, and
  deliveries go on meanwhile.
* Private: the socket lives in a folder of mode 0700 that we own (made so,
  missing parents too, when it is not there yet), is created 0600, and every
  connection's peer user (SO_PEERCRED) must be ours.
* Bounded: requests over ``max_bytes`` (64 MB) are refused before their body
  is read, and a request that has not arrived whole within ``timeout`` seconds
  (a stalled client, or one sending a byte now and then) is dropped. At most
  ``max_connections`` at once; one more is closed at once (its client filters
  the message itself). Each listener (this socket, spamd's, the metrics') has
  its own bound, and the file descriptors all of them may hold are reserved at
  start, so that none can starve the others.
* SIGTERM / SIGINT: stop accepting, let running requests finish, remove the socket.
* SIGHUP (or ``spamnb config reload``, which finds the server by its pid file or
  its socket, :func:`server_pid`): ``reload()`` rereads the configuration files;
  the settings it returns apply to the requests that start after it, while
  connections open meanwhile are served to the end.
* A line per message (:mod:`spamnb.delivery.events`), and the counts of the
  metrics, through the ``recorder``.
* A pid file (``--pidfile``) for service managers that want one: checked
  before anything else (a live server holding it is a refusal), written
  atomically once the socket listens, locked for the server's life (so a
  stale one, left by ``kill -9``, is told from a live one without trusting
  pids, which get reused) and removed on exit.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import signal
import socket
import socketserver
import stat
import sys
import threading
import time
import typing

from spamnb import checks
from spamnb.delivery import access, events, pipeline, wire
from spamnb.options import BY_KEY
from spamnb.storage import upkeep
from spamnb.storage.backend import StoreUnavailable
from spamnb.storage.store import make_private_folder
from spamnb.verdict import Fallback

# The defaults of --max-bytes, --timeout and --max-connections (requests served at once;
# deliveries beyond them filter by themselves): their rows' in the table of settings.
MAX_BYTES = BY_KEY[("serve", "max_bytes")].default
TIMEOUT = BY_KEY[("serve", "timeout")].default
MAX_CONNECTIONS = BY_KEY[("serve", "max_connections")].default


class ServerError(Exception):
    """The server cannot start (socket in use, unsafe folder...)."""


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        srv = self.server
        conn = self.request
        conn.settimeout(srv.timeout_s)
        # The whole request must arrive within the time limit, not each piece of it.
        deadline = time.monotonic() + srv.timeout_s
        try:
            if not access.allows(access.Peer.unix(access.SOCKET, conn), access.CONNECT):
                return  # another user: not a word
            header, blen = wire.read_request_head(conn, srv.max_bytes, deadline)
        except (OSError, ValueError, wire.WireError) as exc:
            srv.log(f"request refused: {exc}")
            if not str(exc).startswith("connection closed after 0 "):  # a connection that sent nothing: no message
                srv.recorder.error("refused", str(exc), via="socket", size=getattr(exc, "size", None))
            self._reply(wire.DECLINED, reason=str(exc))
            return
        try:
            raw = wire.recv_exact(conn, blen, deadline)
        except (OSError, wire.WireError) as exc:
            srv.log(f"request dropped: {exc}")
            srv.recorder.error("dropped", str(exc), via="socket", size=blen)
            self._reply(wire.DECLINED, reason=str(exc))
            return
        self._reply(*self._answer(header, raw))

    def _answer(self, header, raw):
        """``(status, label, pos, block, reason)`` for one request: the one pipeline's
        outcome (:func:`spamnb.delivery.pipeline.filter_one`) as the wire says it."""
        srv = self.server

        def declined(reason, exc):  # the client does it itself, behind its own boundary
            return wire.DECLINED, None, 0, b"", reason

        with pipeline.boundary("socket", declined, recorder=srv.recorder, facts={"raw": raw}, kind="declined",
                               unscanned=False) as boundary:
            backend = srv.backend
            if not upkeep.serves(backend, header["model"]):
                return wire.DECLINED, None, 0, b"", "another model"
            # view() checks it unless the server itself allows an untrusted model
            if not header["allow_insecure"] and backend.allow_insecure and not upkeep.trusted(backend):
                return wire.DECLINED, None, 0, b"", "model not trusted"
            source = pipeline.BackendSource(backend, warn=srv.log, later=srv.compactor.soon, journal_only=True)
            try:
                out = pipeline.filter_one(raw, source, via="socket", decision=header["decision"],
                                          learn=header["learn"], recorder=srv.recorder, name=header["name"])
            except Fallback as exc:  # only the client's full model can learn it: it does it all itself
                return wire.DECLINED, None, 0, b"", str(exc)
            return wire.OK, out.label, out.pos, out.block, out.not_learned or ""
        return boundary.result

    def _reply(self, status, label=None, pos=0, block=b"", reason=""):
        try:
            wire.send_all(self.request, wire.encode_reply(status, label, pos, block, reason))
        except OSError:
            pass


class BoundedThreads(socketserver.ThreadingMixIn):
    """A thread per connection, at most ``max_connections`` at once, so that no
    listener can use up the threads or the file descriptors the others need.

    A connection beyond the bound is refused at once (answered ``busy``, if
    anything, and closed), never left waiting in the listen backlog or in the
    accept loop: a flood of idle connections costs each listener at most its
    own bound. With ``wait`` (spamd), up to ``max_connections`` more may wait
    that long for a slot, each in its own thread (a burst is served a moment
    later), before the same refusal. With ``shared`` (spamd), one client
    (:meth:`holder`: a local user, another host's address) holds at most
    :attr:`share` of the slots and as many waiting, so that one user's flood
    leaves the others served; who holds a connection is asked only once the
    listener holds that many. With ``deadline`` (seconds), a connection
    still open that long after it was accepted is shut down, whatever its
    handler is doing (for handlers that have no deadline of their own: the
    metrics' HTTP one). One spare descriptor per listener lets it refuse a
    connection even when the process has none left (EMFILE), instead of
    leaving it in the backlog and the accept loop spinning."""

    def bound_threads(self, max_connections, busy=b"", wait=0.0, deadline=None, shared=False):
        self.max_connections = max_connections
        #: with ``shared``: the most of them one client (:meth:`holder`) may hold, served or
        #: waiting (:func:`spamnb.delivery.access.share`); None: no such limit
        self.share = access.share(max_connections) if shared else None
        self.busy = busy
        self.slot_wait = wait
        self.deadline_s = deadline
        self._waiters = set()  # connections accepted beyond the bound, waiting for a slot
        self._held = {}  # connection -> [its holder (None: not asked yet), its client's address]
        self._open = {}  # connection -> the time it must be shut down by (with a deadline)
        self._guard = threading.Condition()
        self.refused = 0
        self._tallies = {}  # kind -> [when its last line was written, connections not yet in a line]

    _spare = -1  # the spare descriptor, opened once listening

    def server_activate(self):
        super().server_activate()
        self._spare = os.open(os.devnull, os.O_RDONLY)

    def descriptors(self):
        """The most file descriptors this listener's connections take at once (its own included)."""
        return 2 + self.max_connections * (2 if self.slot_wait > 0 else 1)

    def connections(self) -> list:
        """The connections held now (served or waiting for a slot)."""
        with self._guard:
            return list(self._held)

    def holder(self, request, client_address):
        """Who holds connection ``request``, for :attr:`share` (:func:`spamnb.delivery.access.holder`)."""
        raise NotImplementedError

    def _counts(self, who=None):
        """(served, waiting) of every connection held, or of holder ``who``'s (with the guard held)."""
        held = self._held if who is None else {c: h for c, h in self._held.items() if h[0] == who}
        waiting = sum(1 for c in held if c in self._waiters)
        return len(held) - waiting, waiting

    def _holders(self, request, client_address):
        """The holder of ``request``, and of every connection held not asked yet; None while
        no client can reach its share (the holders are asked only then: over TCP a scan of
        the kernel's socket table each)."""
        with self._guard:
            if self.share is None or len(self._held) + 1 < self.share:
                return None
            unknown = [(c, h[1]) for c, h in self._held.items() if h[0] is None]
        found = {c: self._ask_holder(c, a) for c, a in unknown}  # (only this thread adds or asks)
        with self._guard:
            for c, who in found.items():
                if c in self._held:
                    self._held[c][0] = who
        return self._ask_holder(request, client_address)

    def _ask_holder(self, request, client_address):
        try:
            return self.holder(request, client_address)
        except OSError:
            return ("unknown", None)

    def process_request(self, request, client_address):
        who = self._holders(request, client_address)
        with self._guard:
            served, waiting = self._counts()
            mine = self._counts(who) if who not in (None, access.UNBOUND) else (0, 0)
            limit = self.max_connections if self.share is None else self.share
            if served < self.max_connections and mine[0] < limit:
                pass
            elif self.slot_wait > 0 and waiting < self.max_connections and mine[1] < limit:
                self._waiters.add(request)  # it waits in its own thread, never in the accept loop
            else:
                who = False
            if who is not False:
                self._held[request] = [who, client_address]
        if who is False:
            self._refuse(request, client_address)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.release(request)
            raise

    def waiting(self, request) -> bool:
        """Whether ``request`` was accepted beyond the bound and waits for a slot."""
        return request in self._waiters

    def release(self, request):
        """``request``'s slot freed (it is closed): for a listener that serves its
        connections elsewhere than in their threads (the milter's loop)."""
        with self._guard:
            self._waiters.discard(request)
            self._held.pop(request, None)
            self._guard.notify_all()

    def _may_serve(self, request):
        """Whether waiting connection ``request`` may take a slot now (with the guard held)."""
        if self._counts()[0] >= self.max_connections:
            return False
        who = self._held[request][0]
        return self.share is None or who in (None, access.UNBOUND) or self._counts(who)[0] < self.share

    def process_request_thread(self, request, client_address):
        with self._guard:
            got = request not in self._waiters or self._guard.wait_for(lambda: self._may_serve(request),
                                                                        timeout=self.slot_wait)
            self._waiters.discard(request)
            if not got:
                self._held.pop(request, None)
                self._guard.notify_all()
        if not got:
            self._refuse(request, client_address)
            return
        if self.deadline_s is not None:
            with self._guard:
                self._open[request] = time.monotonic() + self.deadline_s
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._guard:
                self._open.pop(request, None)
            self.release(request)

    def service_actions(self):
        """Between accepts (every poll interval): shut down the connections past their deadline."""
        super().service_actions()
        now = time.monotonic()
        if self._tallies:
            self._flush_tallies(now)
        if not self._open:
            return
        with self._guard:
            late = [conn for conn, end in self._open.items() if end <= now]
        for conn in late:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # its handler's reads end; the handler closes it
            except OSError:
                pass

    def _refuse(self, request, client_address=None):
        self.refused += 1
        if self.refused % 100 == 1:  # a flood is one line per hundred, not one per connection
            self.log(f"too many connections: closed at once, unserved ({self.refused} so far)")
        self.tally_unserved("busy", client_address)
        if self.busy:
            try:
                request.setblocking(False)
                request.send(self.busy)
            except OSError:
                pass
        self.shutdown_request(request)

    def get_request(self):
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._shed()
            raise

    #: Seconds between two event lines of refused connections of one kind: a flood is a line a
    #: second with its count (``count=``), so that writing them never slows the accept loop.
    TALLY_SECONDS = 1.0

    def tally_unserved(self, kind, client_address):
        """A connection refused unread (``kind``: ``busy`` beyond the bound, ``not_allowed``):
        its own event line (:meth:`unserved`), unless one of that kind was written less than
        :data:`TALLY_SECONDS` ago; then it is counted into the next, which
        :meth:`service_actions` writes."""
        now = time.monotonic()
        with self._guard:
            tally = self._tallies.setdefault(kind, [-math.inf, 0])
            if now - tally[0] < self.TALLY_SECONDS or tally[1]:
                tally[1] += 1
                return
            tally[0] = now
        self.unserved(kind, client_address, 1)

    def _flush_tallies(self, now):
        due = []
        with self._guard:
            for kind, tally in self._tallies.items():
                if tally[1] and now - tally[0] >= self.TALLY_SECONDS:
                    due.append((kind, tally[1]))
                    tally[:] = [now, 0]
        for kind, count in due:
            self.unserved(kind, None, count)

    def unserved(self, kind, client_address, count):
        """``count`` connections refused unread (``kind``; ``client_address``: the one's,
        None for a count): their event line, where the listener has one."""

    def _shed(self):
        """No descriptor left for a connection: take the next one with the spare, close it."""
        try:
            os.close(self._spare)
            conn, _ = self.socket.accept()
            conn.close()
            self.refused += 1
        except OSError:
            pass
        finally:
            try:
                self._spare = os.open(os.devnull, os.O_RDONLY)
            except OSError:
                self._spare = -1  # the next EMFILE closes nothing, and tries to get it back
        self.log("no file descriptor left: a connection closed at once, unserved")

    def server_close(self):
        super().server_close()
        if getattr(self, "_tallies", None):  # (none when it closes before it was configured)
            self._flush_tallies(math.inf)  # the refusals not yet in a line
        if self._spare >= 0:
            os.close(self._spare)
            self._spare = -1


class Compactor:
    """Folds a model's journal into a new snapshot in a thread, one at a time,
    while deliveries go on."""

    def __init__(self, log):
        self.log = log
        self._running = threading.Lock()

    def soon(self, fold):
        """Run ``fold()`` (a compaction: the updates it folded) in a thread, unless one is running."""
        if not self._running.acquire(blocking=False):
            return

        def run():
            try:
                n = fold()
                if n:
                    self.log(f"compacted a journal ({n} updates) into a new snapshot")
            except Exception as exc:  # noqa: BLE001 - the journal stays; the next learner tries again
                self.log(f"compaction failed: {exc}")
            finally:
                self._running.release()

        threading.Thread(target=run, name="spamnb-compact", daemon=True).start()


class FilterServer(BoundedThreads, socketserver.UnixStreamServer):
    daemon_threads = False
    block_on_close = True  # server_close() waits for running requests
    # Connections waiting to be accepted; a burst of deliveries beyond this
    # makes clients see EAGAIN (they retry briefly, then filter by themselves).
    request_queue_size = 128

    def __init__(self, sock_path, backend, *, max_bytes=MAX_BYTES, timeout=TIMEOUT, log=None,
                 max_connections=MAX_CONNECTIONS, compactor=None, recorder=None):
        self.backend = backend
        self.recorder = recorder or events.NOTHING
        self.max_bytes = max_bytes
        self.timeout_s = timeout
        self.log = log or (lambda text: None)
        self.compactor = compactor or Compactor(self.log)
        self.bound_threads(max_connections)  # a closed connection: its client filters the message itself
        self.sock_path = sock_path
        _prepare_socket_path(sock_path)
        old = os.umask(0o177)  # the socket file is created 0600
        try:
            super().__init__(sock_path, _Handler)
        finally:
            os.umask(old)
        os.chmod(sock_path, 0o600)

    def unserved(self, kind, client_address, count):
        self.recorder.error(kind, "too many connections: the client filters the message itself", via="socket",
                            count=count)

    def remove_socket(self):
        try:
            if stat.S_ISSOCK(os.lstat(self.sock_path).st_mode):
                os.unlink(self.sock_path)
        except OSError:
            pass


def _prepare_socket_path(path):
    """A private folder for the socket, and no live server on it already."""
    folder = os.path.dirname(os.path.abspath(path))
    make_private_folder(folder)
    try:
        checks.socket_path(path)  # what `config --check` says of [serve] socket
    except ValueError as exc:
        raise ServerError(f"socket {path}: {exc}") from None
    claim_socket_path(path)


def claim_socket_path(path):
    """No live server on the Unix socket ``path``; a stale socket (left by a server
    that died) is removed; anything else there is a ServerError."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ServerError(f"{path} exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # stale: left by a server that died
            return
    raise ServerError(f"a server is already listening on {path}")


class PidFile:
    """``serve --pidfile PATH``: the server's pid, for service managers and scripts.

    :meth:`check` runs first: a pid file whose lock is held belongs to a live
    server, and starting a second one is refused. :meth:`write` then writes
    ``PID\\n`` to a temporary file beside ``path``, locks it (``flock``, held
    until this process ends), checks again (a server may have started
    meanwhile) and renames it into place, so a reader never sees it half
    written. A pid file whose lock is free was left by a server that died
    (``kill -9``, a crash) and is replaced: the lock, not the pid in the file,
    says whether its server lives, so a reused pid cannot fool the check.
    :meth:`remove` unlinks it on exit, if it is still ours.
    """

    def __init__(self, path):
        self.path = os.path.abspath(path)
        self.fd = None

    def holder(self):
        """The pid (as written) of the live server holding the file, or None."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ServerError(f"cannot read pid file {self.path}: {exc.strerror}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ServerError(f"cannot lock pid file {self.path}: {exc.strerror}") from None
                return os.read(fd, 64).decode("ascii", "replace").strip() or "?"
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def check(self):
        pid = self.holder()
        if pid is not None:
            raise ServerError(f"spamnb serve is already running (pid {pid}, pid file {self.path})")

    def write(self):
        import tempfile

        folder = os.path.dirname(self.path)
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(self.path)}.", suffix=".tmp")
        except OSError as exc:
            raise ServerError(f"cannot write pid file {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else has it
            os.fchmod(fd, 0o644)
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
            self.check()
            os.replace(tmp, self.path)
        except BaseException as exc:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise ServerError(f"cannot write pid file {self.path}: {exc.strerror}") from None
            raise
        self.fd = fd

    def remove(self):
        if self.fd is None:
            return
        try:
            mine, there = os.fstat(self.fd), os.stat(self.path)
            if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


def server_pid(*, socket_path=None, pidfile=None) -> int:
    """The pid of the running ``spamnb serve`` of this user: the live holder of
    ``pidfile``, else the process at the other end of its private socket
    (``socket_path``, default :func:`spamnb.storage.locate.default_socket_path`),
    which must be ours. ValueError/OSError when there is none."""
    if pidfile:
        pid = PidFile(pidfile).holder()
        if pid is None or not pid.isdigit():
            raise ValueError(f"no live server holds the pid file {pidfile}")
        return int(pid)
    from spamnb.storage.locate import default_socket_path

    path = socket_path or default_socket_path()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(path)
        except OSError as exc:
            raise ValueError(f"no server listening on {path} ({exc.strerror or exc})") from None
        pid, uid, _ = wire.peer_credentials(s)
    if uid != os.geteuid():
        raise ValueError(f"the server on {path} runs as another user (uid {uid})")
    return pid


def serve(sock_path, backend, *, max_bytes=MAX_BYTES, timeout=TIMEOUT, log=None, ready=None, pidfile=None,
          max_connections=MAX_CONNECTIONS, others=None, recorder=None, reload=None, metrics=None):
    """Serve the model of ``backend`` (a :class:`spamnb.storage.backend.Backend`) until
    SIGTERM or SIGINT; the model is loaded (a store: reached) before the socket opens, except
    that a store that cannot answer now is said in one line and served meanwhile (each
    request asks it again: scanning starts when it answers).

    ``pidfile``: a path for a :class:`PidFile`, refused at once when a live
    server holds it, written once the socket listens, removed on exit.
    ``others(backend, compactor, log)``: more listening servers to run beside
    the private socket on the same model (``--spamd``), each with
    ``serve_forever``, ``shutdown``, ``where`` and a ``close`` of its own.
    ``recorder``: the :class:`spamnb.delivery.events.Recorder` of every message.
    ``reload()``: called on SIGHUP, in the main thread, between requests'
    starts (it swaps in new settings; an exception is logged, the old ones stay).
    ``metrics(backend, timeout=, log=)``: the metrics listener to run beside them, or None.
    Every listener is bounded (:class:`BoundedThreads`) and the descriptors they
    may hold at once are reserved (:func:`reserve_descriptors`) before any serves:
    idle connections to one cannot stop the others.
    """
    log = log or (lambda text: print(f"spamnb serve: {text}", file=sys.stderr, flush=True))
    pid = PidFile(pidfile) if pidfile else None
    if pid:
        pid.check()
    backend.log = log
    try:
        backend.resident().view()  # a model that cannot load is an error now, not at the first message
    except StoreUnavailable as exc:  # a host booting during a store's outage still answers: mail passes
        log(f"{exc}; serving meanwhile: mail passes unscanned until the store answers")
    compactor = Compactor(log)
    extra = others(backend, compactor, log) if others else []
    try:
        if metrics is not None:
            extra.append(metrics(backend, timeout=timeout, log=log))
        server = FilterServer(sock_path, backend, max_bytes=max_bytes, timeout=timeout, log=log,
                              max_connections=max_connections, compactor=compactor, recorder=recorder)
        try:
            reserve_descriptors([server, *extra], log)
        except BaseException:
            server.remove_socket()
            server.server_close()
            raise
    except BaseException:
        for srv in extra:
            srv.close()
        raise
    if pid:
        try:
            pid.write()  # the sockets listen already (bound and listening in their constructors)
        except BaseException:
            server.remove_socket()
            server.server_close()
            for srv in extra:
                srv.close()
            raise
    stop, hup = threading.Event(), threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda *_: hup.set())
    for srv in [server, *extra]:
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    log(f"listening on {sock_path} (model {backend.name})")
    for srv in extra:
        log(f"serving {srv.what} on {srv.where()}")
    if ready:
        ready()
    try:
        while not stop.wait(0.2):
            if hup.is_set():
                hup.clear()
                _reload(reload, log)
    finally:
        for srv in [server, *extra]:
            srv.shutdown()  # stop accepting
        server.remove_socket()
        server.server_close()  # waits for running requests
        for srv in extra:
            srv.close()
        if pid:
            pid.remove()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log("stopped")


#: File descriptors kept beyond the listeners' connections: the model, its journal, scorer
#: and lock, the history and its WAL, the log, a compaction's, per-user models as they load.
RESERVED_FDS = 128


def reserve_descriptors(listeners, log):
    """Make sure the process may open what its ``listeners`` may hold at once
    (:meth:`BoundedThreads.descriptors`) and :data:`RESERVED_FDS` more, so that
    no listener's connections can take the descriptors the others (and the
    model, the history) need: the soft limit is raised towards the hard one
    when it is lower; ServerError when even the hard limit is too low."""
    import resource

    need = RESERVED_FDS + sum(srv.descriptors() for srv in listeners if hasattr(srv, "descriptors"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ServerError(f"the listeners may hold {need - RESERVED_FDS} connections at once and the process "
                          f"needs {need} file descriptors, but may open only {hard} (ulimit -n, LimitNOFILE= "
                          f"in a systemd unit): lower --max-connections or raise the limit")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    log(f"file descriptor limit raised from {soft} to {need}, what the listeners may hold at once")


def _reload(reload, log):
    if reload is None:
        log("SIGHUP: nothing to reload")
        return
    try:
        log(f"SIGHUP: {reload()}")
    except Exception as exc:  # noqa: BLE001 - a bad file keeps the settings in force
        log(f"SIGHUP: configuration not reloaded, the settings in force stay: {exc}")


# -- the listeners of the doors that serve other programs (spamd, the milter) ---------------

#: Seconds a connection beyond a door's cap waits for a slot before it is refused (at most
#: ``--max-connections`` of them wait, each in its own thread; one more is refused at once):
#: spamd then answers EX_TEMPFAIL, the milter closes it (the MTA applies milter_default_action).
SLOT_WAIT = 2.0


class DoorServer(BoundedThreads):
    """The server of a door that serves other programs (spamd, the milter), under a
    listener (:class:`TCPListener`, :class:`UnixListener`) that tells who is at the other
    end (``make_peer``). Who may connect is asked of :attr:`rules` before a byte is read;
    the :class:`~spamnb.delivery.access.Peer` built then is the connection's one peer, which
    :meth:`holder` and the door's handler (:meth:`peer`) ask again, so that its user is
    looked up once (over TCP a scan of the kernel's socket table) however often it is read.
    A door's ``configure`` sets ``models`` and ``log`` and calls :meth:`bound_threads`."""

    daemon_threads = False
    block_on_close = True
    request_queue_size = 128
    #: what the door serves, in serve's line "serving WHAT on ADDRESS"
    what = None
    #: the door's name in its log lines ("VIA: ...") and event lines (``via=``)
    via = None
    #: the event kind of a connection refused beyond the cap (``busy``, or the door's word for it)
    busy_kind = "busy"
    #: who may do what here (:mod:`spamnb.delivery.access`): a TCP listener's networks, and the door's switches
    rules = access.Rules()

    def bound_threads(self, *args, **kwargs):
        super().bound_threads(*args, **kwargs)
        self._peers = {}  # connection -> its Peer, from verify_request until it is shut down

    def make_peer(self, conn, client_address):
        """A new :class:`~spamnb.delivery.access.Peer` of ``conn`` (the listener's)."""
        raise NotImplementedError

    def peer(self, conn, client_address):
        """Who is at the other end of ``conn``: the Peer built when it was accepted (a new one
        for a connection not held, or no longer)."""
        return self._peers.get(conn) or self.make_peer(conn, client_address)

    def holder(self, request, client_address):
        return self.rules.holder(self.peer(request, client_address))

    def verify_request(self, request, client_address):
        """Connections the access rules refuse (from outside the allowed networks) are
        closed before a byte is read."""
        peer = self.make_peer(request, client_address)
        if self.rules.allows(peer, access.CONNECT):
            self._peers[request] = peer
            return True
        self.log(f"{self.via}: connection from {client_address[0]} refused (not in --allow)")
        self.tally_unserved("not_allowed", client_address)
        return False

    def shutdown_request(self, request):
        self._peers.pop(request, None)
        super().shutdown_request(request)

    def unserved(self, kind, client_address, count):
        """Beyond ``--max-connections`` (and the wait), or outside ``--allow``: closed unread
        (with the door's ``busy`` answer, if any); its client passes the mail unscanned."""
        busy = kind == "busy"
        self.models.recorder.error(self.busy_kind if busy else kind,
                                   "too many connections" if busy else "not in --allow: closed unread",
                                   via=self.via, unscanned=True, count=count,
                                   raddr=access.client_ip(client_address) if client_address else None)

    def close(self):
        self.server_close()


class TCPListener:
    """A door's TCP listener, mixed in before the door's server and socketserver's
    TCPServer: ``door`` names it to :mod:`spamnb.delivery.access`; ``allowed`` are the
    networks a peer must come from (loopback and ``--allow``)."""

    allow_reuse_address = True
    door = None

    def __init__(self, host, port, allowed, handler):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.rules = access.Rules(networks=tuple(allowed))
        super().__init__((host, port), handler)

    def make_peer(self, conn, client_address):
        return access.Peer.tcp(self.door, client_address, conn)

    def where(self):
        host, port = self.server_address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class UnixListener:
    """A door's Unix socket listener at ``path`` (claimed first: never another's file),
    made with ``mode``; its user from ``SO_PEERCRED``; the socket removed on close."""

    door = None

    def __init__(self, path, mode, handler):
        claim_socket_path(path)
        old = os.umask(0o177)
        try:
            super().__init__(path, handler)
        finally:
            os.umask(old)
        os.chmod(path, mode)
        self.path = path

    def make_peer(self, conn, client_address):
        return access.Peer.unix(self.door, conn)

    def where(self):
        return f"unix:{self.path}"

    def close(self):
        super().close()
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except OSError:
            pass


def check_listening(addresses, allow, option):
    """``([listen address...], networks)`` of ``option``'s ``addresses`` (``--spamd``,
    ``--milter``) and ``--allow`` (:func:`spamnb.checks.listening`), ValueError naming the
    option when one is bad or listens beyond loopback without ``allow``: ``serve`` asks
    before it loads any model."""
    try:
        nets = checks.networks(allow)
    except ValueError as exc:
        raise ValueError(f"--allow {exc}") from None
    try:
        return checks.listening(addresses, nets, "--allow CIDR (e.g. --allow 192.0.2.0/24)"), nets
    except ValueError as exc:
        raise ValueError(f"{option} {exc}") from None


class Listening(typing.NamedTuple):
    """A door's listeners to open (:func:`open_listeners`): ``option``'s ``addresses``, each
    made by ``listen(kind, where, networks)`` (``kind`` "unix" or "tcp", ``where`` [path] or
    [host, port], ``networks`` loopback and ``--allow``'s); ``said(text, kind, where, exc)``
    is the error when one cannot listen (OSError)."""

    option: str
    addresses: tuple
    listen: typing.Callable
    said: typing.Callable


def open_listeners(allow, *doors: Listening) -> list:
    """The listening servers of ``doors``, one per address: every address and network is
    checked first (ValueError naming its option, :func:`check_listening`), then each opens
    (ServerError when one cannot); when one fails, those opened already are closed."""
    checked = [(door, check_listening(door.addresses, allow, door.option)) for door in doors if door.addresses]
    servers = []
    try:
        for door, (listen, nets) in checked:
            for text, (kind, *where) in zip(door.addresses, listen):
                try:
                    servers.append(door.listen(kind, where, access.LOOPBACK + nets))
                except OSError as exc:
                    raise ServerError(door.said(text, kind, where, exc)) from None
    except BaseException:
        for srv in servers:
            srv.close()
        raise
    return servers
