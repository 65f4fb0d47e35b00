"""``spamnb serve --milter``: spamnb's own milter, for Postfix and Sendmail.

The server runs in-process on an ephemeral port; the MTA's side is
``tests/milter_client.py`` (written from the protocol's description, sharing no
code with the server) and, where Debian's ``miltertest`` is installed (OpenDKIM's
MTA-side test client, Lua scripts), that too. The real Postfix is
``tests/test_milter.py``'s (``tools/harnesses/postfix_own_milter.py``), the real
Sendmail ``tests/test_sendmail_milter.py``'s (``tools/harnesses/sendmail_own_milter.py``).
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import threading
import time
import types

import pytest

from milter_client import MTA, added, changed
from spamnb.delivery import access, events, milter, usermodels
from spamnb.delivery import milter_protocol as mp
from spamnb.storage.filestore import FileBackend
from test_fastpath import compiled  # noqa: F401 (a fixture)
from test_spamd import Served, request, spam_and_ham, split_reply, user_models  # noqa: F401 (fixtures)
from test_e2e import SPAMNB

MILTERTEST = shutil.which("miltertest")
needs_miltertest = pytest.mark.skipif(MILTERTEST is None, reason="miltertest is not installed (apt-get install "
                                                                 "miltertest; the README's test command does it "
                                                                 "when run as root)")


def crlf(raw: bytes) -> bytes:
    """The message as an SMTP client sends it: CRLF lines, no mbox ``From `` line."""
    if raw.startswith(b"From "):
        raw = raw.split(b"\n", 1)[1]
    return raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")


class Lines:
    """A recorder's lines, kept."""

    def __init__(self):
        self.lines = []

    def __call__(self, line):
        self.lines.append(line)

    def parsed(self):
        return [events.parse(x) for x in self.lines]


class Milter:
    """An in-process milter server on 127.0.0.1 (ephemeral port)."""

    def __init__(self, model, *, user_models=None, reject=False, on_error="accept", limit=1 << 20, timeout=5.0,
                 max_connections=8, history=None):
        self.log_lines = []
        self.lines = Lines()
        self.rec = events.Recorder(write=self.lines, history=history)
        self.backend = FileBackend(str(model), log=self.log_lines.append).resident()
        self.backend.view()
        self.models = usermodels.Models(self.backend, user_models, self.log_lines.append, recorder=self.rec)
        self.srv = milter.TCPServer("127.0.0.1", 0, access.LOOPBACK)
        self.srv.configure(self.models, limit=limit, timeout=timeout, reject=reject, on_error=on_error,
                           log=self.log_lines.append, max_connections=max_connections)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def mta(self, **kw):
        m = MTA(self.port)
        m.negotiate(**kw)
        return m

    def stop(self):
        self.srv.shutdown()
        self.srv.close()


@pytest.fixture
def served_milter(compiled):  # noqa: F811
    s = Milter(compiled)
    yield s
    s.stop()


def status_of(replies):
    return dict(added(replies)).get(b"X-Spam-Status", b"")


# -- the codec ---------------------------------------------------------------------------


def test_packets_are_length_command_data():
    assert mp.packet(b"c") == b"\x00\x00\x00\x01c"
    assert mp.add_header(b"X-A", b" b") == b"\x00\x00\x00\x08hX-A\x00 b\x00"
    assert mp.remove_header(2, b"X-Spam-Flag") == b"\x00\x00\x00\x12m\x00\x00\x00\x02X-Spam-Flag\x00\x00"
    assert mp.reply_code("550 5.7.1 100% spam") == b"\x00\x00\x00\x16y550 5.7.1 100%% spam\x00"


def test_negotiation_asks_only_for_the_steps_it_uses():
    reply, actions, flags = mp.negotiate(struct.pack(">III", 6, 0x1FF, 0x1FFFFF))
    assert reply[4:5] == b"O" and struct.unpack(">III", reply[5:]) == (6, 0x11, flags)
    assert actions == mp.ADDHDRS | mp.CHGHDRS  # never the body, the recipients, the sender
    assert flags & (mp.NOEOH | mp.NODATA | mp.NOUNKNOWN) == mp.NOEOH | mp.NODATA | mp.NOUNKNOWN
    assert not flags & (mp.NOCONNECT | mp.NOHELO | mp.NOMAIL | mp.NORCPT | mp.NOHDRS | mp.NOBODY)
    assert flags & mp.HDR_LEADSPC and flags & mp.NR_HDR and flags & mp.NR_BODY and flags & mp.NR_RCPT
    # a version 2 MTA offers no flag: none is taken, every step is answered
    reply, _, flags = mp.negotiate(struct.pack(">III", 2, 0x3F, 0))
    assert flags == 0 and struct.unpack(">III", reply[5:])[0] == 2
    assert mp.answers(mp.HEADER, 0) and not mp.answers(mp.HEADER, mp.NR_HDR) and mp.answers(mp.EOB, 0x1FFFFF)
    for bad in (b"short", struct.pack(">III", 1, 0x1FF, 0), struct.pack(">III", 6, 0x10, 0)):
        with pytest.raises(mp.MilterError):
            mp.negotiate(bad)


