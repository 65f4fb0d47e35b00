"""``spamnb serve --spamd``: SpamAssassin's spamc/spamd protocol.

The server runs in-process on an ephemeral port for most tests (one model
load); the real clients -- Debian's ``spamc`` and the ``aiospamc`` library --
talk to it as they would to spamd, and one test starts ``spamnb serve
--spamd`` as a user would.
"""

from __future__ import annotations

import asyncio
import math
import os
import pwd
import re
import shutil
import socket
import subprocess
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from spamnb import checks, verdict
from conftest import filter_message
from spamnb import verdict
from spamnb.delivery import access, hook, server, spamd, spamd_protocol, usermodels
from spamnb.delivery.server import Compactor
from spamnb.mail.identity import message_key
from spamnb.storage.filestore import FileBackend
from spamnb.storage.modelfile import load_model, save_model
from spamnb.storage.scorer import fresh_scorer
from test_e2e import SPAMNB
from test_fastpath import compiled, messages  # noqa: F401 (compiled: a fixture)

SPAMC = shutil.which("spamc")
needs_spamc = pytest.mark.skipif(SPAMC is None, reason="spamc is not installed (apt-get install spamc; "
                                                       "the README's test command does it when run as root)")
SPAM_LINE = re.compile(rb"Spam: (True|False|Yes|No) ; (-?\d+\.\d) / (-?\d+\.\d)\r\n")


class Served:
    """An in-process spamd server on 127.0.0.1 (ephemeral port)."""

    def __init__(self, model, *, user_models=None, allow_tell=True, max_bytes=1 << 20, timeout=5.0,
                 max_connections=8, allowed=access.LOOPBACK, is_default=False, tell_served=None,
                 spamd_max_bytes=spamd.SPAMD_MAX_BYTES, recorder=None):
        self.log_lines = []
        log = self.log_lines.append
        self.backend = FileBackend(str(model), is_default=is_default, log=log).resident()
        self.backend.view()
        self.models = usermodels.Models(self.backend, user_models, log, recorder=recorder)
        self.srv = spamd.TCPServer("127.0.0.1", 0, allowed)
        self.srv.configure(self.models, max_bytes=max_bytes, timeout=timeout, allow_tell=allow_tell, log=log,
                           compactor=Compactor(log), max_connections=max_connections,
                           tell_served=allow_tell if tell_served is None else tell_served, spamd_max_bytes=spamd_max_bytes)
        self.port = self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self):
        self.srv.shutdown()
        self.srv.close()

    def ask(self, request: bytes, *, half_close=True, timeout=20.0) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            try:
                s.sendall(request)
                if half_close:
                    s.shutdown(socket.SHUT_WR)
            except OSError:  # the server closed first (refused, or answered before reading all)
                pass
            return _read_all(s)


def _read_all(s) -> bytes:
    out = []
    while True:
        try:
            data = s.recv(65536)
        except (ConnectionResetError, OSError):
            break
        if not data:
            break
        out.append(data)
    return b"".join(out)


def request(method, raw=b"", version="1.5", **headers) -> bytes:
    head = [f"{method} SPAMC/{version}\r\n".encode()]
    if "Content_length" not in headers and method not in ("PING", "SKIP"):
        headers["Content_length"] = str(len(raw))
    head += [f"{k.replace('_', '-')}: {v}\r\n".encode("latin-1") for k, v in headers.items()]
    return b"".join(head) + b"\r\n" + raw


