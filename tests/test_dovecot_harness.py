"""The private Dovecot of tests/dovecot.py, which the ``spamnb imap`` tests run
against: these prove the harness itself (start-up and login, what the server
returns for what was appended, the Junk folder, a server without MOVE,
dropped sessions, a changed UIDVALIDITY)."""

from __future__ import annotations

import imaplib

import pytest

from dovecot import as_served, sha256

HAM = b"From: bob@example.org\nTo: alice@example.org\nSubject: lunch\n\nSee you at noon.\n"
SPAM = (b"From: win@prize.example\r\nTo: alice@example.org\r\nSubject: you won\r\n"
        b"Content-Type: text/plain; charset=latin-1\r\n\r\nCLAIM \xe9\xe9 NOW\r\n")


def test_login_and_folders(dovecot):
    with dovecot.client() as c:
        assert c.select_folder("INBOX")[b"EXISTS"] == 0
        names = {name for _flags, _delim, name in c.list_folders()}
        assert {"INBOX", "Junk"} <= names
        assert "Junk" in {name for _flags, _delim, name in c.list_sub_folders()}  # auto = subscribe


def test_junk_has_the_junk_special_use(dovecot):
    with dovecot.client() as c:
        assert c.has_capability("SPECIAL-USE")
        flags = {name: flags for flags, _delim, name in c.list_folders()}
        assert b"\\Junk" in flags["Junk"]
        assert c.find_special_folder(b"\\Junk") == "Junk"


def test_append_then_fetch_is_byte_identical_as_served(dovecot):
    crlf_uid = dovecot.append("INBOX", SPAM)
    lf_uid = dovecot.append("INBOX", HAM)
    got = dovecot.fetch_all("INBOX")
    assert sorted(got) == dovecot.uids("INBOX") == [crlf_uid, lf_uid]
    # a CRLF message comes back as it was appended ...
    assert sha256(got[crlf_uid]) == sha256(SPAM)
    # ... an LF-only one with CRLF line ends (Maildir keeps LF on disk; IMAP serves CRLF)
    assert got[lf_uid] != HAM
    assert sha256(got[lf_uid]) == sha256(as_served(HAM)) == sha256(HAM.replace(b"\n", b"\r\n"))
    # the other conversions as_served models: bare CR, NUL, no final line end; 8-bit kept
    odd = b"Subject: odd\r\n\r\nbare\rCR\rLF\r\r\nnul\x00byte \xff\xfe\nno final line end"
    odd_uid = dovecot.append("INBOX", odd)
    assert dovecot.fetch_all("INBOX")[odd_uid] == as_served(odd)
    # BODY.PEEK[] left them unseen
    with dovecot.client() as c:
        c.select_folder("INBOX", readonly=True)
        assert c.search("UNSEEN") == [crlf_uid, lf_uid, lf_uid + 1]


def test_move_keeps_what_the_server_returns(dovecot):
    uid = dovecot.append("INBOX", HAM)
    before = dovecot.fetch_all("INBOX")[uid]
    junk_uid = dovecot.move("INBOX", uid, "Junk")
    assert dovecot.uids("INBOX") == []
    assert dovecot.fetch_all("Junk") == {junk_uid: before}
    back = dovecot.move("Junk", junk_uid, "INBOX")
    assert back != uid  # a new UID in INBOX, the same bytes
    assert dovecot.fetch_all("INBOX") == {back: before}


def test_a_server_without_move(make_dovecot):
    server = make_dovecot(capabilities_without=("MOVE",))
    with server.client() as c:
        caps = set(c.capabilities())
    assert b"MOVE" not in caps
    assert {b"UIDPLUS", b"SPECIAL-USE", b"IMAP4REV1"} <= caps
    # a user's client moves with COPY + \Deleted + UID EXPUNGE there
    uid = server.append("INBOX", SPAM)
    junk_uid = server.move("INBOX", uid, "Junk")
    assert server.uids("INBOX") == []
    assert server.fetch_all("Junk") == {junk_uid: SPAM}


def test_kick_drops_an_open_session(dovecot):
    dovecot.append("INBOX", HAM)
    with dovecot.client() as c:
        c.select_folder("INBOX")
        assert c.noop()
        assert len(dovecot.sessions()) == 1
        dovecot.kick()
        assert dovecot.sessions() == []
        with pytest.raises((imaplib.IMAP4.abort, OSError)):  # "Server shutting down." / "socket error: EOF"
            c.fetch([1], ["BODY.PEEK[]"])
    # the server itself goes on
    assert dovecot.uids("INBOX") == [1]


def test_change_uidvalidity_keeps_the_messages(dovecot):
    uids = [dovecot.append("Junk", SPAM), dovecot.append("Junk", HAM)]
    before = dovecot.fetch_all("Junk")
    with dovecot.client() as c:
        old = c.select_folder("Junk")[b"UIDVALIDITY"]
    new = dovecot.change_uidvalidity("Junk")
    with dovecot.client() as c:
        assert c.select_folder("Junk")[b"UIDVALIDITY"] == new != old
    assert dovecot.fetch_all("Junk") == before
    assert sorted(before) == uids
    assert dovecot.change_uidvalidity("Junk", 12345) == 12345