def test_commands_data_is_parsed():
    assert mp.macros(b"Ci\0ABC\0{daemon_name}\0smtpd\0") == (b"C", {"i": "ABC", "daemon_name": "smtpd"})
    assert mp.queue_id(b"Ci\0ABC\0{daemon_name}\0smtpd\0") == "ABC"
    assert mp.queue_id(b"E{i}\x004ABC\0") == "4ABC" and mp.queue_id(b"Mx\0i\0") is None  # a value "i" is no name
    assert mp.queue_id(b"Cj\0mx.example\0{daemon_name}\0smtpd\0") is None and mp.queue_id(b"L") is None
    assert mp.connect(b"host.example\x004\x9c\x40192.0.2.1\0") == ("host.example", "192.0.2.1")
    assert mp.connect(b"h\x006\x00\x19IPv6:2001:db8::1\0") == ("h", "2001:db8::1")
    assert mp.connect(b"localhost\0L") == ("localhost", None)
    assert mp.header(b"Subject\0 hi\0") == (b"Subject", b" hi")
    assert mp.address(b"<a@b.example>\0SIZE=100\0") == "a@b.example"
    with pytest.raises(mp.MilterError):
        mp.header(b"\0")


def test_the_message_is_assembled_as_the_mta_delivers_it():
    m = mp.Message(1000)
    m.add_header(b"Subject\0 folded\n\tline\0", True)
    m.add_header(b"X-Spam-Flag\0YES\0", False)
    m.add_header(b"x-spam-flag\0 no\0", True)
    m.add_body(b"\r\n\r\nbody\r\n")
    assert m.raw() == b"Subject: folded\r\n\tline\r\nX-Spam-Flag: YES\r\nx-spam-flag: no\r\n\r\n\r\n\r\nbody\r\n"
    assert m.indexes({b"x-spam-flag"}) == [(2, b"x-spam-flag"), (1, b"X-Spam-Flag")]  # last first
    small = mp.Message(20)
    small.add_header(b"Subject\0 x\0", True)
    small.add_body(b"y" * 30)
    assert small.over and small.raw() == b"\r\n" and small.size > 20  # nothing kept past the limit
    lines = [b"X-Spam-Flag: YES", b"X-Spam-Evidence: a,", b"\tb"]
    assert mp.line_fields(lines, True) == [(b"X-Spam-Flag", b" YES"), (b"X-Spam-Evidence", b" a,\n\tb")]
    assert mp.line_fields(lines, False)[0] == (b"X-Spam-Flag", b"YES")


def test_an_envelope_holds_what_it_needs_however_much_is_sent():
    """Recipients, macros and names are not part of the message's size limit: what is kept
    of them is bounded instead (a local user can reach the port and send 1 MiB packets)."""
    from spamnb.delivery.milter import Session

    srv = types.SimpleNamespace(limit=1000, timeout_s=5)
    session = Session(srv, None, "127.0.0.1")
    big = b"<" + b"a" * 500_000 + b"@example.org>\0"
    session.step(mp.HELO, b"h" * 500_000 + b"\0")
    session.step(mp.MAIL, big)
    for i in range(300):
        session.step(mp.MACRO, b"R" + b"".join(b"{m%d-%d}\0%s\0" % (i, j, b"v" * 1000) for j in range(50)))
        session.step(mp.RCPT, big)
    session.step(mp.MACRO, b"E{i}\0" + b"Q" * 10_000 + b"\0")
    msg = session.message
    env = session.envelope(msg)
    assert len(env["helo"]) == mp.MAX_NAME and len(msg.sender) == mp.MAX_NAME and len(env["qid"]) == mp.MAX_NAME
    assert len(msg.rcpts) == mp.MAX_RCPTS and msg.more_rcpts == 300 - mp.MAX_RCPTS
    assert env["rcpt"].endswith(f",+{300 - mp.MAX_RCPTS} more") and len(env["rcpt"]) < 30_000
    assert not hasattr(session, "macros")  # the macros it does not use are not kept at all
    assert session.user(msg) is None  # recipients past those kept: whose they are is not known