def split_reply(data: bytes):
    """``(status line, {header: value}, body)``."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    hdrs = dict(line.split(b": ", 1) for line in lines[1:] if line)
    return lines[0], hdrs, body


@pytest.fixture
def served(compiled):
    s = Served(compiled)
    yield s
    s.stop()


@pytest.fixture
def spam_and_ham(compiled):
    """A message the model files as spam, and one it files as ham."""
    sc = fresh_scorer(str(compiled))
    by_label = {}
    for raw in messages():
        label = filter_message(sc, raw, "m")[1]
        by_label.setdefault(label, raw)
    return by_label["spam"], by_label["ham"]


# -- units ---------------------------------------------------------------------------


@pytest.mark.parametrize("text, want", [
    ("783", ("tcp", "127.0.0.1", 783)),
    ("127.0.0.1:11333", ("tcp", "127.0.0.1", 11333)),
    ("localhost:783", ("tcp", "127.0.0.1", 783)),
    ("[::1]:783", ("tcp", "::1", 783)),
    ("0.0.0.0:783", ("tcp", "0.0.0.0", 783)),
    ("/run/spamnb/spamd.sock", ("unix", "/run/spamnb/spamd.sock")),
])
def test_addresses(text, want):
    assert checks.listen_address(text) == want


@pytest.mark.parametrize("text", ["", "host", "1.2.3.4:0", "1.2.3.4:99999", "mail.example:783", "[::1]"])
def test_bad_addresses_are_refused(text):
    with pytest.raises(ValueError):
        checks.listen_address(text)


def test_listening_beyond_loopback_needs_allow():
    server.check_listening(["127.0.0.1:783", "[::1]:783"], (), "--spamd")
    with pytest.raises(ValueError, match="--allow"):
        server.check_listening(["0.0.0.0:783"], (), "--spamd")
    server.check_listening(["0.0.0.0:783"], ["192.0.2.0/24"], "--spamd")
    with pytest.raises(ValueError, match="--allow 192.0.2.0/99: not an address"):
        server.check_listening(["127.0.0.1:783"], ["192.0.2.0/99"], "--spamd")


def test_score_and_threshold_are_log_odds_with_one_decimal():
    t = verdict.threshold(0.95)
    assert t == pytest.approx(math.log(19))  # log(0.95 / 0.05)
    assert spamd_protocol.spam_line("spam", 9.04, t, "CHECK") == b"Spam: True ; 9.0 / 2.9"
    assert spamd_protocol.spam_line("ham", -33.46, t, "CHECK") == b"Spam: False ; -33.5 / 2.9"
    assert spamd_protocol.spam_line("unsure", 1.0, t, "CHECK") == b"Spam: False ; 1.0 / 2.9"  # only spam is True
    assert spamd_protocol.spam_line("spam", math.inf, t, "REPORT_IFSPAM") == b"Spam: Yes ; 999.9 / 2.9"


def test_envelope_line_is_split_off():
    assert spamd_protocol.envelope_split(b"From a@b Thu Aug 22 12:36:23 2002\nSubject: x\n\nhi\n") == (
        b"From a@b Thu Aug 22 12:36:23 2002\n", b"Subject: x\n\nhi\n")
    assert spamd_protocol.envelope_split(b"Subject: x\n\nhi\n") == (b"", b"Subject: x\n\nhi\n")


def test_scorer_evidence_is_the_full_models(compiled):
    """SYMBOLS and REPORT come from the compiled scorer: the same tokens and
    contributions as ``spamnb explain`` computes from the full model."""
    sc, model = fresh_scorer(str(compiled)), load_model(compiled)
    for raw in messages()[:5]:
        toks = model.tokens(raw)
        score, _, _, top = sc.explain(toks, 10)
        ev = model.explain(raw, 10)
        assert [t for t, _ in top] == [t for t, _, _ in ev.tokens]
        assert [c for _, c in top] == pytest.approx([c for _, _, c in ev.tokens], abs=1e-9)
        assert score == pytest.approx(ev.score, abs=1e-6)


# -- the methods ---------------------------------------------------------------------


def test_check_gives_the_verdict_score_and_threshold(served, spam_and_ham, compiled):
    sc = fresh_scorer(str(compiled))
    for raw, word in zip(spam_and_ham, (b"True", b"False")):
        status, hdrs, body = split_reply(served.ask(request("CHECK", raw)))
        assert status == b"SPAMD/1.1 0 EX_OK" and body == b""
        m = SPAM_LINE.match(b"Spam: " + hdrs[b"Spam"] + b"\r\n")
        score = sc.score(sc_tokens(sc, raw))[0]
        assert m.group(1) == word
        assert float(m.group(2)) == pytest.approx(score, abs=0.05)
        assert m.group(3) == b"2.9"


def sc_tokens(sc, raw):
    return hook.message_tokens(sc, raw)


def test_process_adds_the_filters_headers_and_keeps_every_other_byte(served, spam_and_ham, compiled):
    sc = fresh_scorer(str(compiled))
    for raw in spam_and_ham:
        status, hdrs, body = split_reply(served.ask(request("PROCESS", raw)))
        assert status == b"SPAMD/1.1 0 EX_OK"
        assert int(hdrs[b"Content-length"]) == len(body)
        want = filter_message(sc, raw, "model.joblib")[0]
        assert body == want  # what `spamnb filter` writes, byte for byte
        headers = split_reply(served.ask(request("HEADERS", raw)))[2]
        assert body.startswith(headers) and headers.endswith((b"\n\n", b"\r\n\r\n"))
        assert b"X-Spam-Status: " in headers and len(headers) < len(body)


FORGED = b"X-Spam-Flag: YES\nX-Spam-Status: Yes, score=99.0 required=5.0\nX-Spam-Level: ******\n"


def test_process_and_headers_replace_a_forged_verdict(served, spam_and_ham):
    """A verdict the sender wrote never reaches spamc's caller (a milter takes
    any X-Spam-Flag for spam), and the score is the message's own."""
    spam, ham = spam_and_ham
    forged = ham.replace(b"\nSubject:", b"\n" + FORGED + b"Subject:", 1)
    assert split_reply(served.ask(request("CHECK", forged)))[1] == split_reply(served.ask(request("CHECK", ham)))[1]
    got = split_reply(served.ask(request("PROCESS", forged)))[2]
    assert got == split_reply(served.ask(request("PROCESS", ham)))[2]
    assert b"X-Spam-Flag" not in got and b"99.0" not in got and b"X-Spam-Level" not in got
    headers = split_reply(served.ask(request("HEADERS", forged)))[2]
    assert re.search(rb"\nX-Spam-Status: No, score=-?\d+\.\d\d required=2\.94 tests=SPAMNB_HAM ", headers)
    assert b"X-Spam-Flag" not in headers and headers.count(b"X-Spam-") == 1
    forged_spam = spam.replace(b"\nSubject:", b"\nX-Spam-Status: No, score=-50.0\nSubject:", 1)
    headers = split_reply(served.ask(request("HEADERS", forged_spam)))[2]
    assert headers.count(b"X-Spam-Status: ") == 1 and b"\nX-Spam-Flag: YES\nX-Spam-Status: Yes, score=" in headers


def test_exim_envelope_line_is_not_scored_and_is_kept(served, spam_and_ham):
    raw = spam_and_ham[0]
    line = b"From sender@example.org Mon Dec  1 10:00:00 2026\n"
    assert split_reply(served.ask(request("CHECK", line + raw)))[1] == split_reply(
        served.ask(request("CHECK", raw)))[1]
    body = split_reply(served.ask(request("PROCESS", line + raw)))[2]
    assert body == line + split_reply(served.ask(request("PROCESS", raw)))[2]


def test_symbols_and_reports_name_the_strongest_tokens(served, spam_and_ham, compiled):
    spam, ham = spam_and_ham
    model = load_model(compiled)
    _, hdrs, body = split_reply(served.ask(request("SYMBOLS", spam)))
    assert hdrs[b"Spam"].startswith(b"True")
    names = [item.rsplit(b"(", 1)[0].decode() for item in body.split(b",")]
    assert names == [verdict.header_safe(t) for t, _, _ in model.explain(spam, spamd_protocol.N_SYMBOLS).tokens]
    _, hdrs, body = split_reply(served.ask(request("REPORT", spam)))
    assert b"Content analysis details:" in body and names[0].encode() in body
    _, hdrs, body = split_reply(served.ask(request("REPORT_IFSPAM", ham)))
    assert hdrs[b"Spam"].startswith(b"No ;") and body == b""
    _, hdrs, body = split_reply(served.ask(request("REPORT_IFSPAM", spam)))
    assert hdrs[b"Spam"].startswith(b"Yes ;") and b"Content analysis details:" in body


def test_ping_and_skip(served):
    assert served.ask(b"PING SPAMC/1.5\r\n\r\n") == b"SPAMD/1.5 0 PONG\r\n"
    assert served.ask(b"PING SPAMC/1.2\r\n") == b"SPAMD/1.5 0 PONG\r\n"
    assert served.ask(b"SKIP SPAMC/1.5\r\n\r\n") == b""