def test_packets_are_cut_as_they_come_and_huge_lengths_refused_at_once():
    p = mp.Packets()
    assert p.take() is None and not p.pending()
    stream = mp.packet(b"c") + mp.packet(b"D", b"L") + mp.packet(b"B", b"x" * 70000)
    p.add(stream[:3])
    assert p.take() is None and p.pending()  # a length not whole yet
    p.add(stream[3:40])
    assert p.take() == (b"c", b"")  # the empty macro list is passed over; the body waits whole
    assert p.take() is None and p.pending()
    p.add(stream[40:])
    assert p.take() == (b"B", b"x" * 70000) and p.take() is None and not p.pending()
    huge = mp.Packets()
    huge.add(b"\x80\x00\x00\x00O")  # refused from its length alone, before 2 GiB are waited for
    with pytest.raises(mp.MilterError, match="2147483648 bytes"):
        huge.take()
    empty = mp.Packets()
    empty.add(b"\x00\x00\x00\x00")
    with pytest.raises(mp.MilterError):
        empty.take()


# -- the door ----------------------------------------------------------------------------


def test_spam_and_ham_get_spamds_verdict_lines_and_score(compiled, spam_and_ham, served_milter):  # noqa: F811
    spam, ham = (crlf(m) for m in spam_and_ham)
    spamd = Served(compiled)
    try:
        m = served_milter.mta()
        for label, raw in (("spam", spam), ("ham", ham)):
            replies = m.message(raw, connect=label == "spam")
            assert replies[-1][0] == b"a"
            flags = dict(added(replies)).get(b"X-Spam-Flag")
            assert flags == (b" YES" if label == "spam" else None)
            status = status_of(replies)
            assert status.startswith(b" Yes, score=" if label == "spam" else b" No, score=")
            # the score is spamd's for the same message (one decimal there)
            line = split_reply(spamd.ask(request("CHECK", raw)))[1][b"Spam"]
            score = float(status.split(b"score=")[1].split()[0])
            assert f"{score:.1f}" == line.split(b";")[1].split(b"/")[0].strip().decode()
            # and PROCESS adds the same lines (model name and all)
            processed = split_reply(spamd.ask(request("PROCESS", raw)))[2]
            assert b"X-Spam-Status:" + status + b"\r\n" in processed
        m.close()
    finally:
        spamd.stop()
    lines = [x for x in served_milter.lines.parsed() if x["event"] == "message"]
    assert [x["via"] for x in lines] == ["milter", "milter"]
    assert lines[0]["verdict"] == "spam" and lines[0]["raddr"] == "192.0.2.9"
    assert lines[0]["helo"] == "client.example.net" and lines[0]["sender"] == "a@example.org"
    assert lines[0]["rcpt"] == "bob@example.com" and lines[0]["qid"] == "4ABC123"
    assert lines[1]["helo"] == "client.example.net"  # the session's HELO, for its next message too


def test_forged_verdict_fields_are_removed_by_index_and_the_body_never_changed(spam_and_ham, served_milter):
    ham = crlf(spam_and_ham[1])
    forged = b"X-Spam-Status: Yes, score=99\r\nX-Spam-Flag: YES\r\n" + ham.replace(
        b"\r\n\r\n", b"\r\nx-spam-status: Yes\r\n\r\n", 1)
    m = served_milter.mta()
    replies = m.message(forged)
    assert changed(replies) == [(2, b"x-spam-status", b""), (1, b"X-Spam-Flag", b""), (1, b"X-Spam-Status", b"")]
    assert not [c for c, _ in replies if c in (b"b", b"e", b"+", b"-")]  # no body, sender or recipient change
    assert b"X-Spam-Flag" not in dict(added(replies))
    # without CHGHDRS offered nothing is removed, and the verdict is still added
    m2 = served_milter.mta(actions=0x01)
    replies = m2.message(forged)
    assert changed(replies) == [] and status_of(replies).startswith(b" No, ")


def test_chunks_headers_without_leading_space_and_version_2_give_one_verdict(spam_and_ham, served_milter):
    spam = crlf(spam_and_ham[0])
    whole = status_of(served_milter.mta().message(spam))
    assert status_of(served_milter.mta().message(spam, chunk=5)) == whole
    # without HDR_LEADSPC the values come (and go) without the space after the colon
    assert status_of(served_milter.mta(protocol=0x1FFFFF & ~mp.HDR_LEADSPC).message(spam)) == whole[1:]
    assert status_of(served_milter.mta(version=2, protocol=0).message(spam)) == whole[1:]  # every step answered


def test_many_messages_abort_and_quit_nc_on_one_connection(spam_and_ham, served_milter):
    spam, ham = (crlf(x) for x in spam_and_ham)
    m = served_milter.mta()
    first = status_of(m.message(ham))
    # a message aborted after a few headers leaves nothing behind for the next one
    m.step(b"M", b"<x@y>\0", 0x4000)
    m.step(b"L", b"Subject\0 viagra viagra viagra\0", 0x80)
    m.send(b"A")
    assert status_of(m.message(ham, connect=False)) == first
    m.send(b"K")  # quit, new connection: a new SMTP session on the same socket
    assert status_of(m.message(spam)).startswith(b" Yes")
    for _ in range(3):
        assert status_of(m.message(ham, connect=False)) == first
    m.send(b"Q")
    with pytest.raises(EOFError):
        m.read()
    assert len([x for x in served_milter.lines.parsed() if x["event"] == "message"]) == 6


def test_the_queue_id_is_the_messages_whether_sent_before_mail_or_at_the_end(spam_and_ham, served_milter):
    """Sendmail sends ``{i}`` with MAIL's macros (before MAIL), Postfix at the end of the
    body: each line names its own message's, and a message sent without one names none."""
    spam, ham = (crlf(x) for x in spam_and_ham)
    m = served_milter.mta()
    m.message(ham, queue_id="6B7EV7bG012829", queue_id_with=b"M")
    m.message(spam, connect=False, queue_id="6B7EV71O012837", queue_id_with=b"M")
    m.message(ham, connect=False, queue_id=None)
    m.message(ham, connect=False, queue_id="4ABC123")
    m.macro(b"M", i="6B7EV8HT012857")  # a message aborted after its id came: not the next one's
    m.step(b"M", b"<x@y>\0", 0x4000)
    m.send(b"A")
    m.message(ham, connect=False, queue_id=None)
    m.close()
    lines = [x for x in served_milter.lines.parsed() if x["event"] == "message"]
    assert [x.get("qid") for x in lines] == ["6B7EV7bG012829", "6B7EV71O012837", None, "4ABC123", None]


def test_reject_refuses_spam_with_550_and_tags_the_rest(compiled, spam_and_ham):  # noqa: F811
    s = Milter(compiled, reject=True)
    try:
        spam, ham = (crlf(x) for x in spam_and_ham)
        m = s.mta()
        replies = m.message(spam)
        assert replies == [(b"y", b"550 5.7.1 Message refused as spam by spamnb\0")]
        assert status_of(m.message(ham, connect=False)).startswith(b" No")
        line = [x for x in s.lines.parsed() if x["event"] == "message"][0]
        assert line["verdict"] == "spam" and line["folder"] == "refused"
    finally:
        s.stop()


@pytest.mark.parametrize("on_error, final", [("accept", (b"a", b"")),
                                             ("tempfail", (b"y", milter.TEMPFAIL.encode() + b"\0"))])
def test_an_error_accepts_unscanned_or_tempfails_with_one_line(compiled, spam_and_ham, on_error, final,
                                                               monkeypatch):  # noqa: F811
    s = Milter(compiled, on_error=on_error)
    try:
        monkeypatch.setattr(s.backend, "view", lambda: (_ for _ in ()).throw(OSError("disk on fire")))
        replies = s.mta().message(crlf(spam_and_ham[0]))
        assert replies == [final]
        errors = [x for x in s.lines.parsed() if x["event"] == "error"]
        assert len(errors) == 1 and errors[0]["via"] == "milter" and "disk on fire" in errors[0]["text"]
        assert (errors[0].get("mail") == "unscanned") == (on_error == "accept")
        assert errors[0]["qid"] == "4ABC123" and errors[0]["rcpt"] == "bob@example.com"
    finally:
        s.stop()