def test_older_protocol_versions(served, spam_and_ham):
    raw = spam_and_ham[1]
    # 1.0: no headers, the message runs to the end of input; the reply has no length
    out = served.ask(b"PROCESS SPAMC/1.0\r\n" + raw)
    assert out.startswith(b"SPAMD/1.0 0 EX_OK\r\n") and b"X-Spam-Status: No, score=" in out
    # 1.2: a length, no Spam header; 1.3+: both
    status, hdrs, _ = split_reply(served.ask(request("PROCESS", raw, version="1.2")))
    assert b"Content-length" in hdrs and b"Spam" not in hdrs
    # no Content-length: read to the end of input
    status, hdrs, _ = split_reply(served.ask(b"CHECK SPAMC/1.5\r\n\r\n" + raw))
    assert status == b"SPAMD/1.1 0 EX_OK" and hdrs[b"Spam"].startswith(b"False")


# -- learning ------------------------------------------------------------------------


def test_tell_learns_moves_and_forgets(served, spam_and_ham, compiled):
    raw = spam_and_ham[1].replace(b"Subject:", b"Subject: tell-test", 1)  # a message not learned yet
    tell = lambda **h: split_reply(served.ask(request("TELL", raw, **h)))  # noqa: E731
    assert tell(Message_class="spam", Set="local")[1] == {b"DidSet": b"local"}
    assert tell(Message_class="spam", Set="local")[1] == {}  # already learned as spam
    assert load_model(compiled).known(message_key(raw), raw) == 1  # spam
    assert tell(Message_class="ham", Set="local")[1] == {b"DidSet": b"local"}  # moved
    assert tell(Remove="local")[1] == {b"DidRemove": b"local"}  # no class: the one it was learned as
    assert tell(Remove="local")[1] == {}
    status, _, _ = tell(Message_class="spam", Set="local", Remove="local")
    assert status.startswith(b"SPAMD/1.0 76 ")


def test_only_a_tell_naming_a_user_asks_who_the_tcp_peer_is(served, spam_and_ham, monkeypatch):
    """Finding a TCP peer's user scans the kernel's whole socket table: only a TELL that
    names a user, the one request whose rule reads it, pays for it (it took 29% of the
    server's CPU per CHECK)."""
    asked = []
    real = access.local_peer_uid
    monkeypatch.setattr(access, "local_peer_uid", lambda *a: asked.append(a) or real(*a))
    raw = spam_and_ham[1].replace(b"Subject:", b"Subject: peer-test", 1)
    for method in ("CHECK", "SYMBOLS", "REPORT", "PROCESS", "HEADERS"):
        assert split_reply(served.ask(request(method, raw)))[0].startswith(b"SPAMD/1.1 0 ")
    assert asked == []
    assert split_reply(served.ask(request("TELL", raw, Message_class="spam", Set="local")))[1] == \
        {b"DidSet": b"local"}
    assert asked == []
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert split_reply(served.ask(request("TELL", raw, User=me, Message_class="ham", Set="local")))[1] == \
        {b"DidSet": b"local"}
    assert len(asked) == 1


def test_each_connection_has_one_peer_and_its_user_is_looked_up_once(compiled, spam_and_ham, monkeypatch):
    """The peer built when a connection is accepted (who may connect) is the one the share
    (who holds it) and the request's rule (who may name a user) ask again: one Peer, one
    scan of the kernel's socket table, per connection."""
    built, asked = [], []
    tcp, real = access.Peer.tcp, access.local_peer_uid
    monkeypatch.setattr(access.Peer, "tcp", lambda *a, **kw: built.append(a) or tcp(*a, **kw))
    monkeypatch.setattr(access, "local_peer_uid", lambda *a: asked.append(a) or real(*a))
    s = Served(compiled, max_connections=1)  # a share of one: who holds each connection is asked
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
        raw = spam_and_ham[1].replace(b"Subject:", b"Subject: one-peer", 1)
        for n in (1, 2):
            assert split_reply(s.ask(request("TELL", raw, User=me, Message_class="ham", Set="local")))[0] \
                .startswith(b"SPAMD/1.1 0 ")
            assert (len(built), len(asked)) == (n, n)
        assert not s.srv._peers  # none kept once its connection is closed
    finally:
        s.stop()


def test_tell_marks_the_tellers_row_of_the_message_corrected_in_the_history(compiled, spam_and_ham, tmp_path):
    """spamc -L spam|ham is the user's correction: the history row of that message (by
    Message-ID) and that user is marked, as the page marks it; a message never scanned
    has no row to mark; TELL Remove: takes the mark back with the learning."""
    from spamnb.delivery.events import Recorder
    from spamnb.storage import history

    hist = tmp_path / "h.sqlite"
    rec = Recorder(lines=False, history=history.Recorder(hist, print))
    s = Served(compiled, recorder=rec)
    spam, ham = spam_and_ham
    ham = ham.replace(b"Subject:", b"Subject: told-spam", 1)
    unseen = b"Message-ID: <never-scanned@example.org>\r\n" + spam  # the first Message-ID counts
    try:
        for user in ("alice", "bob"):
            assert b"Spam: False" in s.ask(request("CHECK", ham, User=user))
        assert split_reply(s.ask(request("TELL", ham, User="alice", Message_class="spam", Set="local")))[1] == {
            b"DidSet": b"local"}
        assert split_reply(s.ask(request("TELL", unseen, User="alice", Message_class="ham", Set="local")))[1] == {
            b"DidSet": b"local"}
    finally:
        s.stop()
        rec.close()
    assert history.fields(ham)["message_id"]
    assert rows_of(hist) == [("alice", "ham", "spam", 1), ("bob", "ham", None, 0)]  # the teller's row only
    rec = Recorder(lines=False, history=history.Recorder(hist, print))
    s = Served(compiled, recorder=rec)
    try:  # Remove: local takes the learning back, and with it the mark
        assert split_reply(s.ask(request("TELL", ham, User="alice", Remove="local")))[1] == {b"DidRemove": b"local"}
    finally:
        s.stop()
        rec.close()
    assert rows_of(hist) == [("alice", "ham", None, 0), ("bob", "ham", None, 0)]


def rows_of(hist):
    """A history's rows: who, the verdict, the correction and whether it has a time."""
    import sqlite3

    db = sqlite3.connect(hist)
    try:
        return db.execute("SELECT user, verdict, corrected, corrected_t IS NOT NULL FROM verdicts ORDER BY id").fetchall()
    finally:
        db.close()