def test_the_history_holds_each_messages_envelope(compiled, spam_and_ham, tmp_path):  # noqa: F811
    """Each verdict's row holds what the line says of the envelope: the client's address, the
    session's HELO, the envelope sender (not the From header), the recipients and the queue id;
    read as a person reads them (an SMTPUTF8 address's UTF-8), one line each, bounded."""
    import sqlite3

    from spamnb.storage import history

    path = str(tmp_path / "h.sqlite")
    hist = history.Recorder(path, print)
    s = Milter(compiled, history=hist)
    try:
        spam, ham = (crlf(x) for x in spam_and_ham)
        m = s.mta()
        assert m.message(spam)[-1][0] == b"a"
        m.step(b"H", b"evil\x1b[2J\r\n" + b"x" * 400 + b"\0", 0x2000)  # a hostile HELO, same session
        assert m.message(ham, connect=False, sender="j\u00f6e@example.org",
                         rcpts=("bob@example.com", "c@example.net"), queue_id="4DEF456")[-1][0] == b"a"
        m.close()
    finally:
        s.stop()
        hist.close()
    db = sqlite3.connect(path)
    got = db.execute("SELECT via, user, sender, client, helo, env_sender, rcpt, qid FROM verdicts "
                     "ORDER BY id").fetchall()
    db.close()
    assert [r[0] for r in got] == ["milter", "milter"] and got[0][1] == "bob"  # one recipient: theirs
    assert got[0][2] != "a@example.org" and got[0][3:] == ("192.0.2.9", "client.example.net", "a@example.org",
                                                            "bob@example.com", "4ABC123")
    assert got[1][3] == "192.0.2.9"
    assert got[1][4] == "evil\ufffd[2J " + "x" * (mp.MAX_NAME - 10)  # one line, as much as the milter keeps
    assert got[1][5:] == ("j\u00f6e@example.org", "bob@example.com,c@example.net", "4DEF456")
    line = [x for x in s.lines.parsed() if x["event"] == "message"][1]
    assert line["sender"] == "j\u00f6e@example.org"  # the line reads it so too


def test_one_recipient_picks_their_model_several_the_shared_one(compiled, user_models, spam_and_ham):  # noqa: F811
    s = Milter(compiled, user_models=str(user_models))
    try:
        spam = crlf(spam_and_ham[0])
        req = lambda rcpts: status_of(s.mta().message(spam, rcpts=rcpts)).split(b"required=")[1].split()[0]  # noqa: E731
        assert req(["alice@example.com"]) == b"4.60"  # her model's cut-off
        assert req(["alice+lists@example.com"]) == b"4.60"
        assert req(["bob@example.com"]) == b"2.94"
        assert req(["alice@example.com", "bob@example.com"]) == b"2.94"
        assert req(["../alice@example.com"]) == b"2.94"
        users = [x.get("user") for x in s.lines.parsed() if x["event"] == "message"]
        assert users == ["alice", "alice", "bob", None, None]
    finally:
        s.stop()


def test_a_message_over_the_limit_is_accepted_unscanned_with_one_line(compiled, spam_and_ham):  # noqa: F811
    s = Milter(compiled, limit=2000)
    try:
        spam = crlf(spam_and_ham[0]) + b"x" * 5000 + b"\r\n"
        assert s.mta().message(spam, chunk=1000) == [(b"a", b"")]
        errors = [x for x in s.lines.parsed() if x["event"] != "message"]
        assert len(errors) == 1 and errors[0]["kind"] == "too_big" and errors[0]["mail"] == "unscanned"
        assert int(errors[0]["size"]) > 5000
    finally:
        s.stop()


def _raw_connection(port, data, *, close=True):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    if close:
        try:
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except OSError:
            pass
        s.close()
    return s


@pytest.mark.parametrize("junk", [
    b"GET / HTTP/1.0\r\n\r\n",  # a length of 1.2 GB
    b"\x80\x00\x00\x00O",  # a packet claiming 2 GiB
    b"\x00\x00\x00\x00",  # a packet of no length
    b"\x00\x00\x00\x02Zx",  # an unknown command
    mp.packet(b"O", b"\x00\x00\x00\x06"),  # a short negotiation
])
def test_garbage_closes_that_connection_with_one_line_and_others_go_on(spam_and_ham, served_milter, junk):
    ham = crlf(spam_and_ham[1])
    other = served_milter.mta()
    first = status_of(other.message(ham))
    _raw_connection(served_milter.port, junk)
    time.sleep(0.2)
    assert status_of(other.message(ham, connect=False)) == first
    errors = [x for x in served_milter.lines.parsed() if x["event"] == "error"]
    assert len(errors) == 1 and errors[0]["kind"] == "ex_protocol", served_milter.lines.lines


def test_closed_mid_message_and_stalled_mtas_are_closed_with_one_line(compiled, spam_and_ham):  # noqa: F811
    s = Milter(compiled, timeout=0.5)
    try:
        ham = crlf(spam_and_ham[1])
        cut = s.mta()
        cut.step(b"M", b"<a@b>\0", 0x4000)
        cut.step(b"L", b"Subject\0 hi\0", 0x80)
        cut.close()
        stalled = s.mta()
        stalled.step(b"M", b"<a@b>\0", 0x4000)
        stalled.step(b"L", b"Subject\0 hi\0", 0x80)
        stalled.send(b"B", b"half")
        stalled.sock.sendall(b"\x00\x00\x01\x00B")  # a body packet that never comes whole
        idle = s.mta()  # idle between messages: not stalled (the SMTP client's pace)
        time.sleep(1.5)
        with pytest.raises(EOFError):
            stalled.read()
        assert status_of(idle.message(ham)).startswith(b" No")
        kinds = sorted(x["kind"] for x in s.lines.parsed() if x["event"] == "error")
        assert kinds == ["dropped", "ex_timeout"]
    finally:
        s.stop()


def test_connections_beyond_the_cap_are_closed_and_the_others_served(compiled, spam_and_ham, monkeypatch):  # noqa: F811
    monkeypatch.setattr(milter, "SLOT_WAIT", 0.1)
    s = Milter(compiled, max_connections=1)
    try:
        held = s.mta()
        extra = MTA(s.port)
        extra.send(b"O", struct.pack("!LLL", 6, 0x1FF, 0x1FFFFF))
        with pytest.raises((EOFError, ConnectionResetError)):
            extra.read()
        assert status_of(held.message(crlf(spam_and_ham[1]))).startswith(b" No")
    finally:
        s.stop()


def test_each_connection_has_one_peer(compiled, spam_and_ham, monkeypatch):  # noqa: F811
    """The peer built when the MTA's connection is accepted is the one its share and its
    session ask again."""
    built = []
    tcp = access.Peer.tcp
    monkeypatch.setattr(access.Peer, "tcp", lambda *a, **kw: built.append(a) or tcp(*a, **kw))
    s = Milter(compiled, max_connections=1)  # a share of one: who holds each connection is asked
    try:
        for n in (1, 2):
            m = s.mta()
            assert status_of(m.message(crlf(spam_and_ham[1]))).startswith(b" No")
            m.close()
            assert len(built) == n
    finally:
        s.stop()


def test_serve_milter_usage_errors_are_one_line(compiled, tmp_path):  # noqa: F811
    for args, message in ((["--milter", "0.0.0.0:11332"], b"--allow"), (["--milter-reject"], b"are for --milter"),
                          (["--milter", "mail.example:1"], b"IP address")):
        r = subprocess.run(SPAMNB + ["serve", "--socket", str(tmp_path / "run" / "s"), "--model", str(compiled),
                                     *args], capture_output=True, timeout=60)
        assert r.returncode == 2 and message in r.stderr and b"Traceback" not in r.stderr, r.stderr