def test_tell_behind_a_lock_held_too_long_is_a_tempfail(served, spam_and_ham, compiled, monkeypatch):
    from spamnb.storage.store import model_lock

    monkeypatch.setenv("SPAMNB_LOCK_TIMEOUT", "0.2")
    raw = spam_and_ham[1].replace(b"Subject:", b"Subject: locked-out", 1)
    with model_lock(compiled):
        out = served.ask(request("TELL", raw, Message_class="spam", Set="local"))
    assert out.startswith(b"SPAMD/1.0 75 ") and b"timed out" in out
    assert split_reply(served.ask(request("TELL", raw, Message_class="spam", Set="local")))[1] == {
        b"DidSet": b"local"}  # once the lock is free


def test_tell_changes_the_next_verdict(served, compiled):
    raw = b"Subject: zqxj wibblefrotz\n\nzqxj wibblefrotz quuxplonk zqxj wibblefrotz\n"
    before = split_reply(served.ask(request("CHECK", raw)))[1][b"Spam"]
    for i in range(3):
        msg = raw.replace(b"Subject: ", b"Subject: %d " % i)
        assert split_reply(served.ask(request("TELL", msg, Message_class="spam", Set="local")))[1]
    after = split_reply(served.ask(request("CHECK", raw)))[1][b"Spam"]
    assert float(after.split()[2]) > float(before.split()[2])


def test_tell_needs_allow_tell_and_never_teaches_the_default_model(compiled, spam_and_ham):
    s = Served(compiled, allow_tell=False)
    try:
        out = s.ask(request("TELL", spam_and_ham[0], Message_class="spam", Set="local"))
        assert out.startswith(b"SPAMD/1.0 69 ") and b"--allow-tell" in out
    finally:
        s.stop()
    s = Served(compiled, is_default=True)
    try:
        out = s.ask(request("TELL", spam_and_ham[0], Message_class="spam", Set="local"))
        assert out.startswith(b"SPAMD/1.0 69 ") and b"default model" in out
    finally:
        s.stop()


# -- per-user models -----------------------------------------------------------------


@pytest.fixture
def user_models(tmp_path, trained_model):
    """USER_MODELS/alice/model.joblib: the trained model with other cut-offs (so
    its threshold tells which model answered)."""
    import copy

    from spamnb.nb.decision import Cutoffs
    from spamnb.verdict import check_cutoffs

    root = tmp_path / "users"
    (root / "alice").mkdir(parents=True, mode=0o700)
    m = copy.deepcopy(trained_model)
    m.cutoffs = Cutoffs(*check_cutoffs(0.2, 0.99))
    save_model(m, root / "alice" / "model.joblib")
    return root


def test_user_header_picks_the_users_model(compiled, user_models, spam_and_ham):
    s = Served(compiled, user_models=str(user_models))
    try:
        spam = spam_and_ham[0]
        t = lambda user: split_reply(s.ask(request("CHECK", spam, User=user)))[1][b"Spam"].split()[-1]  # noqa: E731
        assert t("alice") == b"4.6"  # log(0.99/0.01): her model
        assert t("bob") == b"2.9"  # no model of his: the served one
        out = s.ask(request("CHECK", spam, User="../alice"))
        assert out.startswith(b"SPAMD/1.0 76 ") and b"plain user name" in out
        out = s.ask(request("TELL", spam, User="bob", Message_class="spam", Set="local"))
        assert out.startswith(b"SPAMD/1.0 67 ")  # never into the shared model by accident
        raw = spam.replace(b"Subject:", b"Subject: alice-only", 1)
        assert split_reply(s.ask(request("TELL", raw, User="alice", Message_class="spam", Set="local")))[1]
        assert load_model(user_models / "alice" / "model.joblib").known(message_key(raw), raw) == 1
        assert load_model(compiled).known(message_key(raw), raw) is None
    finally:
        s.stop()


# -- bad requests, limits, access ------------------------------------------------------


@pytest.mark.parametrize("req", [
    b"EXPLODE SPAMC/1.5\r\n\r\n",
    b"CHECK HTTP/1.1\r\n\r\n",
    b"CHECK SPAMC/1.5\r\nno colon here\r\n\r\nx",
    b"CHECK SPAMC/1.5\r\nContent-length: 12x\r\n\r\nx",
    b"CHECK SPAMC/1.5\r\nContent-length: 100\r\n\r\nSubject: short\r\n\r\n",
    b"CHECK SPAMC/1.5\r\nCompress: zlib\r\nContent-length: 1\r\n\r\nx",
    b"TELL SPAMC/1.5\r\nMessage-class: eggs\r\nSet: local\r\nContent-length: 1\r\n\r\nx",
    b"CHECK SPAMC/1.5\r\n" + b"X-A: b\r\n" * 300 + b"\r\n",
    b"CHECK SPAMC/1.5\r\nUser: a\x01b\r\n\r\n",
    b"CHECK SPAMC/1.5\r\nContent-length: 5",
    b"\x00\xff\xfe binary\r\n\r\n",
    b"",
])
def test_bad_requests_get_a_protocol_error(served, req):
    out = served.ask(req)
    assert out.startswith(b"SPAMD/1.0 76 Bad header line: ") and out.endswith(b"\r\n") and out.count(b"\n") == 1
    assert served.ask(b"PING SPAMC/1.5\r\n\r\n") == b"SPAMD/1.5 0 PONG\r\n"  # still serving


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.binary(max_size=400),
    st.builds(lambda m, v, h, b: f"{m} SPAMC/{v}\r\n".encode() + h + b"\r\n" + b,
              st.sampled_from(spamd_protocol.METHODS + ("BOGUS",)), st.sampled_from(["1.0", "1.2", "1.5", "9.9", "x"]),
              st.binary(max_size=120), st.binary(max_size=200)),
))
def test_malformed_requests_never_crash_or_hang_the_server(served, req):
    start = time.monotonic()
    out = served.ask(req, timeout=10)
    assert out == b"" or out.startswith((b"SPAMD/1.", b"SPAMD/1.5 0 PONG"))
    assert time.monotonic() - start < 8
    assert not any("internal error" in line for line in served.log_lines), served.log_lines


def test_early_close_and_stalled_clients_do_not_hold_the_server(compiled, spam_and_ham):
    s = Served(compiled, timeout=1.0, max_connections=4)
    try:
        stalled = socket.create_connection(("127.0.0.1", s.port))
        stalled.sendall(b"CHECK SPAMC/1.5\r\nContent-length: 1000\r\n\r\nSubject: x")  # then nothing
        closed = socket.create_connection(("127.0.0.1", s.port))
        closed.sendall(b"PROCESS SPAMC/1.5\r\nContent-length: 1000\r\n\r\nSub")
        closed.close()
        start = time.monotonic()
        out = s.ask(request("CHECK", spam_and_ham[1]))  # served while the stalled one waits
        assert out.startswith(b"SPAMD/1.1 0 EX_OK")
        stalled.settimeout(5)
        assert _read_all(stalled).startswith(b"SPAMD/1.0 79 ")  # dropped at its deadline
        assert time.monotonic() - start < 4
        stalled.close()
    finally:
        s.stop()


def test_connections_beyond_the_cap_wait_a_moment_then_get_a_tempfail(compiled, monkeypatch):
    monkeypatch.setattr(spamd, "SLOT_WAIT", 0.5)
    s = Served(compiled, timeout=5.0, max_connections=1)
    try:
        holder = socket.create_connection(("127.0.0.1", s.port))
        holder.sendall(b"CHECK SPAMC/1.5\r\n")
        time.sleep(0.3)
        start = time.monotonic()
        out = s.ask(b"PING SPAMC/1.5\r\n\r\n", half_close=False)
        assert out.startswith(b"SPAMD/1.0 75 ") and time.monotonic() - start >= 0.45
        waiter = threading.Thread(target=lambda: time.sleep(0.2) or holder.close())
        waiter.start()  # the slot frees while the next one waits: it is served
        assert s.ask(b"PING SPAMC/1.5\r\n\r\n") == b"SPAMD/1.5 0 PONG\r\n"
        waiter.join()
    finally:
        s.stop()


def test_oversized_messages_are_answered_unscanned_and_process_returns_them_whole(compiled):
    s = Served(compiled, max_bytes=2000)
    try:
        big = b"Subject: big\r\n\r\n" + b"cheap pills now " * 1000
        status, hdrs, body = split_reply(s.ask(request("CHECK", big)))
        assert status == b"SPAMD/1.1 0 EX_OK" and hdrs[b"Spam"] == b"False ; 0.0 / 2.9"
        status, hdrs, body = split_reply(s.ask(request("PROCESS", big)))
        assert hdrs[b"Content-length"] == str(len(big)).encode() and body == big
        out = s.ask(b"PROCESS SPAMC/1.5\r\n\r\n" + big)  # no length: streamed back to the end
        assert split_reply(out)[2] == big
        assert s.ask(b"PROCESS SPAMC/1.0\r\n" + big) == b"SPAMD/1.0 0 EX_OK\r\n" + big
        status, hdrs, body = split_reply(s.ask(request("HEADERS", big)))
        assert body == b"Subject: big\r\n\r\n"  # its own header block, unscanned
        out = s.ask(request("TELL", big, Message_class="spam", Set="local"))
        assert out.startswith(b"SPAMD/1.0 65 ")  # never learned unseen
    finally:
        s.stop()


def test_clients_outside_the_allowed_networks_are_closed_before_reading(compiled):
    import ipaddress

    s = Served(compiled, allowed=(ipaddress.ip_network("192.0.2.0/24"),))
    try:
        assert s.ask(b"PING SPAMC/1.5\r\n\r\n") == b""
        assert any("refused" in line for line in s.log_lines)
    finally:
        s.stop()


def test_a_model_that_cannot_be_read_is_an_ioerror_and_the_server_goes_on(tmp_path, compiled, spam_and_ham):
    path = tmp_path / "own" / "model.joblib"
    path.parent.mkdir(mode=0o700)
    shutil.copyfile(compiled, path)
    shutil.copyfile(str(compiled) + ".scorer", str(path) + ".scorer")
    path.chmod(0o600)
    s = Served(path)
    try:
        assert s.ask(request("CHECK", spam_and_ham[0])).startswith(b"SPAMD/1.1 0 EX_OK")
        path.chmod(0o666)  # another user could have written it: not trusted
        out = s.ask(request("CHECK", spam_and_ham[0]))
        assert out.startswith(b"SPAMD/1.0 74 ")
        path.chmod(0o600)
        assert s.ask(request("CHECK", spam_and_ham[0])).startswith(b"SPAMD/1.1 0 EX_OK")
    finally:
        s.stop()


# -- the real clients ------------------------------------------------------------------


def spamc(port, *args, raw=b"", check=False):
    return subprocess.run([SPAMC, "-d", "127.0.0.1", "-p", str(port), *args], input=raw, capture_output=True,
                          timeout=60, check=check)


@needs_spamc
def test_spamc_check_process_report_symbols_ping(served, spam_and_ham):
    spam, ham = spam_and_ham
    r = spamc(served.port, "-c", raw=spam)
    assert r.returncode == 1 and re.fullmatch(rb"\d+\.\d/2\.9\n", r.stdout)
    r = spamc(served.port, "-c", raw=ham)
    assert r.returncode == 0 and re.fullmatch(rb"-?\d+\.\d/2\.9\n", r.stdout)
    r = spamc(served.port, raw=ham)  # PROCESS
    assert r.returncode == 0 and r.stdout == split_reply(served.ask(request("PROCESS", ham)))[2]
    r = spamc(served.port, raw=ham.replace(b"\nSubject:", b"\n" + FORGED + b"Subject:", 1))
    assert r.returncode == 0 and r.stdout == split_reply(served.ask(request("PROCESS", ham)))[2]  # forged: gone
    r = spamc(served.port, "-R", raw=spam)
    assert b"Content analysis details:" in r.stdout
    r = spamc(served.port, "-y", raw=spam)
    assert r.stdout.count(b",") == spamd_protocol.N_SYMBOLS - 1
    r = spamc(served.port, "-K")
    assert r.returncode == 0 and r.stdout.startswith(b"SPAMD/1.5 0")


@needs_spamc
def test_spamc_learn_and_forget(served, spam_and_ham):
    raw = spam_and_ham[1].replace(b"Subject:", b"Subject: spamc-learn", 1)
    assert spamc(served.port, "-L", "spam", raw=raw).stdout == b"Message successfully un/learned\n"
    assert spamc(served.port, "-L", "spam", raw=raw).stdout == b"Message was already un/learned\n"
    assert spamc(served.port, "-L", "ham", raw=raw).stdout == b"Message successfully un/learned\n"
    assert spamc(served.port, "-L", "forget", raw=raw).stdout == b"Message successfully un/learned\n"
    assert spamc(served.port, "-L", "forget", raw=raw).stdout == b"Message was already un/learned\n"