def test_serve_milter_on_a_unix_socket_of_the_options_mode(compiled, tmp_path, spam_and_ham):  # noqa: F811
    path = tmp_path / "milter.sock"
    proc = subprocess.Popen(SPAMNB + ["serve", "--socket", str(tmp_path / "run" / "s"), "--model", str(compiled),
                                      "--milter", f"unix:{path}", "--spamd-socket-mode", "0660"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.05)
        time.sleep(0.2)  # (bound before its mode is set)
        assert oct(os.stat(path).st_mode & 0o777) == "0o660"
        for raw, status in ((crlf(spam_and_ham[0]), b" Yes, score="), (crlf(spam_and_ham[1]), b" No, score=")):
            m = MTA(str(path))
            m.negotiate()
            replies = m.message(raw)
            m.close()
            assert replies[-1][0] == b"a" and status_of(replies).startswith(status)
            assert ((b"X-Spam-Flag", b" YES") in added(replies)) == status.startswith(b" Yes")
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stderr.close()
    assert not path.exists()  # removed at the end


# -- miltertest: an independent MTA side ---------------------------------------------------


def lua_string(b: bytes) -> str:
    """``b`` as a Lua string literal (every byte outside printable ASCII escaped)."""
    return '"' + "".join(chr(c) if 32 <= c < 127 and chr(c) not in '"\\\\' else f"\\{c:03d}" for c in b) + '"'


def lua_message(raw: bytes, chunk: int) -> str:
    """The Lua calls sending ``raw``'s header fields and body (in ``chunk``-byte pieces)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    fields = []
    for line in head.split(b"\r\n"):
        if line[:1] in (b" ", b"\t") and fields:
            fields[-1] += b"\n" + line
        else:
            fields.append(line)
    calls = []
    for f in fields:
        name, _, value = f.partition(b":")
        calls.append(f"check(mt.header(conn, {lua_string(name)}, {lua_string(value.lstrip(b' '))}), 'header')")
    calls.append("if not mt.test_option(conn, SMFIP_NOEOH) then check(mt.eoh(conn), 'eoh') end")
    calls += [f"check(mt.bodystring(conn, {lua_string(body[i:i + chunk])}), 'body')" for i in range(0, len(body), chunk)]
    return "\n".join(calls)


MILTERTEST_SCRIPT = """
local function check(err, what) if err ~= nil then error(what .. ": " .. err) end end
conn = mt.connect("inet:{port}@127.0.0.1")
if conn == nil then error("mt.connect() failed") end
check(mt.negotiate(conn, nil, nil, nil), "negotiate")
if not mt.test_action(conn, SMFIF_ADDHDRS) or not mt.test_action(conn, SMFIF_CHGHDRS) then error("actions") end
if mt.test_action(conn, SMFIF_CHGBODY) then error("asked to change bodies") end
if not mt.test_option(conn, SMFIP_NOEOH) or mt.test_option(conn, SMFIP_NOBODY) then error("steps") end
check(mt.macro(conn, SMFIC_CONNECT, "j", "mx.example.com"), "macro")
check(mt.conninfo(conn, "client.example.net", "192.0.2.7"), "conninfo")
check(mt.helo(conn, "client.example.net"), "helo")
-- a message aborted halfway: nothing of it remains
check(mt.mailfrom(conn, "<x@example.org>"), "mailfrom")
check(mt.rcptto(conn, "<bob@example.com>"), "rcptto")
check(mt.header(conn, "Subject", "aborted"), "header")
check(mt.abort(conn), "abort")
-- the spam, with a forged flag, its body in small chunks
check(mt.mailfrom(conn, "<a@example.org>"), "mailfrom")
check(mt.rcptto(conn, "<bob@example.com>"), "rcptto")
check(mt.header(conn, "X-Spam-Flag", "NO"), "header")
{spam}
check(mt.eom(conn), "eom")
if mt.getreply(conn) ~= SMFIR_ACCEPT then error("spam: not accepted") end
if not mt.eom_check(conn, MT_HDRADD, "X-Spam-Flag", " YES") then error("spam: no X-Spam-Flag: YES") end
if not mt.eom_check(conn, MT_HDRADD, "X-Spam-Status") then error("spam: no X-Spam-Status") end
if not mt.eom_check(conn, MT_HDRDELETE, "X-Spam-Flag") then error("spam: the forged flag stays") end
if mt.eom_check(conn, MT_BODYCHANGE) then error("spam: body changed") end
mt.echo("spam: " .. mt.getheader(conn, "X-Spam-Status", 0))
-- the ham, on the same connection
check(mt.mailfrom(conn, "<a@example.org>"), "mailfrom")
check(mt.rcptto(conn, "<bob@example.com>"), "rcptto")
{ham}
check(mt.eom(conn), "eom")
if mt.getreply(conn) ~= SMFIR_ACCEPT then error("ham: not accepted") end
if mt.eom_check(conn, MT_HDRADD, "X-Spam-Flag") then error("ham: flagged") end
mt.echo("ham: " .. mt.getheader(conn, "X-Spam-Status", 0))
mt.disconnect(conn)
"""


@needs_miltertest
def test_miltertest_negotiates_aborts_and_gets_the_verdicts(spam_and_ham, served_milter, tmp_path):
    spam, ham = (crlf(x) for x in spam_and_ham)
    script = tmp_path / "t.lua"
    script.write_text(MILTERTEST_SCRIPT.replace("{port}", str(served_milter.port))
                      .replace("{spam}", lua_message(spam, 100)).replace("{ham}", lua_message(ham, 65535)))
    r = subprocess.run([MILTERTEST, "-v", "-s", str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "spam:  Yes, score=" in r.stdout and "ham:  No, score=" in r.stdout, r.stdout
    lines = [x for x in served_milter.lines.parsed() if x["event"] == "message"]
    assert [x["verdict"] for x in lines] == ["spam", "ham"] and lines[0]["raddr"] == "192.0.2.7"


def test_sessions_waiting_for_their_mta_hold_no_thread(compiled, spam_and_ham):  # noqa: F811
    """Postfix holds a connection for each SMTP session, idle at the client's pace: the
    sessions wait in one loop, only an answer takes a thread (kept for the next)."""
    def threads():  # a thread a connection (socketserver's), and the pool's answering ones
        names = [t.name for t in threading.enumerate()]
        return (sum("process_request_thread" in n for n in names), sum(n.startswith("spamnb-milter_") for n in names))

    s = Milter(compiled, max_connections=40)
    try:
        ham = crlf(spam_and_ham[1])
        assert status_of(s.mta().message(ham)).startswith(b" No")
        time.sleep(0.2)
        before = threads()
        assert before[0] == 0 and before[1] >= 1  # the pool's thread that answered, kept
        waiting = [s.mta() for _ in range(30)]
        for m in waiting:
            m.step(b"M", b"<a@example.org>\0", 0x4000)  # inside a message, the client slow
        time.sleep(0.2)
        assert threads() == before
        for m in waiting[::6]:
            assert status_of(m.message(ham, connect=False)).startswith(b" No")
        assert threads()[0] == 0
    finally:
        s.stop()


def test_an_mta_that_does_not_read_its_answers_is_closed_and_others_go_on(compiled, spam_and_ham):  # noqa: F811
    """A version 2 client has every step answered; one that never reads the answers fills
    its buffer and the server's: it is closed with one line, never waited for."""
    s = Milter(compiled)
    try:
        other = s.mta()
        flood = socket.socket()
        flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        flood.settimeout(20)
        flood.connect(("127.0.0.1", s.port))
        flood.sendall(mp.packet(b"O", struct.pack(">III", 2, 0x3F, 0)))
        burst = mp.packet(b"L", b"X-A\0b\0") * 1000
        with pytest.raises(OSError):  # reset once the server closed it
            for _ in range(5000):
                flood.sendall(burst)
        flood.close()
        assert status_of(other.message(crlf(spam_and_ham[1]))).startswith(b" No")
        errors = [x for x in s.lines.parsed() if x["event"] == "error"]
        assert [(x["kind"], x["text"]) for x in errors] == [
            ("ex_timeout", "the MTA does not read the answers: connection closed")]
    finally:
        s.stop()


def test_stopping_answers_the_message_in_hand_and_closes_the_waiting(compiled, spam_and_ham, monkeypatch):  # noqa: F811
    s = Milter(compiled)
    ham = crlf(spam_and_ham[1])
    filter_ = s.models.filter
    answering = threading.Event()

    def slow(*a, **kw):
        answering.set()
        time.sleep(0.5)
        return filter_(*a, **kw)

    monkeypatch.setattr(s.models, "filter", slow)
    waiting, busy = s.mta(), s.mta()
    got = []
    t = threading.Thread(target=lambda: got.append(busy.message(ham)))
    t.start()
    assert answering.wait(10)
    s.stop()  # returns once the message in hand is answered and every session closed
    t.join(10)
    assert status_of(got[0]).startswith(b" No")
    with pytest.raises((EOFError, ConnectionResetError)):
        waiting.read()


def test_many_sessions_at_once_each_get_their_own_verdicts(compiled, spam_and_ham):  # noqa: F811
    """Sessions stepped by the loop while others are answered in the pool: each gets its
    own messages' answers, none is lost or crossed."""
    spam, ham = crlf(spam_and_ham[0]), crlf(spam_and_ham[1])
    s = Milter(compiled, max_connections=16)
    got, failed = {}, []

    def mta(n):
        try:
            m = s.mta()
            got[n] = [status_of(m.message(spam if (n + i) % 2 else ham, connect=i == 0,
                                          queue_id=f"Q{n}x{i}")) for i in range(6)]
            m.send(b"Q")
        except Exception as exc:  # noqa: BLE001 - said below
            failed.append(repr(exc))

    try:
        threads = [threading.Thread(target=mta, args=(n,)) for n in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failed
        for n, statuses in got.items():
            assert [x[:4] for x in statuses] == [b" Yes" if (n + i) % 2 else b" No," for i in range(6)], n
        lines = [x for x in s.lines.parsed() if x["event"] == "message"]
        assert len(lines) == 72 and len({x["qid"] for x in lines}) == 72
        assert not [x for x in s.lines.parsed() if x["event"] == "error"]
    finally:
        s.stop()