@needs_spamc
def test_spamc_user_and_size_limit(compiled, user_models, spam_and_ham):
    s = Served(compiled, user_models=str(user_models), max_bytes=1000)
    try:
        spam = spam_and_ham[0]
        assert len(spam) > 1000
        # spamc's own -s limit: it does not send the message, and passes it through
        r = spamc(s.port, "-s", "100", raw=spam)
        assert r.stdout == spam
        # over the server's limit: unscanned, returned whole
        r = spamc(s.port, "-u", "alice", raw=spam)
        assert r.stdout == spam
        r = spamc(s.port, "-u", "alice", "-c", raw=spam)
        assert r.stdout == b"0.0/4.6\n" and r.returncode == 0
        # her model unreadable: answered with the served model's threshold, as a scan would be
        (user_models / "alice" / "model.joblib").chmod(0o666)
        r = spamc(s.port, "-u", "alice", "-c", raw=spam)
        assert r.stdout == b"0.0/2.9\n" and r.returncode == 0
        assert any("cannot read user model" in line for line in s.log_lines), s.log_lines
    finally:
        s.stop()


@needs_spamc
def test_a_user_without_a_model_costs_no_backend_per_request_and_is_served_one_made_later(
        compiled, user_models, spam_and_ham, monkeypatch):
    """``spamc -u bob`` (no ``USERS/bob/model.joblib``): the server remembers that bob has
    no model and checks it with a stat, not a backend built per request; the model made
    for him later answers his next request."""
    import copy

    from spamnb.nb.decision import Cutoffs
    from spamnb.storage import filestore
    from spamnb.verdict import check_cutoffs

    s = Served(compiled, user_models=str(user_models))
    opened = []
    real = filestore.FileBackend.__init__
    monkeypatch.setattr(filestore.FileBackend, "__init__",
                        lambda self, path, **kw: opened.append(os.fspath(path)) or real(self, path, **kw))
    try:
        spam = spam_and_ham[0]
        for _ in range(10):
            assert spamc(s.port, "-u", "bob", "-c", raw=spam).stdout.endswith(b"/2.9\n")  # the served model
        bob = user_models / "bob" / "model.joblib"
        assert opened.count(str(bob)) <= 1, opened  # not one per request
        m = copy.deepcopy(load_model(compiled))
        m.cutoffs = Cutoffs(*check_cutoffs(0.2, 0.99))
        save_model(m, bob)
        assert spamc(s.port, "-u", "bob", "-c", raw=spam).stdout.endswith(b"/4.6\n")  # his, at once
        assert spamc(s.port, "-u", "alice", "-c", raw=spam).stdout.endswith(b"/4.6\n")
    finally:
        s.stop()


def test_names_without_a_model_are_remembered_apart_and_bounded(compiled, user_models):
    """Hostile ``User:`` names (any plain name, each new) cannot evict a real user's
    cached model, nor grow the server's memory: the names known to have no model are
    a bounded cache of their own."""
    s = Served(compiled, user_models=str(user_models))
    try:
        models = s.models
        alice, own = models.for_user("alice")
        assert own
        for i in range(models.NO_MODEL_CACHE + 500):
            assert models.for_user(f"x{i}") == (models.served, False)
        assert models.for_user("alice") == (alice, True)  # the same backend: its model still loaded
        assert len(models.no_model) == models.NO_MODEL_CACHE
    finally:
        s.stop()


def test_messages_for_one_user_at_once_share_one_backend(compiled, user_models, monkeypatch):
    """Messages for one user scanned at once (Postfix sends them in parallel) get one
    backend, so the model is loaded once; the others made meanwhile are closed unread;
    whether the model is there is asked once in NO_MODEL_SECONDS; a store that cannot
    say leaves the served model to answer (the mail is scanned, not passed)."""
    s = Served(compiled, user_models=str(user_models))
    try:
        models = s.models
        made, asked, closed = [], [], []
        real = models._backend

        def backend(name, path):
            b = real(name, path)
            made.append(b)
            exists, close = b.exists, b.close
            b.exists = lambda: (asked.append(b), time.sleep(0.05), exists())[-1]
            b.close = lambda: (closed.append(b), close())[-1]
            return b

        monkeypatch.setattr(models, "_backend", backend)
        got = []
        threads = [threading.Thread(target=lambda: got.append(models.for_user("alice"))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(b) for b, own in got}) == 1 and all(own for _, own in got)
        assert sorted(map(id, closed)) == sorted(id(b) for b in made if b is not got[0][0])
        n = len(asked)
        for _ in range(50):
            assert models.for_user("alice") == got[0]
        assert len(asked) == n  # believed for NO_MODEL_SECONDS, as "no model" is

        from spamnb.storage.backend import StoreUnavailable

        def unavailable():
            raise StoreUnavailable("no Sentinel of the store answers")

        got[0][0].exists = unavailable
        models._backends["alice"][1] -= models.NO_MODEL_SECONDS  # time to ask again
        assert models.for_user("alice") == (models.served, False)
        assert any("no Sentinel of the store answers" in line for line in s.log_lines)
    finally:
        s.stop()


@needs_spamc
def test_spamc_passes_the_message_through_when_spamnb_is_down(spam_and_ham):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens here once closed
    r = spamc(port, raw=spam_and_ham[0])
    assert r.returncode == 0 and r.stdout == spam_and_ham[0]
    r = spamc(port, "-x", raw=spam_and_ham[0])
    assert r.returncode != 0 and r.stdout == b""


def test_aiospamc_speaks_to_it(served, spam_and_ham):
    aiospamc = pytest.importorskip("aiospamc", reason="aiospamc (test extra) is not installed")
    spam, ham = spam_and_ham
    raw = ham.replace(b"Subject:", b"Subject: aiospamc", 1)
    processed = split_reply(served.ask(request("PROCESS", ham)))[2]  # before the TELL below changes the model

    async def run():
        kw = dict(host="127.0.0.1", port=served.port)
        check = await aiospamc.check(spam, **kw)
        process = await aiospamc.process(ham, **kw)
        ping = await aiospamc.ping(**kw)
        symbols = await aiospamc.symbols(spam, **kw)
        told = await aiospamc.tell(raw, "spam", set_action="local", **kw)
        return check, process, ping, symbols, told

    check, process, ping, symbols, told = asyncio.run(run())
    assert check.headers["Spam"].value is True and check.headers["Spam"].threshold == pytest.approx(2.9)
    assert process.body == processed
    assert ping.message == "PONG"
    assert len(symbols.body.split(b",")) == spamd_protocol.N_SYMBOLS
    assert "DidSet" in told.headers


# -- the command -------------------------------------------------------------------------


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_spamd_from_the_command_line(compiled, tmp_path, spam_and_ham):
    port = _free_port()
    unix = tmp_path / "spamd.sock"
    proc = subprocess.Popen(SPAMNB + ["serve", "--socket", str(tmp_path / "run" / "socket"), "--model", str(compiled),
                                      "--spamd", f"127.0.0.1:{port}", "--spamd", str(unix), "--allow-tell"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not unix.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.05)
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(request("CHECK", spam_and_ham[0]))
            assert _read_all(s).startswith(b"SPAMD/1.1 0 EX_OK\r\nSpam: True ; ")
        assert oct(os.stat(unix).st_mode & 0o777) == "0o600"
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(unix))
            s.sendall(b"PING SPAMC/1.5\r\n\r\n")
            assert _read_all(s) == b"SPAMD/1.5 0 PONG\r\n"
        if SPAMC:
            r = subprocess.run([SPAMC, "-U", str(unix), "-c"], input=spam_and_ham[1], capture_output=True, timeout=60)
            assert r.returncode == 0 and r.stdout.endswith(b"/2.9\n")
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stdout.close()
        proc.stderr.close()
    assert not unix.exists()


def test_a_port_in_use_is_one_line_naming_it(compiled, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run(SPAMNB + ["serve", "--socket", str(tmp_path / "run" / "s"), "--model", str(compiled),
                                     "--spamd", f"127.0.0.1:{port}"], capture_output=True, timeout=60)
    assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{port}: Address already in use".encode() in r.stderr
    assert b"Traceback" not in r.stderr and r.stderr.count(b"error") == 1


@pytest.mark.parametrize("args, message", [
    (["--spamd", "0.0.0.0:7830"], "--allow"),
    (["--spamd", "mail.example:783"], "IP address"),
    (["--allow", "10.0.0.0/8"], "are for --spamd"),
    (["--spamd", "7830", "--spamd-socket-mode", "999"], "octal"),
])
def test_serve_spamd_usage_errors_are_one_line(compiled, tmp_path, args, message):
    r = subprocess.run(SPAMNB + ["serve", "--socket", str(tmp_path / "run" / "s"), "--model", str(compiled), *args],
                       capture_output=True, timeout=60)
    assert r.returncode == 2 and message.encode() in r.stderr and b"Traceback" not in r.stderr


# -- concurrency -----------------------------------------------------------------------------


def test_concurrent_clients_get_the_answers_one_at_a_time_gets(served):
    from concurrent.futures import ThreadPoolExecutor

    raws = messages()[:24]
    serial = [split_reply(served.ask(request("CHECK", raw)))[1] for raw in raws]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda raw: split_reply(served.ask(request("CHECK", raw)))[1], raws * 2))
    assert together == serial * 2


def test_concurrent_tells_are_each_learned_exactly_once(served, compiled):
    from concurrent.futures import ThreadPoolExecutor

    base = messages()[0]
    raws = [base.replace(b"Subject:", b"Subject: concurrent-%d" % i, 1) for i in range(40)]
    before = load_model(compiled).messages.tolist()

    def tell(i):
        label = "spam" if i % 2 else "ham"
        return split_reply(served.ask(request("TELL", raws[i], Message_class=label, Set="local")))[1]

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(tell, range(40)))
    assert replies == [{b"DidSet": b"local"}] * 40
    after = load_model(compiled).messages.tolist()
    assert after == [before[0] + 20, before[1] + 20]
    with ThreadPoolExecutor(8) as pool:  # again: all known, nothing counted twice
        assert list(pool.map(tell, range(40))) == [{}] * 40
    assert load_model(compiled).messages.tolist() == after


# -- big inputs (slow: .ci/run) ------------------------------------------------------------------


@pytest.mark.slow
def test_a_30mb_message_is_scanned_and_a_70mb_one_streamed_back_whole(compiled, spam_and_ham):
    """At the default --max-bytes (64 MB): a 30 MB message is scored and returned with
    every byte; a 70 MB one is answered unscanned and returned whole, never held."""
    from spamnb.delivery.server import MAX_BYTES

    s = Served(compiled, max_bytes=MAX_BYTES, timeout=120.0, spamd_max_bytes=128 << 20)
    try:
        head = spam_and_ham[1].split(b"\n\n", 1)[0] + b"\n\n"
        for size, scanned in ((30 << 20, True), (70 << 20, False)):
            raw = head + (b"a line of an attachment, base64 or not\n" * (size // 40 + 1))
            status, hdrs, body = split_reply(s.ask(request("PROCESS", raw), timeout=300))
            assert status == b"SPAMD/1.1 0 EX_OK" and int(hdrs[b"Content-length"]) == len(body)
            if scanned:
                assert body.replace(b"X-Spam-Flag: ", b"").startswith(head[:200]) and len(body) > len(raw)
                assert hook.add_headers(raw, []) == raw and body.endswith(raw[len(head):])
            else:
                assert body == raw and hdrs[b"Spam"].startswith(b"False ; 0.0 / ")
                if SPAMC:  # spamc sends all before it reads a byte: the server must not answer early
                    r = spamc(s.port, "-s", str(size * 2), raw=raw)
                    assert r.returncode == 0 and r.stdout == raw
            del raw, body
    finally:
        s.stop()


@needs_spamc
def test_a_user_model_that_cannot_be_read_falls_back_to_the_site_model_and_says_so(compiled, user_models,
                                                                                    spam_and_ham):
    """A user model the server cannot read: the mail is still scanned (spamc -c shows the site model's
    score and threshold, not 0/0) and the server log names the model and why, once."""
    alice = user_models / "alice" / "model.joblib"
    s = Served(compiled, user_models=str(user_models))
    try:
        spam = spam_and_ham[0]
        site = spamc(s.port, "-c", raw=spam).stdout
        assert re.fullmatch(rb"\d+\.\d/2\.9\n", site)
        assert spamc(s.port, "-u", "alice", "-c", raw=spam).stdout.endswith(b"/4.6\n")  # her model
        alice.chmod(0o666)  # another user could have written it: it is not read
        for _ in range(2):
            r = spamc(s.port, "-u", "alice", "-c", raw=spam)
            assert r.stdout == site and r.returncode == 1
        said = [line for line in s.log_lines if "cannot read user model" in line]
        assert len(said) == 1 and str(alice) in said[0] and str(compiled) in said[0], s.log_lines
        out = spamc(s.port, "-u", "alice", raw=spam).stdout
        assert b"model=model.joblib" in out and b"X-Spam-Flag: YES" in out
        (user_models / "alice" / "model.joblib.scorer").unlink()
        alice.chmod(0o600)
        alice.write_bytes(b"not a model")  # damaged: read, and refused
        assert spamc(s.port, "-u", "alice", "-c", raw=spam).stdout == site
        assert len([line for line in s.log_lines if "cannot read user model" in line]) == 2
    finally:
        s.stop()


@pytest.mark.parametrize("args, says", [
    (["--spamd", "0.0.0.0:7830"], "--allow"),
    (["--spamd", "127.0.0.1:99999"], "port"),
    (["--spamd", "127.0.0.1:7830", "--allow", "192.0.2.0/99"], "not an address"),
    (["--spamd", "127.0.0.1:7830", "--user-models", "/nonexistent/users"], "does not exist"),
])
def test_serve_refuses_bad_spamd_options_before_loading_the_model(tmp_path, args, says):
    """A damaged model would fail to load; the option is refused first."""
    bad = tmp_path / "bad.joblib"
    bad.write_bytes(b"not a model")
    bad.chmod(0o600)
    r = subprocess.run(SPAMNB + ["serve", "--socket", str(tmp_path / "s.sock"), "--model", str(bad), *args],
                       capture_output=True, timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 2 and says in err and "model" not in re.sub(r"--[\w-]+", "", err.lower()), err


def test_cutoffs_set_in_place_keep_what_tell_learned_and_the_server_answers_with_them(compiled, spam_and_ham):
    """`spamnb cutoffs` changes the model's stored cut-offs without
    retraining; what TELL learned stays, and the running server's next answer uses them."""
    s = Served(compiled)
    try:
        spam = spam_and_ham[0]
        threshold = lambda: split_reply(s.ask(request("CHECK", spam)))[1][b"Spam"].split()[-1]  # noqa: E731
        assert threshold() == b"2.9"
        raw = spam.replace(b"Subject:", b"Subject: told-before", 1)
        assert split_reply(s.ask(request("TELL", raw, Message_class="spam", Set="local")))[1]
        shown = subprocess.run(SPAMNB + ["cutoffs", "--model", str(compiled)], capture_output=True, text=True)
        assert shown.returncode == 0 and shown.stdout.startswith("ham <= 0.5 < unsure <= 0.95 < spam")
        r = subprocess.run(SPAMNB + ["cutoffs", "--spam-cutoff", "0.99", "--ham-cutoff", "0.2",
                                     "--model", str(compiled)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "spam > 0.95 -> 0.99" in r.stderr, r.stderr
        assert threshold() == b"4.6"  # log(0.99/0.01), without a restart
        m = load_model(compiled)
        assert (m.cutoffs.ham_cutoff, m.cutoffs.spam_cutoff) == (0.2, 0.99)
        assert m.known(message_key(raw), raw) == 1  # TELL's learning kept
        bad = subprocess.run(SPAMNB + ["cutoffs", "--spam-cutoff", "1.5", "--model", str(compiled)],
                             capture_output=True, text=True)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr
    finally:
        s.stop()


TELL_REFUSALS = {  # docs/spamd.md's table: what spamc -L shows, and the server's log line
    "TELL not enabled": (dict(allow_tell=False), [], "TELL commands are not enabled"),
    "user without a model": (dict(user_models=True), ["-u", "bob"], "no model of user 'bob'"),
    "the default model": (dict(is_default=True), [], "the default model does not learn"),
    "model not trusted": (dict(untrusted=True), [], "not learned: the model cannot be updated (refusing to load model"),
}


@needs_spamc
@pytest.mark.parametrize("case", list(TELL_REFUSALS))
def test_what_spamc_shows_for_each_tell_refusal(compiled, user_models, spam_and_ham, case):
    """Checked with the real spamc: it reads a refusal's status line and
    no header block, fails with 74 (EX_IOERR) and prints nothing, whatever the code; the
    reason is the server's log line. (With a header block after the code, spamc would
    print "Message was already un/learned" and exit 0: a refusal passing for success.)"""
    kw, args, logged = TELL_REFUSALS[case]
    untrusted = kw.pop("untrusted", False)
    if kw.pop("user_models", False):
        kw["user_models"] = str(user_models)
    s = Served(compiled, **kw)
    try:
        if untrusted:
            compiled.chmod(0o666)
        r = spamc(s.port, "-L", "spam", *args, raw=spam_and_ham[1])
        assert (r.returncode, r.stdout) == (74, b"")
        assert any(line.startswith("spamd: ") and logged in line for line in s.log_lines), s.log_lines
    finally:
        compiled.chmod(0o600)
        s.stop()


@needs_spamc
def test_spamc_forget_of_a_message_never_learned_is_already_unlearned(served, spam_and_ham):
    r = spamc(served.port, "-L", "forget", raw=spam_and_ham[1])
    assert (r.returncode, r.stdout) == (0, b"Message was already un/learned\n")


def test_symbols_escape_commas_readably():
    """A comma separates SYMBOLS' items, so one in a token is escaped,
    as %2C (what spamc -y prints as it is), not \\u002c; spaces read as _."""
    assert spamd_protocol.symbol("subject:a,b c", 1.5) == "subject:a%2Cb_c(+1.50)"
    assert spamd_protocol.symbol("from:é", -0.25) == "from:\\u00e9(-0.25)"  # ASCII, as before
    items = ",".join([spamd_protocol.symbol("x,y", 1.0), spamd_protocol.symbol("z", 2.0)]).split(",")
    assert items == ["x%2Cy(+1.00)", "z(+2.00)"]
