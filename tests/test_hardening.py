"""What a hostile neighbour or a hostile file can do (issue "Hardening"): each attack
reproduced first, then held off here.

The attacks by another local user run as a throwaway user made with ``useradd``;
they need root, and skip with that reason otherwise.
"""

from __future__ import annotations

import email
import email.policy
import encodings.idna  # noqa: F401 - loaded before a fork: the forked user may not read the venv
import fcntl
import io
import os
import pickle
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import filter_message, learnable_cutoffs, sample_message
from spamnb.delivery import fastfilter, wire
from spamnb.delivery.hook import add_headers, replace_verdicts
from spamnb.mail.tokenizer import tokenize
from spamnb.storage import locate
from spamnb.storage.modelfile import load_model, save_model
from spamnb.verdict import Fallback, header_lines
from test_e2e import SPAMNB

MALLORY = "spamnb-mallory"


@pytest.fixture(scope="session")
def mallory():
    """A throwaway local user: the hostile neighbour."""
    if os.geteuid() != 0:
        pytest.skip("the attacks by another user need root to make a throwaway user (useradd)")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed")
    from spamnb.delivery.access import login_user

    try:
        found = pwd.getpwnam(MALLORY)
        if login_user(found.pw_uid):
            return found
        # made by an older run as a system account, which spamd lets name anyone (an MTA's):
        # the neighbour is a person's account
        subprocess.run(["userdel", MALLORY], check=True, capture_output=True)
    except KeyError:
        pass
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", MALLORY],
                   check=True, capture_output=True)
    return pwd.getpwnam(MALLORY)


@pytest.fixture
def sticky_dir():
    """A shared folder like /tmp: everyone may create files, nobody may replace another's."""
    path = Path(tempfile.mkdtemp(prefix="spamnb-shared-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(user, *cmd):
    subprocess.run(list(cmd), check=True, capture_output=True, user=user.pw_uid, group=user.pw_gid)


class Payload:
    """A pickle that, when loaded, creates a file: proof that loading ran its code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def compiled(trained_model_file, tmp_path):
    """A private model with its compiled scorer beside it (the cold path answers)."""
    path = tmp_path / "m" / "model.joblib"
    save_model(load_model(trained_model_file), path)
    return path


def filter_cmd(raw, *args, env=None):
    env = {**os.environ, **(env or {})}
    env.setdefault("SPAMNB_SOCKET", "/nonexistent/spamnb.sock")
    return subprocess.run([*SPAMNB, "filter", *args], input=raw, capture_output=True, env=env, timeout=120)


# -- 1. a symlink planted in a sticky shared folder ---------------------------------------

def test_a_link_another_user_planted_is_never_followed(mallory, sticky_dir, tmp_path, model_file):
    marker = tmp_path / "payload-ran"
    attachments = tmp_path / "attachments"
    attachments.mkdir(mode=0o700)
    payload = attachments / "saved-attachment.joblib"  # a file of the victim's own
    payload.write_bytes(pickle.dumps(Payload(marker)))
    payload.chmod(0o600)
    planted = sticky_dir / "alice-model.joblib"  # SPAMNB_MODEL named it before it existed
    as_user(mallory, "ln", "-s", str(payload), str(planted))
    raw = sample_message("spam", 0).read_bytes()
    res = filter_cmd(raw, env={"SPAMNB_MODEL": str(planted)})
    assert res.returncode == 3 and res.stdout == raw
    assert b"symbolic link" in res.stderr and str(mallory.pw_uid).encode() in res.stderr
    for args in (["info"], ["classify", str(sample_message("ham", 0))], ["serve", "--socket",
                                                                          str(tmp_path / "s" / "sock")]):
        res = subprocess.run([*SPAMNB, *args], capture_output=True, timeout=60,
                             env={**os.environ, "SPAMNB_MODEL": str(planted)})
        assert res.returncode == 1 and b"symbolic link" in res.stderr
    assert not marker.exists()  # the pickle never ran
    # and a link of our own in the same shared folder is fine
    mine = sticky_dir / "my-model.joblib"
    mine.symlink_to(model_file)
    res = filter_cmd(raw, env={"SPAMNB_MODEL": str(mine)})
    assert res.returncode in (0, 1, 2), res.stderr


def test_a_link_in_a_folder_others_can_write_is_refused(tmp_path, model_file):
    """Even our own link: another user could replace it (no sticky bit)."""
    shared = tmp_path / "open"
    shared.mkdir()
    shared.chmod(0o777)
    link = shared / "model.joblib"
    link.symlink_to(model_file)
    res = filter_cmd(sample_message("spam", 0).read_bytes(), "--model", str(link))
    assert res.returncode == 3 and b"folder others can change" in res.stderr


# -- 2. the folder checked is the folder the model really sits in --------------------------

def test_a_model_in_a_world_writable_folder_is_refused_through_a_private_link(tmp_path, model_file):
    public = Path(tempfile.mkdtemp(prefix="spamnb-ww-", dir="/tmp"))
    try:
        public.chmod(0o777)  # writable by all, not sticky: anyone can swap the model
        real = public / "model.joblib"
        shutil.copyfile(model_file, real)
        real.chmod(0o600)
        private = tmp_path / "private"
        private.mkdir(mode=0o700)
        (private / "model.joblib").symlink_to(real)
        res = filter_cmd(sample_message("spam", 0).read_bytes(), "--model", str(private / "model.joblib"))
        assert res.returncode == 3
        assert f"its folder {public} is writable by group or others".encode() in res.stderr
    finally:
        shutil.rmtree(public, ignore_errors=True)


# -- 3. locks: another user's lock file, a holder that never lets go ------------------------

def test_another_users_lock_file_is_refused(mallory, sticky_dir, model_file):
    model = sticky_dir / "m.joblib"
    shutil.copyfile(model_file, model)
    model.chmod(0o600)
    as_user(mallory, "sh", "-c", f"umask 0; : > {model}.lock")
    res = subprocess.run([*SPAMNB, "learn", "--spam", "--model", str(model), str(sample_message("spam", 1))],
                         capture_output=True, timeout=60)
    assert res.returncode == 1 and b"belongs to uid" in res.stderr


@pytest.fixture
def held_lock(model_file):
    """Another process holds the model's lock and never lets go."""
    fd = os.open(str(model_file) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield model_file
    os.close(fd)


def test_a_held_lock_times_out_with_a_clear_error(held_lock):
    start = time.monotonic()
    res = subprocess.run([*SPAMNB, "learn", "--spam", "--model", str(held_lock), str(sample_message("spam", 1))],
                         capture_output=True, timeout=60, env={**os.environ, "SPAMNB_LOCK_TIMEOUT": "1"})
    assert time.monotonic() - start < 30
    assert res.returncode == 1
    assert res.stderr.decode().startswith("spamnb: error: timed out after 1s waiting for the lock")


def test_filter_u_delivers_unlearned_when_the_lock_is_held(held_lock):
    before = held_lock.read_bytes()
    raw = sample_message("spam", 1).read_bytes()
    cuts = learnable_cutoffs(load_model(held_lock), raw)  # a verdict filter -u learns
    res = filter_cmd(raw, "--model", str(held_lock), "-u", *cuts, env={"SPAMNB_LOCK_TIMEOUT": "1"})
    assert res.returncode in (0, 1)  # classified and delivered, not an error
    assert b"X-Spam-Status: " in res.stdout
    assert b"filtered but not learned" in res.stderr
    assert held_lock.read_bytes() == before


# -- 4. folders made for a model are private whatever the umask ----------------------------

def test_learn_makes_private_folders_under_umask_002(tmp_path, small_archive):
    target = tmp_path / "data" / "new" / "deeper" / "model.joblib"
    env = {**os.environ, "SPAMNB_CORPUS": str(small_archive)}
    subprocess.run([*SPAMNB, "learn", "--spam", "--model", str(target), str(sample_message("spam", 1))],
                   check=True, capture_output=True, env=env, timeout=300, preexec_fn=lambda: os.umask(0o002))
    for folder in (tmp_path / "data", tmp_path / "data" / "new", target.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    res = filter_cmd(sample_message("spam", 0).read_bytes(), "--model", str(target))
    assert res.returncode in (0, 1, 2), res.stderr


# -- 9. the verdict is a header to the parser, never body text ------------------------------

BROKEN_HEADERS = {
    "line-without-colon": b"Subject: hi\nthis line has no colon\nFrom: a@b.c\n\nbody text\n",
    "nul-in-name": b"Subject: hi\nX-\x00Bad: v\n\nbody\n",
    "8-bit-name": b"Subject: hi\nX-\xe9t\xe9: v\n\nbody\n",
    "bare-cr": b"Subject: hi\rX-Other: v\r\rbody\r",
    "cr-cr-lf": b"Subject: hi\r\r\nX-Other: v\r\n\r\nbody\r\n",
}


@pytest.mark.parametrize("name", sorted(BROKEN_HEADERS))
def test_the_verdict_is_never_tokenized_as_body(name):
    raw = BROKEN_HEADERS[name]
    out = add_headers(raw, header_lines("spam", 0.99, 5.0, "m", [("url:x.biz", 2.0)], required=2.94))
    toks = tokenize(out)
    assert not [t for t in toks if "spam" in t.lower() or t == "yes"], toks
    assert toks == tokenize(raw)
    msg = email.message_from_bytes(out, policy=email.policy.compat32)
    assert msg["X-Spam-Flag"] == "YES"  # the parser sees it where it looks for headers


HEADER_LINE = st.one_of(
    st.from_regex(rb"\A[A-Za-z-]{1,12}: [ -~]{0,20}\Z"),
    st.sampled_from([b"X-Spam-Flag: YES", b"x-spam-status: No, score=-9", b"X-Spam-Level: ***",  # removed by
                     b"X-Spam-Score: 12", b"X-SPAM-REPORT: r", b"X-Spam-Evidence: a:+1.0"]),        # the filter
    st.binary(max_size=20).filter(lambda b: b"\n" not in b and b"\r" not in b),
    st.just(b" continued"), st.just(b"no colon here"),
    st.just(b"From "), st.just(b"From someone@example.com"))  # the parser's own rules for these


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(HEADER_LINE, max_size=6), ends=st.lists(st.sampled_from([b"\n", b"\r\n", b"\r", b"\r\r\n"]),
                                                               min_size=6, max_size=6),
       body=st.binary(max_size=60))
# found by a CI run: a last header line "From " is body to the parser, and verdict headers
# written after it made it a misplaced envelope line (a defect token) instead
@example(lines=[b"From "], ends=[b"\n"] * 6, body=b"")
@example(lines=[b"To: a", b"From x", b"Cc: b"], ends=[b"\n"] * 6, body=b"hi")
@example(lines=[b"X-Spam-Flag: YES", b"From x"], ends=[b"\n"] * 6, body=b"hi")
@example(lines=[b"X-Spam-Level: ***", b" more"], ends=[b"\r"] * 6, body=b"")
@pytest.mark.parametrize("top", [b"Subject: x\n", b"X-Spam-Flag: NO\n", b"X-Spam-Level: *\nFrom x\n"])
def test_filtering_never_changes_the_tokens(top, lines, ends, body):
    """What the filter does to a message -- incoming verdict fields removed, its own
    added -- leaves its tokens as they were, for mail, broken mail and not-mail."""
    raw = top + b"".join(line + end for line, end in zip(lines, ends)) + b"\n" + body
    for label in ("spam", "ham"):
        lines_ = header_lines(label, 0.99, 5.0, "m", [("url:x.biz", 2.0)], required=2.94)
        out = replace_verdicts(raw, lines_)
        assert tokenize(out) == tokenize(raw)


# -- 10. the client writes only what it checked ----------------------------------------------

def fake_server(path, reply):
    """A server of our own user that answers every request with ``reply``."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(4)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                try:
                    head, n = wire.read_request_head(conn, 1 << 26)
                    wire.recv_exact(conn, n)
                    wire.send_all(conn, reply)
                except (OSError, wire.WireError):
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return srv


@pytest.mark.parametrize("pos, block, label", [
    (0, b"X-Spam-Flag: YES\nX-Spam-Status: Yes, p=1\nX-Injected: evil\n", "spam"),   # another header
    (0, b"X-Spam-Flag: NO\nX-Spam-Status: No, p=0\n", "spam"),                       # flag and label disagree
    (10 ** 9, b"X-Spam-Flag: YES\nX-Spam-Status: Yes, p=1\n", "spam"),              # outside the message
    (5, b"", "ham"),                                                                   # nothing to insert
    (0, b"X-Spam-Flag: YES\nX-Spam-Status: Yes, p=1\n\nnew body\n", "spam"),        # a body of its own
])
def test_the_client_ignores_an_answer_that_is_not_a_verdict(tmp_path, compiled, pos, block, label):
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    sock = folder / "socket"
    srv = fake_server(sock, wire.encode_reply(wire.OK, label, pos, block))
    try:
        raw = sample_message("spam", 0).read_bytes()
        opts = fastfilter.parse_args(["--model", str(compiled)])
        with pytest.raises(Fallback, match="not a verdict"):
            fastfilter.via_server(str(sock), raw, str(compiled), False, opts)
        res = filter_cmd(raw, "--model", str(compiled), "--socket", str(sock))
        want, want_label, _ = filter_message(load_model(compiled), raw, "model.joblib")
        assert (res.stdout, res.returncode) == (want, {"spam": 0, "ham": 1, "unsure": 2}[want_label])
    finally:
        srv.close()


# -- 11. XDG paths ---------------------------------------------------------------------------

def test_a_relative_xdg_cache_home_is_ignored():
    env = {"XDG_CACHE_HOME": "relative/cache", "HOME": "/home/u"}
    assert locate.default_cache_path(env) == f"/home/u/.cache/spamnb/default-model-{locate.DEFAULT_RECIPE}.joblib"
    assert locate.default_cache_path({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == f"/c/spamnb/default-model-{locate.DEFAULT_RECIPE}.joblib"


# -- the trust checks of the server and of its client, through a real `spamnb serve` --------

def test_the_server_stops_serving_a_model_that_became_untrusted(compiled, tmp_path):
    """The check before a model is served: the folder turns group-writable while the server
    holds the model; the server must decline (and the client, refusing too, passes mail)."""
    from test_server import start_server

    sock = str(tmp_path / "run" / "socket")
    proc = start_server(sock, compiled)
    try:
        raw = sample_message("spam", 0).read_bytes()
        assert filter_cmd(raw, "--model", str(compiled), "--socket", sock).returncode == 0
        compiled.parent.chmod(0o770)
        res = filter_cmd(raw, "--model", str(compiled), "--socket", sock)
        assert res.returncode == 3 and res.stdout == raw, res.stderr
        assert b"writable by group or others" in res.stderr
    finally:
        compiled.parent.chmod(0o700)
        proc.terminate()
        proc.wait(timeout=30)


def serve_as(user, path):
    """A forked process, turned into ``user``, listening on ``path`` and answering every
    request with a well-formed "ham" verdict (so that only the check of who answers can
    refuse it). Returns its pid once it listens."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(str(path))
            srv.listen(4)
            os.write(ready_w, b"1")
            block = b"".join(line + b"\n" for line in header_lines("ham", 0.000001, -9.0, "x", required=2.94))
            while True:
                conn, _ = srv.accept()
                with conn:
                    head, n = wire.read_request_head(conn, 1 << 26)
                    wire.recv_exact(conn, n)
                    wire.send_all(conn, wire.encode_reply(wire.OK, "ham", 0, block))
        finally:
            os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    return pid


def test_the_client_refuses_a_server_run_by_another_user(mallory, compiled, tmp_path):
    """The socket and its folder are ours (so the folder check passes), but the process
    listening on it is another user's: the client must not take its word."""
    theirs = Path(tempfile.mkdtemp(prefix="spamnb-mallory-", dir="/tmp"))
    os.chown(theirs, mallory.pw_uid, mallory.pw_gid)
    ours = tmp_path / "run"
    ours.mkdir(mode=0o700)
    pid = serve_as(mallory, theirs / "sock")
    try:
        os.rename(theirs / "sock", ours / "socket")  # planted where our client looks
        os.chown(ours / "socket", os.geteuid(), os.getegid())
        raw = sample_message("spam", 0).read_bytes()
        opts = fastfilter.parse_args(["--model", str(compiled)])
        with pytest.raises(Fallback, match="another user"):
            fastfilter.via_server(str(ours / "socket"), raw, str(compiled), False, opts)
        res = filter_cmd(raw, "--model", str(compiled), "--socket", str(ours / "socket"))
        assert res.returncode == 0 and b"X-Spam-Flag: YES" in res.stdout  # not the fake's "ham"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        shutil.rmtree(theirs, ignore_errors=True)


# -- 7. archive members are read within the message caps ------------------------------------

def test_a_huge_archive_member_is_read_only_up_to_the_cap(tmp_path):
    """A 100 MB member packs into a hundred kB; reading it must not take 100 MB."""
    import io
    import resource
    import tarfile

    from spamnb.mail.mime import MAX_PARSE_BYTES
    from spamnb.mail.sources import MAX_MEMBER_BYTES, iter_messages

    size = 100 * 1024 * 1024
    path = tmp_path / "bomb.tar.gz"

    class Zeros(io.RawIOBase):
        def __init__(self, n):
            self.left = n

        def readable(self):
            return True

        def readinto(self, b):
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    head = b"Subject: big\n\n"
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo("mail/big.eml")
        info.size = len(head) + size
        tar.addfile(info, io.BufferedReader(_Chain(head, Zeros(size))))
        small = b"Subject: small\n\nhello\n"
        info = tarfile.TarInfo("mail/small.eml")
        info.size = len(small)
        tar.addfile(info, io.BytesIO(small))
    assert path.stat().st_size < 2_000_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    got = [(m.source.rsplit("/", 1)[1], len(m.raw)) for m in iter_messages(path, label="spam")]
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert got == [("big.eml", MAX_MEMBER_BYTES), ("small.eml", len(small))]
    assert MAX_MEMBER_BYTES == MAX_PARSE_BYTES + 1  # the tokens are those of the whole member
    assert grown_kb < 40 * 1024, f"reading the archive grew the process by {grown_kb} kB"


class _Chain(io.RawIOBase):
    """A readable stream of some bytes, then another stream."""

    def __init__(self, first, rest):
        self.first, self.rest = first, rest

    def readable(self):
        return True

    def readinto(self, b):
        if self.first:
            n = min(len(b), len(self.first))
            b[:n], self.first = self.first[:n], self.first[n:]
            return n
        return self.rest.readinto(b)


# -- 8. an index names only files in its own folder -----------------------------------------

@pytest.mark.parametrize("entry", ["/etc/passwd", "../outside/secret.txt", "link-out"])
def test_an_index_cannot_reach_outside_its_folder(tmp_path, entry):
    from spamnb.mail.sources import SourceError, iter_index

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"Subject: secret\n\nthe password is swordfish\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "ok.eml").write_bytes(b"Subject: fine\n\nhello\n")
    (corpus / "link-out").symlink_to(outside / "secret.txt")
    index = corpus / "index"
    index.write_text(f"ham ok.eml\nham {entry}\nspam ok.eml\n")
    with pytest.raises(SourceError, match="outside the index's folder"):
        list(iter_index(index))
    res = subprocess.run([*SPAMNB, "train", "--index", str(index), "--model", str(tmp_path / "m.joblib")],
                         capture_output=True, timeout=120)
    assert res.returncode == 1 and b"outside the index's folder" in res.stderr and b"--trust-index" in res.stderr
    assert not (tmp_path / "m.joblib").exists()
    # trusted, it reads them (TREC's full/index -> ../data layout)
    if entry != "/etc/passwd":
        assert len(list(iter_index(index, trusted=True))) == 3


# -- 5. the server: memory grows with what arrives, threads with a cap ----------------------

def _server_status(pid):
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])  # kB


def test_idle_connections_cost_neither_memory_nor_threads(compiled, tmp_path):
    from test_server import start_server

    sock = str(tmp_path / "run" / "socket")
    proc = start_server(sock, compiled, "--max-connections", "8", "--timeout", "20")
    conns = []
    try:
        threads0, rss0 = _server_status(proc.pid)
        head = wire.encode_request(str(compiled), "m", None, b"x" * (64 * 1024 * 1024 - 1))[0]
        closed = 0
        for i in range(60):  # each announces a 64 MB message, then sends nothing more
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sock)
            conns.append(s)
            try:
                s.sendall(head)
            except OSError:  # over the cap: the server closed it at once
                closed += 1
        time.sleep(1.0)
        threads, rss = _server_status(proc.pid)
        assert threads <= threads0 + 8, (threads0, threads)
        assert rss - rss0 < 50 * 1024, f"the server grew by {rss - rss0} kB for idle connections"
        # deliveries meanwhile: never lost; answered by the client itself if the server is full
        raw = sample_message("spam", 0).read_bytes()
        res = filter_cmd(raw, "--model", str(compiled), "--socket", sock)
        assert res.returncode == 0 and b"X-Spam-Flag: YES" in res.stdout
    finally:
        for s in conns:
            s.close()
        proc.terminate()
        proc.wait(timeout=30)


# -- 6. sort: a mail client at work, another file system, folder names ----------------------

def _sort_setup(tmp_path):
    md = tmp_path / "Maildir"
    for sub in ("cur", "new", "tmp"):
        (md / sub).mkdir(parents=True)
    for i in range(3):
        shutil.copyfile(sample_message("spam", i), md / "new" / f"{i}.host")
    return md


@pytest.mark.parametrize("name", ["../outside", "/tmp/elsewhere", "Junk", ".", "..", ".a/b"])
def test_sort_accepts_only_maildirplus_folder_names(tmp_path, model_file, name):
    md = _sort_setup(tmp_path)
    res = subprocess.run([*SPAMNB, "sort", str(md), "--model", str(model_file), "--spam-folder", name],
                         capture_output=True, timeout=120)
    assert res.returncode == 2 and b"Maildir++ folder name" in res.stderr
    assert sorted(os.listdir(md / "new")) == ["0.host", "1.host", "2.host"]


def test_a_message_renamed_by_a_client_during_a_move_stays_in_one_place(tmp_path, monkeypatch):
    from spamnb.delivery import maildir_sort

    md = _sort_setup(tmp_path)
    source = md / "new" / "0.host"
    target = md / ".Junk" / "new" / "0.host"
    real_link = os.link

    def link_then_client_renames(src, dst):
        real_link(src, dst)
        os.rename(source, md / "cur" / "0.host:2,S")  # the client marks it seen, meanwhile

    monkeypatch.setattr(maildir_sort.os, "link", link_then_client_renames)
    with pytest.raises(maildir_sort.MoveSkipped, match="left where it is"):
        maildir_sort.move(str(source), str(target))
    assert not target.exists()  # the link was undone: one copy, the client's
    assert (md / "cur" / "0.host:2,S").exists()


def test_another_file_system_skips_the_message_and_goes_on(tmp_path, model_file, monkeypatch):
    import errno

    from spamnb.delivery import maildir_sort

    def no_cross_device_links(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    md = _sort_setup(tmp_path)
    monkeypatch.setattr(maildir_sort.os, "link", no_cross_device_links)
    with pytest.raises(maildir_sort.MoveSkipped, match="another file system"):
        maildir_sort.move(str(md / "new" / "0.host"), str(md / ".Junk" / "new" / "0.host"))
    from click.testing import CliRunner
    from spamnb.cli import main

    res = CliRunner().invoke(main, ["sort", str(md), "--model", str(model_file)])
    assert res.exit_code == 0, res.output
    assert res.stderr.count("another file system") == 3 and "skipped 3" in res.stderr
    assert sorted(os.listdir(md / "new")) == ["0.host", "1.host", "2.host"]


# == issue "Hardening, round three" ==========================================================

# -- 1. background compaction takes no module from the working folder -----------------------

PLANTED = "import pathlib, sys\npathlib.Path({marker!r}).write_text(' '.join(sys.argv))\n"


@pytest.mark.parametrize("planted", ["spamnb.py", "spamnb/__main__.py", "spamnb/__init__.py"])
def test_background_compaction_runs_no_module_planted_in_the_working_folder(
        sticky_dir, compiled, tmp_path, monkeypatch, planted):
    marker = tmp_path / "planted-code-ran"
    target = sticky_dir / planted
    target.parent.mkdir(exist_ok=True)
    target.write_text(PLANTED.format(marker=str(marker)))
    if planted == "spamnb/__main__.py":
        (sticky_dir / "spamnb" / "__init__.py").write_text("")
    monkeypatch.chdir(sticky_dir)  # the delivery's folder: a shared one
    monkeypatch.setenv("PYTHONPATH", str(sticky_dir))  # nor from the environment
    proc = fastfilter.compact_in_background(os.path.relpath(compiled, sticky_dir))
    assert proc.wait(timeout=120) == 0
    assert not marker.exists(), marker.read_text()
    assert str(sticky_dir) not in fastfilter.safe_import_path()



# -- 2. spamd's TELL: who may teach which model ------------------------------------------------

CONTRIB = Path(__file__).resolve().parent.parent / "contrib" / "systemd"


def unit_settings(path):
    """``{key: [values]}`` of a unit file's lines (comments and sections dropped)."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_no_shipped_unit_enables_tell():
    units = sorted(CONTRIB.glob("*/*.service"))
    assert units
    for unit in units:
        for line in unit_settings(unit).get("ExecStart", []):
            assert "--allow-tell" not in line, unit


def _spamd_served(model, **kw):
    from test_spamd import Served

    return Served(model, **kw)


def test_tell_without_user_never_teaches_the_served_model_unless_allowed(compiled):
    from test_spamd import request, split_reply

    raw = sample_message("ham", 7).read_bytes().replace(b"Subject:", b"Subject: taught", 1)
    s = _spamd_served(compiled, allow_tell=True, tell_served=False)
    try:
        out = s.ask(request("TELL", raw, Message_class="spam", Set="local"))
        assert out.startswith(b"SPAMD/1.0 69 ") and b"--allow-tell-served" in out
        assert load_model(compiled).known(message_key(raw), raw) is None
    finally:
        s.stop()
    s = _spamd_served(compiled, allow_tell=True, tell_served=True)
    try:
        assert split_reply(s.ask(request("TELL", raw, Message_class="spam", Set="local")))[1] == {
            b"DidSet": b"local"}
        assert load_model(compiled).known(message_key(raw), raw) == 1
    finally:
        s.stop()


def test_serve_allow_tell_served_is_its_own_option():
    res = subprocess.run([*SPAMNB, "serve", "--help"], capture_output=True, timeout=60)
    assert b"--allow-tell-served" in res.stdout


def message_key(raw):
    from spamnb.mail.identity import message_key as key

    return key(raw)


def ask_as(user, sock_path, data: bytes) -> bytes:
    """``data`` sent to the Unix socket by a process running as ``user``; its reply."""
    def ask():
        out = b""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(str(sock_path))
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                out += chunk
        return out

    return forked_as(user, ask)


def forked_as(user, fn) -> bytes:
    """``fn()`` (bytes) in a forked process turned into ``user``; what it returned, or
    ``b"error: ..."`` for what it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            try:
                out = fn()
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                out = f"error: {type(exc).__name__}: {exc}".encode()
            os.write(w, out)
        finally:
            os._exit(0)
    os.close(w)
    out = b""
    while chunk := os.read(r, 65536):
        out += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return out


@pytest.fixture
def unix_spamd(compiled, tmp_path, sticky_dir, trained_model):
    """A spamd Unix socket everyone may connect to, with --allow-tell and per-user
    models for "bob" and for the throwaway user."""
    from spamnb.delivery import spamd, usermodels
    from spamnb.delivery.server import Compactor
    from spamnb.storage.filestore import FileBackend

    users = tmp_path / "users"
    for name in ("bob", MALLORY):
        save_model(trained_model, users / name / "model.joblib")
    log = []
    backend = FileBackend(str(compiled), log=log.append).resident()
    models = usermodels.Models(backend, str(users), log.append)
    sock = sticky_dir / "spamd.sock"
    srv = spamd.UnixServer(str(sock), 0o666)
    srv.configure(models, max_bytes=1 << 20, timeout=10, allow_tell=True, log=log.append,
                  compactor=Compactor(log.append), max_connections=4)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield sock, users, log
    srv.shutdown()
    srv.close()


def test_tell_on_a_unix_socket_is_for_the_peers_own_user(mallory, unix_spamd, tmp_path):
    from test_spamd import request

    sock, users, log = unix_spamd
    raw = sample_message("ham", 8).read_bytes().replace(b"Subject:", b"Subject: peer", 1)
    out = ask_as(mallory, sock, request("TELL", raw, User="bob", Message_class="spam", Set="local"))
    assert out.startswith(b"SPAMD/1.0 77 ") and b"another user" in out, out
    assert load_model(users / "bob" / "model.joblib").known(message_key(raw), raw) is None
    out = ask_as(mallory, sock, request("TELL", raw, Message_class="spam", Set="local"))  # no User:
    assert out.startswith(b"SPAMD/1.0 69 ")
    out = ask_as(mallory, sock, request("TELL", raw, User=MALLORY, Message_class="spam", Set="local"))
    assert b"DidSet: local" in out, out  # their own model: fine
    assert load_model(users / MALLORY / "model.joblib").known(message_key(raw), raw) == 1
    root = pwd.getpwuid(0)
    out = ask_as(root, sock, request("TELL", raw, User="bob", Message_class="spam", Set="local"))
    assert b"DidSet: local" in out, out  # root (an MTA, the admin) may name anyone
    assert str(tmp_path).encode() not in out


def test_a_local_user_may_name_only_itself_whatever_the_method(mallory, unix_spamd):
    """``spamc -u victim -R`` lists the victim's tokens and scores the message as theirs (recorded
    as theirs in the history): from this machine, only one's own user may be named, whatever the
    method; root may name anyone."""
    from test_spamd import request

    sock, users, log = unix_spamd
    raw = sample_message("spam", 3).read_bytes()
    for method in ("REPORT", "SYMBOLS", "CHECK", "PROCESS", "HEADERS", "REPORT_IFSPAM"):
        out = ask_as(mallory, sock, request(method, raw, User="bob"))
        assert out.startswith(b"SPAMD/1.0 77 ") and b"another user" in out, (method, out)
        assert f"{method} for user 'bob' refused".encode() in out, out
    assert ask_as(mallory, sock, request("CHECK", raw, User=MALLORY)).startswith(b"SPAMD/1.1 0 EX_OK")
    assert ask_as(mallory, sock, request("CHECK", raw)).startswith(b"SPAMD/1.1 0 EX_OK")
    assert ask_as(pwd.getpwuid(0), sock, request("REPORT", raw, User="bob")).startswith(b"SPAMD/1.1 0 EX_OK")


def test_over_tcp_from_this_machine_a_user_names_another_only_when_the_admin_trusts_it(mallory, compiled, tmp_path,
                                                                                     trained_model):
    """The same over TCP from this machine (its user from the socket table); a user the admin
    names (``--spamd-trusted-user``: the MTA's) may name anyone."""
    import dataclasses

    from test_spamd import request

    users = tmp_path / "users"
    save_model(trained_model, users / "bob" / "model.joblib")
    raw = sample_message("spam", 3).read_bytes()
    s = _spamd_served(compiled, user_models=str(users))

    def ask(data):
        def go():
            with socket.create_connection(("127.0.0.1", s.port), timeout=30) as c:
                c.sendall(data)
                c.shutdown(socket.SHUT_WR)
                out = b""
                while chunk := c.recv(65536):
                    out += chunk
                return out
        return forked_as(mallory, go)

    try:
        out = ask(request("SYMBOLS", raw, User="bob"))
        assert out.startswith(b"SPAMD/1.0 77 ") and f"uid {mallory.pw_uid}".encode() in out, out
        s.srv.rules = dataclasses.replace(s.srv.rules, trusted=(MALLORY,))
        assert ask(request("SYMBOLS", raw, User="bob")).startswith(b"SPAMD/1.1 0 EX_OK")
    finally:
        s.stop()


class _Held:
    """``n`` connections held open by a forked process running as ``user`` (each made by
    ``connect()`` and sent ``first``), until :meth:`close` or 60 seconds."""

    def __init__(self, user, connect, n, first=b""):
        ready_r, ready_w = os.pipe()
        self._stop_r, self._stop_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            try:
                os.close(ready_r)
                os.close(self._stop_w)
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
                held = []
                for _ in range(n):
                    try:
                        c = connect()
                        c.sendall(first)
                        held.append(c)
                    except OSError:
                        pass
                    time.sleep(0.02)  # each accepted in turn
                os.write(ready_w, str(len(held)).encode())
                os.close(ready_w)
                import select

                select.select([self._stop_r], [], [], 60)
            finally:
                os._exit(0)
        os.close(ready_w)
        os.close(self._stop_r)
        self.count = int(os.read(ready_r, 100) or 0)
        os.close(ready_r)

    def close(self):
        os.close(self._stop_w)
        os.waitpid(self.pid, 0)


@pytest.mark.parametrize("where", ["tcp", "unix"])
def test_one_users_idle_flood_leaves_another_users_spamc_served(mallory, unix_spamd, compiled, where):
    """Another user holds idle connections to a spamd listener (far more than its cap): one
    user holds at most half its slots and half its waiting places, so this user's CHECK is
    still scanned at once."""
    from test_spamd import request

    raw = sample_message("spam", 0).read_bytes()
    if where == "tcp":
        s = _spamd_served(compiled, max_connections=4, timeout=20.0)
        srv, target = s.srv, ("127.0.0.1", s.port)
        connect = lambda: socket.create_connection(target, timeout=5)  # noqa: E731
    else:
        sock, users, log = unix_spamd
        s, srv = None, None

        def connect():
            c = socket.socket(socket.AF_UNIX)
            c.settimeout(5)
            c.connect(str(sock))
            return c
    held = _Held(mallory, connect, 30, b"CHECK SPAMC/1.5\r\n")
    try:
        assert held.count >= 4
        start = time.monotonic()
        if where == "tcp":
            out = s.ask(request("CHECK", raw), timeout=30)
        else:
            out = ask_as(pwd.getpwuid(0), sock, request("CHECK", raw))
        assert out.startswith(b"SPAMD/1.1 0 EX_OK") and b"Spam: True" in out, out
        assert time.monotonic() - start < 1.5, "served only after the wait for a slot"
        if srv is not None:
            assert max(srv._counts(("uid", mallory.pw_uid))) <= srv.share == 2
    finally:
        held.close()
        if s is not None:
            s.stop()


def test_another_users_flood_never_closes_the_page_owners_connection(mallory, compiled, tmp_path):
    """At the page's bound a new connection closes the oldest one not yet past the key: another
    user's flood closes its own, never the owner's, whose request is on its way."""
    from test_fastpath import messages
    from webpage import WebHere, fill

    hist = tmp_path / "h.sqlite"
    fill(hist, messages()[:2], unsure={0})
    web = WebHere(compiled, hist)
    srv = web.server
    srv.max_connections, srv.share = 6, 3
    host, port = srv.server_address[:2]
    owner = socket.create_connection((host, port), timeout=20)
    held = None
    try:
        deadline = time.monotonic() + 10
        while not srv.open:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        held = _Held(mallory, lambda: socket.create_connection((host, port), timeout=5), 4 * srv.max_connections,
                     b"GET / HTTP/1.1\r\n")
        owner.sendall(f"GET {srv.root}/unsure HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answer = owner.recv(1000)
        assert answer.startswith(b"HTTP/1.0 200"), answer
        assert sum(1 for who in srv.holders.values() if who == ("uid", mallory.pw_uid)) <= srv.share
    finally:
        owner.close()
        if held is not None:
            held.close()
        web.stop()


def test_spamd_replies_never_name_a_server_path(compiled, tmp_path, trained_model):
    from test_spamd import request

    users = tmp_path / "users"
    save_model(trained_model, users / "alice" / "model.joblib")
    raw = sample_message("spam", 0).read_bytes()
    s = _spamd_served(compiled, user_models=str(users))
    try:
        out = s.ask(request("TELL", raw, User="bob", Message_class="spam", Set="local"))
        assert out.startswith(b"SPAMD/1.0 67 ") and b"bob" in out
        compiled.parent.chmod(0o770)  # the model turns untrusted
        (users / "alice").chmod(0o770)
        for req in (request("CHECK", raw), request("CHECK", raw, User="alice"),
                    request("TELL", raw, User="alice", Message_class="spam", Set="local")):
            out = s.ask(req)
            assert out.startswith(b"SPAMD/1.0 74 "), out
            assert b"/" not in out.split(b"\r\n")[0].split(b" ", 2)[2], out
        assert any(str(compiled.parent) in line for line in s.log_lines)  # the admin's log has it
    finally:
        compiled.parent.chmod(0o700)
        (users / "alice").chmod(0o700)
        s.stop()


# -- 3. the IMAP state and its lock are trusted as the model is ------------------------------

def _imap_args(tmp_path, model, host="127.0.0.1", port=9, user="alice", password="secret"):
    pw = tmp_path / "imap-pw"
    pw.write_text(password + "\n")
    pw.chmod(0o600)
    return ["imap", "filter", "--host", host, "--port", str(port), "--user", user, "--password-file", str(pw),
            "--security", "none", "--model", str(model)]


def test_an_imap_state_another_user_planted_is_refused(mallory, sticky_dir, model_file):
    import json

    from spamnb.delivery import imap

    model = sticky_dir / "model.joblib"
    shutil.copyfile(model_file, model)
    model.chmod(0o600)
    state = imap.state_path(model)
    planted = {"version": imap.STATE_VERSION, "accounts": {}}
    as_user(mallory, "sh", "-c", f"umask 022; printf '%s' '{json.dumps(planted)}' > {state}")
    with pytest.raises(imap.ImapError, match=f"owned by uid {mallory.pw_uid}.*decides which messages"):
        imap.State.load(state)
    os.chown(state, 0, 0)
    os.chmod(state, 0o666)
    with pytest.raises(imap.ImapError, match="writable by group or others"):
        imap.State.load(state)
    os.chmod(state, 0o600)
    assert imap.State.load(state).data == planted  # ours (root's): read


def test_another_users_imap_lock_is_refused(mallory, sticky_dir, model_file, tmp_path):
    from click.testing import CliRunner

    from spamnb.cli import main
    from spamnb.delivery import imap

    model = sticky_dir / "model.joblib"
    shutil.copyfile(model_file, model)
    model.chmod(0o600)
    as_user(mallory, "sh", "-c", f"umask 0; : > {imap.state_path(model)}.lock")
    res = CliRunner().invoke(main, _imap_args(tmp_path, model))
    assert res.exit_code == 1 and f"belongs to uid {mallory.pw_uid}" in res.stderr, res.stderr


def test_a_failed_state_save_is_reported_as_one(dovecot, model_file, tmp_path, monkeypatch):
    import errno

    from click.testing import CliRunner

    from spamnb.cli import main
    from spamnb.storage import store

    def disk_full(path, parts):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(store, "write_bytes_atomic", disk_full)
    d = dovecot
    res = CliRunner().invoke(main, _imap_args(tmp_path, model_file, d.host, d.port, d.user, d.password))
    assert res.exit_code == 1, res.output
    assert "cannot save the IMAP state" in res.stderr and "No space left" in res.stderr, res.stderr
    assert "connection" not in res.stderr


# -- 5. folders made for the IMAP state are private whatever the umask ------------------------

def test_imap_filter_makes_private_folders_under_umask_002(tmp_path):
    target = tmp_path / "data" / "new" / "model.joblib"
    subprocess.run([*SPAMNB, *_imap_args(tmp_path, target)], capture_output=True, timeout=120,
                   preexec_fn=lambda: os.umask(0o002))
    for folder in (tmp_path / "data", target.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


# -- 4. a site model's journal and scorer are readable by whoever may read the model ------------

def run_as(user, fn):
    """``repr(fn())`` in a forked process turned into ``user`` (``"error: ..."`` if it raised).

    The child, as ``user``, may not read this interpreter's standard library (under
    /root, 0700, on the test machines), so what the code imports lazily (sqlite3 for the
    history) is imported here first, as the user's own interpreter would import it.
    """
    import sqlite3  # noqa: F401

    return forked_as(user, lambda: repr(fn()).encode()).decode()


def test_a_site_models_journal_is_readable_by_every_user(mallory, compiled):
    from spamnb.storage import journal, scorer
    from spamnb.storage.modelfile import learn_messages

    site = Path(tempfile.mkdtemp(prefix="spamnb-site-", dir="/tmp"))
    try:
        site.chmod(0o755)
        model = site / "model.joblib"
        shutil.copyfile(compiled, model)
        model.chmod(0o644)  # root's site model: trusted by every user
        save_model(load_model(model), model)  # its scorer, as root compiles it
        learn_messages(model, [(sample_message("ham", 3).read_bytes(), "spam")])  # root learns one
        for companion in (journal.journal_path(model), scorer.scorer_path(model)):
            assert stat.S_IMODE(os.stat(companion).st_mode) == 0o644, companion
        raw = sample_message("spam", 0).read_bytes()
        opts = fastfilter.parse_args(["--model", str(model)])
        got = run_as(mallory, lambda: fastfilter.cold(raw, str(model), False, opts)[1])
        assert got == "'spam'", got
        got = run_as(mallory, lambda: len(journal.read(model, *_base(model))))
        assert got == "1", got
        # a private model's stay private
        model.chmod(0o600)
        learn_messages(model, [(sample_message("ham", 4).read_bytes(), "spam")], timeout=10)
        from spamnb.storage.modelfile import compact

        compact(model, force=True)
        assert stat.S_IMODE(os.stat(journal.journal_path(model)).st_mode) == 0o600
    finally:
        shutil.rmtree(site, ignore_errors=True)


def _base(path):
    from spamnb.storage.modelfile import load_snapshot

    stats = load_snapshot(path).stats
    return stats.get("save_id"), stats.get("journal")


# -- 6. spamd: a declared length over the cap is refused before a byte of it is read ------------

def test_spamd_refuses_a_declared_length_over_its_cap_at_once(compiled):
    from spamnb.delivery import spamd
    from test_spamd import Served

    assert spamd.SPAMD_MAX_BYTES >= 500 * 1024  # never below spamc's own default (-s)
    s = Served(compiled, max_bytes=2000, spamd_max_bytes=100_000)
    try:
        start = time.monotonic()
        for method in ("PROCESS", "CHECK", "TELL"):
            with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
                c.sendall(f"{method} SPAMC/1.5\r\nContent-length: 999999999999\r\n\r\nSubject: x\r\n\r\n".encode())
                out = c.recv(4096)  # answered while the client has sent almost nothing
            assert out.startswith(b"SPAMD/1.0 65 ") and b"not scanned" in out, out
        assert time.monotonic() - start < 5
        # no Content-length: read up to the cap, then refused
        big = b"Subject: big\r\n\r\n" + b"x" * 200_000
        out = s.ask(b"PROCESS SPAMC/1.5\r\n\r\n" + big)
        assert out.startswith(b"SPAMD/1.0 65 "), out[:100]
        # under the cap and over max_bytes: unscanned, returned whole, as before
        mid = b"Subject: mid\r\n\r\n" + b"y" * 50_000
        assert s.ask(b"PROCESS SPAMC/1.5\r\n\r\n" + mid).endswith(b"\r\n\r\n" + mid)
    finally:
        s.stop()


def test_spamc_passes_a_message_over_the_cap_through(compiled):
    from test_spamd import SPAMC, Served, spamc

    if SPAMC is None:
        pytest.skip("spamc is not installed (apt-get install spamc)")
    s = Served(compiled, spamd_max_bytes=100_000)
    try:
        raw = sample_message("spam", 0).read_bytes() + b"\n" + b"padding line\n" * 30_000
        r = spamc(s.port, "-s", "10000000", raw=raw)
        assert r.returncode == 0 and r.stdout == raw
    finally:
        s.stop()


def test_serve_has_a_spamd_cap_option():
    res = subprocess.run([*SPAMNB, "serve", "--help"], capture_output=True, timeout=60)
    assert b"--spamd-max-bytes" in res.stdout


# -- 7. a hostile IMAP server --------------------------------------------------------------------

class HostileImap:
    """An IMAP server on 127.0.0.1 that speaks just enough for a pass, then misbehaves:
    ``select_without_uidvalidity``, or a body ``literal`` of that many bytes (declared;
    a few are sent) under an RFC822.SIZE of 100. ``logins`` keeps what each login sent."""

    def __init__(self, *, select_without_uidvalidity=False, literal=None):
        self.no_uv = select_without_uidvalidity
        self.literal = literal
        self.logins = []
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self):
        self.srv.close()

    def _serve(self):
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn):
        f = conn.makefile("rwb", buffering=0)
        say = lambda text: f.write(text.encode() + b"\r\n")  # noqa: E731
        caps = "IMAP4rev1 AUTH=PLAIN MOVE UIDPLUS"
        try:
            say(f"* OK [CAPABILITY {caps}] hostile ready")
            while line := f.readline():
                tag, _, rest = line.decode("utf-8", "replace").rstrip("\r\n").partition(" ")
                words = rest.upper().split()
                cmd = " ".join(words[:2]) if words[:1] == ["UID"] else (words[:1] or [""])[0]
                if cmd == "CAPABILITY":
                    say(f"* CAPABILITY {caps}")
                elif cmd == "LOGIN":
                    self.logins.append(rest)
                elif cmd == "AUTHENTICATE":
                    say("+ ")
                    self.logins.append(f.readline())
                    say(f"{tag} NO [AUTHENTICATIONFAILED] no")
                    continue
                elif cmd == "LIST":
                    say('* LIST () "/" Junk')
                    say('* LIST () "/" INBOX')
                elif cmd in ("SELECT", "EXAMINE"):
                    say("* 1 EXISTS")
                    say("* FLAGS (\\Seen)")
                    if not self.no_uv:
                        say("* OK [UIDVALIDITY 7] ok")
                    say(f"{tag} OK [READ-WRITE] selected")
                    continue
                elif cmd == "UID SEARCH":
                    say("* SEARCH 1")
                elif cmd == "UID FETCH" and "BODY.PEEK[]" in rest.upper():
                    f.write(b"* 1 FETCH (UID 1 BODY[] {%d}\r\nSubject: x\r\n\r\n" % self.literal)
                    time.sleep(30)  # never the rest: a client that waits for it hangs
                    return
                elif cmd == "UID FETCH":
                    say("* 1 FETCH (UID 1 RFC822.SIZE 100 FLAGS ())")
                elif cmd == "LOGOUT":
                    say("* BYE bye")
                    say(f"{tag} OK bye")
                    return
                say(f"{tag} OK done")
        except OSError:
            pass
        finally:
            conn.close()


@pytest.fixture
def hostile_imap():
    servers = []

    def make(**kw):
        servers.append(HostileImap(**kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def _imap_run(tmp_path, model, server, *extra, password="secret"):
    from click.testing import CliRunner

    from spamnb.cli import main

    args = _imap_args(tmp_path, model, "127.0.0.1", server.port, password=password)
    return CliRunner().invoke(main, [*args, "--junk", "Junk", *extra])


@pytest.mark.parametrize("size", [100_000_000_000, 2_000_000_000])
def test_a_huge_literal_is_refused_before_it_is_read(hostile_imap, model_file, tmp_path, size):
    import resource

    server = hostile_imap(literal=size)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    res = _imap_run(tmp_path, model_file, server)
    assert time.monotonic() - start < 20
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exception
    assert f"literal of {size} bytes" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024


def test_a_select_without_uidvalidity_is_one_line_and_watch_goes_on(hostile_imap, model_file, tmp_path):
    server = hostile_imap(select_without_uidvalidity=True)
    res = _imap_run(tmp_path, model_file, server)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exception
    assert "without a valid UIDVALIDITY" in res.stderr and "Traceback" not in res.stderr
    args = _imap_args(tmp_path, model_file, "127.0.0.1", server.port)
    proc = subprocess.Popen([*SPAMNB, *args, "--junk", "Junk", "--watch", "--interval", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(6)
        assert proc.poll() is None  # still watching
    finally:
        proc.terminate()
        err = proc.communicate(timeout=30)[1].decode()
    assert err.count("without a valid UIDVALIDITY") >= 2 and "Traceback" not in err, err


def test_a_non_ascii_password_is_sent_as_utf8_and_never_shown(hostile_imap, model_file, tmp_path):
    import base64

    server = hostile_imap()
    secret = "pässwörd-ß"
    res = _imap_run(tmp_path, model_file, server, password=secret)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exception
    assert "login to" in res.stderr and "failed" in res.stderr
    assert not set(res.stderr) & set("äöß") and "position" not in res.stderr, res.stderr
    sent = base64.b64decode(server.logins[-1].strip()).decode("utf-8")
    assert sent.split("\0")[2] == secret  # AUTHENTICATE PLAIN, in UTF-8


def test_a_password_file_others_can_read_is_refused(hostile_imap, model_file, tmp_path):
    server = hostile_imap()
    args = _imap_args(tmp_path, model_file, "127.0.0.1", server.port)
    (tmp_path / "imap-pw").chmod(0o644)
    from click.testing import CliRunner

    from spamnb.cli import main

    res = CliRunner().invoke(main, [*args, "--junk", "Junk"])
    assert res.exit_code == 1 and "password file" in res.stderr and "chmod 600" in res.stderr, res.stderr
    assert server.logins == []  # nothing was sent


# -- 8. a crafted journal frame ends the journal, as a bad digest does -------------------------

def _crafted(rec, how):
    """The body of one frame holding ``rec`` changed as ``how`` says (digest made to match)."""
    import struct

    if how == "messages":
        rec.d_messages = (-1e9, 0.0)
    elif how == "counts":
        rec.d_ham[0] = 1e300
    elif how == "nan":
        rec.d_spam[0] = float("nan")
    elif how == "df":
        rec.d_df[0] = 7
    elif how == "class":
        rec.new = 5
    elif how == "split":  # lengths 2, 1 -> 1, 2: the blob is UTF-8, the first token is not
        rec.tokens[:2] = ["\u00e9", "x"]
    payload = rec.encode()
    if how == "split":
        at = 8 + 16 + 1 + 1 + 4 + 4 + 32 + len(rec.hashes) * (8 + 8 + 8 + 1)  # the token lengths
        payload = payload[:at] + struct.pack("<II", 1, 2) + payload[at + 8:]
    if how == "utf8":
        payload = payload[:-1] + b"\xff"  # the last token's last byte: not UTF-8
    n = 5 if how == "count" else 1
    return struct.pack("<I", n) + struct.pack("<I", len(payload)) + payload


@pytest.mark.parametrize("how", ["count", "utf8", "split", "messages", "counts", "nan", "df", "class"])
def test_a_crafted_journal_frame_is_the_journals_end(compiled, how):
    import struct

    from spamnb.storage import journal
    from spamnb.storage.modelfile import compact

    msgs = [sample_message("spam", i).read_bytes() for i in (1, 2)]
    journal.update(compiled, [(msgs[0], "ham", None)])
    reference = load_model(compiled)
    jpath = journal.journal_path(compiled)
    rec = next(iter(journal.read(compiled, *_base(compiled)).records(texts=True)))
    body = _crafted(rec, how)
    with open(jpath, "ab") as f:
        f.write(struct.pack("<cI", b"R", len(body)) + body + _blake(body))
    after = load_model(compiled)  # the crafted frame is not read as counts
    assert after.registry == reference.registry
    assert np.array_equal(after.estimator.class_count_, reference.estimator.class_count_)
    raw = sample_message("spam", 0).read_bytes()
    res = filter_cmd(raw, "--model", str(compiled))
    assert res.returncode in (0, 1, 2), res.stderr  # filtered, not passed through unfiltered
    assert res.stdout.endswith(raw.split(b"\n\n", 1)[1])  # the body as it came
    res = subprocess.run([*SPAMNB, "learn", "--spam", "--model", str(compiled), "-"], input=msgs[1],
                         capture_output=True, timeout=120)
    assert res.returncode == 0 and b"Traceback" not in res.stderr, res.stderr
    assert b"damaged tail" in res.stderr  # the writer reports it and cuts it off
    assert compact(compiled, force=True) == 2
    model = load_model(compiled)
    assert np.isfinite(model.estimator.feature_count_.data if hasattr(model.estimator.feature_count_, "data")
                       else model.estimator.feature_count_).all()
    assert model.estimator.class_count_.sum() == reference.estimator.class_count_.sum() + 1


def _blake(body):
    from hashlib import blake2b

    return blake2b(body, digest_size=16).digest()


# -- 9. companions another user planted beside a model in a sticky folder -------------------------

@pytest.fixture
def shared_model(sticky_dir, compiled):
    """Our model (with its scorer) in a sticky shared folder such as /tmp."""
    model = sticky_dir / "model.joblib"
    save_model(load_model(compiled), model)
    return model


def test_a_planted_journal_is_ignored_by_readers_and_refused_by_writers(mallory, shared_model):
    from spamnb.storage import journal

    jpath = journal.journal_path(shared_model)
    as_user(mallory, "sh", "-c", f"umask 022; printf 'SPNBJRN1 anything' > {jpath}")
    raw = sample_message("spam", 0).read_bytes()
    res = filter_cmd(raw, "--model", str(shared_model))
    assert res.returncode == 0 and b"X-Spam-Flag: YES" in res.stdout, res.stderr  # filtered, not exit 3
    assert f"ignoring the journal {jpath} belongs to uid {mallory.pw_uid}".encode() in res.stderr
    assert b"runs code" not in res.stderr
    res = subprocess.run([*SPAMNB, "learn", "--spam", "--model", str(shared_model), str(sample_message("ham", 1))],
                         capture_output=True, timeout=120)
    assert res.returncode == 1 and b"Traceback" not in res.stderr, res.stderr
    assert f"belongs to uid {mallory.pw_uid}".encode() in res.stderr and b"remove it" in res.stderr
    assert b"runs code" not in res.stderr


def test_a_planted_compaction_lock_is_reported_not_silent(mallory, shared_model, monkeypatch):
    from spamnb.storage import journal
    from spamnb.storage.modelfile import compact
    from spamnb.storage.store import ModelError

    lock = f"{shared_model}.compact.lock"
    as_user(mallory, "sh", "-c", f"umask 0; : > {lock}")
    monkeypatch.setattr(journal, "MAX_BYTES", 1)
    warnings = []
    done = journal.update(shared_model, [(sample_message("ham", 2).read_bytes(), "spam", None)],
                          warn=warnings.append)
    assert done["needs_compaction"]
    assert any(f"compaction's lock {lock} belongs to uid {mallory.pw_uid}" in w for w in warnings), warnings
    with pytest.raises(ModelError, match=f"belongs to uid {mallory.pw_uid}"):
        compact(shared_model, force=True)
    res = subprocess.run([*SPAMNB, "compact", "--model", str(shared_model)], capture_output=True, timeout=120)
    assert res.returncode == 1 and b"belongs to uid" in res.stderr, res.stderr


# -- 10. the history's -wal and -shm files, which SQLite reads as part of the database ------------


def _history_in(folder):
    """Our history (one verdict recorded) in ``folder``, made while only we could write there."""
    from spamnb.storage import history

    mode = stat.S_IMODE(os.stat(folder).st_mode)
    os.chmod(folder, 0o755)
    path = folder / "h.sqlite"
    db = history.open_db(path)
    history.write(db, [history.row(sample_message("ham", 0).read_bytes(), "ham", -3.0, 0.01, via="filter")])
    db.close()
    os.chmod(folder, mode)
    return path


def _rows(path):
    import sqlite3

    db = sqlite3.connect(path)
    try:
        return [r[0] for r in db.execute("SELECT subject FROM verdicts ORDER BY id")]
    finally:
        db.close()


def _forge_wal(target):
    """As the other user: a history of her own with a forged row, its WAL copied to ``target``."""
    import sqlite3

    from spamnb.storage import history

    own = str(target) + ".mine"
    db = sqlite3.connect(own, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA wal_autocheckpoint = 0")
    db.executescript(history.SCHEMA + "PRAGMA user_version = 1;")
    db.execute("INSERT INTO verdicts (t, verdict, subject) VALUES (?, 'ham', 'forged by mallory')", (time.time(),))
    with open(own + "-wal", "rb") as f:
        wal = f.read()
    db.close()
    with open(target, "wb") as f:
        f.write(wal)
    os.chmod(target, 0o666)
    return b"planted"


@pytest.mark.parametrize("shared", ["sticky", "group-writable"])
def test_a_wal_planted_beside_the_history_neither_receives_mail_nor_forges_rows(mallory, sticky_dir, shared,
                                                                                  compiled, tmp_path):
    from spamnb.storage import history

    folder = sticky_dir
    if shared == "group-writable":  # not sticky: her group may write there
        folder = sticky_dir / "group"
        folder.mkdir()
        os.chown(folder, 0, mallory.pw_gid)
        folder.chmod(0o770)
    path = _history_in(folder)
    wal = Path(str(path) + "-wal")
    assert forked_as(mallory, lambda: _forge_wal(wal)) == b"planted"
    copy = tmp_path / "copy.sqlite"  # what SQLite alone reads from them: the attack is real
    shutil.copyfile(path, copy)
    shutil.copyfile(wal, str(copy) + "-wal")
    assert "forged by mallory" in _rows(copy)
    for readonly in (False, True):
        with pytest.raises(history.HistoryError, match="may be written by others.*-wal or -shm"):
            history.open_db(path, readonly=readonly)
    # the planted WAL made world-writable and empty: it would receive every record
    wal.unlink()
    assert forked_as(mallory, lambda: (wal.touch(), wal.chmod(0o666), b"empty")[-1]) == b"empty"
    raw = sample_message("spam", 0).read_bytes()
    res = subprocess.run([*SPAMNB, "filter", "--model", str(compiled), "--history", str(path)], input=raw,
                         capture_output=True, timeout=120, env={**os.environ, "SPAMNB_SOCKET": "/nonexistent/s"})
    assert res.returncode in (0, 1, 2) and b"X-Spam-Status" in res.stdout
    assert res.stderr.count(b"\n") == 1 and b"history not recorded" in res.stderr, res.stderr
    assert wal.stat().st_size == 0  # not a byte of the mail


def test_a_wal_another_user_left_in_our_folder_is_refused(mallory, sticky_dir):
    """A folder that was shared once, closed since: what was planted then is refused."""
    from spamnb.storage import history

    folder = sticky_dir / "h"
    folder.mkdir()
    folder.chmod(0o1777)
    path = _history_in(folder)
    wal = Path(str(path) + "-wal")
    assert forked_as(mallory, lambda: _forge_wal(wal)) == b"planted"
    os.chmod(wal, 0o600)  # hers, private to her
    folder.chmod(0o700)  # ours alone again
    for readonly in (False, True):
        with pytest.raises(history.HistoryError, match=f"history file {wal} belongs to uid {mallory.pw_uid}"):
            history.open_db(path, readonly=readonly)
    wal.unlink()
    assert _rows(path) == [history.fields(sample_message("ham", 0).read_bytes())["subject"]]
    history.open_db(path).close()


# -- the systemd units: sandboxed, and still able to do their work --------------------------------

SYSTEM_UNITS = sorted((CONTRIB / "system").glob("*.service"))
USER_UNITS = sorted((CONTRIB / "user").glob("*.service"))
#: The exposure `systemd-analyze security --offline=yes` gives each unit at most (before
#: the sandbox: spamd 5.9, spamnb@ 8.1, the user units 9.6).
EXPOSURE = {"spamnb-spamd.service": 2.0, "spamnb-milter.service": 2.0, "spamnb@.service": 3.5, "spamnb.service": 6.5,
            "spamnb-imap.service": 6.5, "spamnb-learn-moves.service": 6.5, "spamnb-learn-queue.service": 6.5}


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("unit", SYSTEM_UNITS + USER_UNITS, ids=lambda p: p.name)
def test_each_unit_is_sandboxed(unit, tmp_path):
    import re

    args = ["systemd-analyze", "security", "--offline=yes", unit.name]
    env = dict(os.environ)
    if unit.parent.name == "user":
        args.insert(1, "--user")
        env["XDG_RUNTIME_DIR"] = str(tmp_path)
    res = subprocess.run(args, cwd=unit.parent, capture_output=True, text=True, timeout=120, env=env)
    level = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", res.stdout).group(1))
    assert level <= EXPOSURE[unit.name], res.stdout[-3000:]


def _under(path, roots):
    return any(os.path.commonpath([path, r]) == r for r in roots)


def _needs(unit, user="alice"):
    """``(writes, binds_low_port, tcp)``: the folders the unit's command writes in (its
    models, their journals and locks, its sockets), expanded for instance ``user``."""
    import shlex

    from spamnb.storage import locate

    argv = shlex.split(unit_settings(unit)["ExecStart"][0].replace("%i", user))
    opts = {}
    for flag, value in zip(argv, argv[1:]):
        if flag.startswith("--"):
            opts.setdefault(flag, []).append(value)
    # a unit names no --model: where the model is comes from the configuration, else the
    # default search in the home of the unit's user (the system user's: /var/lib/spamnb)
    runs_as = unit_settings(unit).get("User", ["%i"])[-1]
    home = {"HOME": f"/home/{user}" if runs_as == "%i" else f"/var/lib/{runs_as}"}
    writes = [os.path.dirname(opts.get("--model", [locate.default_model_path(home)])[0])]
    if "--model" not in opts:  # the default model, built at the first start
        writes.append(os.path.dirname(locate.default_cache_path(home)))
    writes += opts.get("--user-models", [])
    writes += [os.path.dirname(p) for p in opts.get("--socket", [])]
    writes += [os.path.dirname(a) for a in opts.get("--spamd", []) if "/" in a]
    ports = [int(a.rsplit(":", 1)[1]) for a in opts.get("--spamd", []) if "/" not in a]
    return writes, any(p < 1024 for p in ports), bool(ports)


@pytest.mark.parametrize("unit", SYSTEM_UNITS, ids=lambda p: p.name)
def test_each_system_units_sandbox_lets_it_read_learn_and_listen(unit, user="alice"):
    """The paths the command needs, against the sandbox: a unit that cannot read its
    model, write its journal or make its socket is worse than a loose one."""
    s = {k: v[-1] for k, v in unit_settings(unit).items()}
    writes, low_port, tcp = _needs(unit, user)
    writable = [p.lstrip("-").replace("%i", user) for p in s.get("ReadWritePaths", "").split()]
    writable.append("/run/" + s["RuntimeDirectory"].replace("%i", user))
    hidden = {"yes": ["/home", "/root", "/run/user"], "read-only": [], "tmpfs": ["/home", "/root", "/run/user"]}
    for path in writes:
        if s.get("ProtectSystem") == "strict":
            assert _under(path, writable), (path, writable)
        if s.get("ProtectHome") in ("yes", "tmpfs"):
            assert not _under(path, hidden[s["ProtectHome"]]), path
        if s.get("ProtectHome") == "read-only":
            assert not _under(path, ["/home", "/root", "/run/user"]) or _under(path, writable), path
    families = s.get("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6").split()
    assert "AF_UNIX" in families and (not tcp or {"AF_INET", "AF_INET6"} <= set(families))
    if low_port:
        assert "CAP_NET_BIND_SERVICE" in s.get("CapabilityBoundingSet", "")
        assert "CAP_NET_BIND_SERVICE" in s.get("AmbientCapabilities", "")
    assert s.get("PrivateUsers", "no") == "no"  # root's files would look like nobody's: refused


def test_the_sandbox_check_catches_a_unit_that_cannot_write_its_models(tmp_path):
    broken = tmp_path / "spamnb-spamd.service"
    broken.write_text((CONTRIB / "system" / "spamnb-spamd.service").read_text()
                      .replace("ReadWritePaths=/var/lib/spamnb", "ReadWritePaths=/var/lib/elsewhere"))
    with pytest.raises(AssertionError):
        test_each_system_units_sandbox_lets_it_read_learn_and_listen(broken)


# == what held in the review, kept as tests ========================================================

def test_a_compaction_killed_part_way_is_exact_and_its_leftovers_go_at_the_next(compiled):
    """kill -9 of `spamnb compact` at several moments: the model is the same after, and the
    staged files it left (a few MB each) are removed by the next compaction."""
    import signal

    from spamnb.storage import journal
    from spamnb.storage.modelfile import STALE_STAGE, compact

    msgs = [(sample_message(label, i).read_bytes(), label) for label in ("ham", "spam") for i in range(12)]
    journal.update(compiled, [(raw, "spam" if label == "ham" else "ham", None) for raw, label in msgs])
    reference = load_model(compiled)
    folder = compiled.parent
    for delay in (0.05, 0.3, 0.6, 1.0):
        proc = subprocess.Popen([*SPAMNB, "compact", "--model", str(compiled)], stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        model = load_model(compiled)
        assert model.registry == reference.registry
        assert np.array_equal(model.estimator.class_count_, reference.estimator.class_count_)
    # what a kill while staging leaves (made here, so that the test does not depend on timing)
    leftovers = [f".{compiled.name}.0123456789ab.new", f".{compiled.name}.0123456789ab.new.scorer",
                 f"..{compiled.name}.0123456789ab.new.x1y2z3.tmp"]
    keep = [f".{compiled.name}.abc.tmp", "other-file"]  # a save's temporary file, not a stage
    old = time.time() - STALE_STAGE - 60
    for name in leftovers + keep:
        (folder / name).write_bytes(b"x" * 1000)
        os.utime(folder / name, (old, old))
    fresh = folder / f".{compiled.name}.ba9876543210.new"  # a save staging right now: left alone
    fresh.write_bytes(b"y")
    journal.update(compiled, [(sample_message("ham", 20).read_bytes(), "ham", None)])
    assert compact(compiled, force=True) > 0
    names = set(os.listdir(folder))
    assert not names & set(leftovers), names
    assert set(keep) <= names and fresh.name in names


@pytest.mark.parametrize("user", ["../x", "/etc", "a\x00b", "jos\xe9", "x" * 5000, "..", "a/../b"])
def test_spamd_user_names_that_are_not_plain_are_refused(compiled, tmp_path, trained_model, user):
    from test_spamd import request

    users = tmp_path / "users"
    save_model(trained_model, users / "alice" / "model.joblib")
    s = _spamd_served(compiled, user_models=str(users))
    try:
        head = b"CHECK SPAMC/1.5\r\nUser: " + user.encode("latin-1") + b"\r\nContent-length: 2\r\n\r\nhi"
        out = s.ask(head)
        assert out.startswith(b"SPAMD/1.0 76 "), out
        assert s.ask(request("PING")) == b"SPAMD/1.5 0 PONG\r\n"
    finally:
        s.stop()


def test_spamd_content_length_lies_never_smuggle_a_second_request(served_spamd):
    s = served_spamd
    msg = b"Subject: hi\r\n\r\nhello\r\n"
    out = s.ask(b"CHECK SPAMC/1.5\r\nContent-length: %d\r\n\r\n" % len(msg) + msg + b"PING SPAMC/1.5\r\n\r\n")
    assert out.count(b"SPAMD/") == 1 and b"PONG" not in out, out  # one request per connection
    out = s.ask(b"CHECK SPAMC/1.5\r\nContent-length: %d\r\n\r\n" % (len(msg) + 10) + msg)
    assert out.startswith(b"SPAMD/1.0 76 ") and b"mismatch" in out
    out = s.ask(b"CHECK SPAMC/1.5\r\nContent-length: 5\r\nContent-length: 99999999999\r\n\r\n" + msg)
    assert out.startswith(b"SPAMD/1.0 65 ")  # the last one counts, and it is over the cap


@pytest.fixture
def served_spamd(compiled):
    s = _spamd_served(compiled, timeout=1.0, max_connections=4)
    yield s
    s.stop()


def test_spamd_allow_applies_to_ipv4_mapped_ipv6_peers(served_spamd):
    import dataclasses
    import ipaddress

    srv = served_spamd.srv
    assert srv.verify_request(None, ("::ffff:127.0.0.1", 1, 0, 0))
    assert not srv.verify_request(None, ("::ffff:192.0.2.5", 1, 0, 0))
    srv.rules = dataclasses.replace(srv.rules, networks=srv.rules.networks + (ipaddress.ip_network("192.0.2.0/24"),))
    assert srv.verify_request(None, ("::ffff:192.0.2.5", 1, 0, 0))
    assert not srv.verify_request(None, ("::ffff:198.51.100.1", 1, 0, 0))
    assert not srv.verify_request(None, ("not-an-address", 1))


def test_spamd_symbols_and_report_are_escaped(served_spamd):
    import re

    from test_spamd import request, split_reply

    raw = ("Subject: =?utf-8?b?5Lit5paH?= a,b\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
           "垃圾邮件 免费 发票 http://x.example/a,b;c?d=e\r\n\u2028 caf\u00e9 \x1b[31m\r\n").encode("utf-8")
    status, hdrs, body = split_reply(served_spamd.ask(request("SYMBOLS", raw)))
    assert body.isascii() and b"\r" not in body.rstrip(b"\r\n") and b"\n" not in body.rstrip(b"\r\n")
    for item in body.rstrip(b"\r\n").split(b","):
        assert re.fullmatch(rb"[!-~]+\([+-]\d+\.\d\d\)", item), item
    status, hdrs, body = split_reply(served_spamd.ask(request("REPORT", raw)))
    assert body.isascii() and b"\x1b" not in body
    assert all(32 <= c < 127 for line in body.split(b"\r\n") for c in line), body


@pytest.mark.slow  # 20 s: the backlog of 200 drains
def test_spamd_200_idle_connections_neither_stop_it_nor_grow_it(served_spamd, compiled):
    from test_spamd import request

    s = served_spamd
    threads0 = threading.active_count()
    idle = []
    try:
        for _ in range(200):
            idle.append(socket.create_connection(("127.0.0.1", s.port), timeout=10))
        for _ in range(6):
            time.sleep(0.5)
            # --max-connections served, as many waiting up to 2 s for a slot, and the cap's waiter
            assert threading.active_count() <= threads0 + 2 * 4 + 2
    finally:
        for c in idle:
            c.close()
    start = time.monotonic()  # the backlog drains (each closed one ends at once): served again
    out = s.ask(request("CHECK", sample_message("spam", 0).read_bytes()), timeout=60)
    assert out.startswith(b"SPAMD/1.1 0 EX_OK") and time.monotonic() - start < 30, out


def test_no_password_in_the_imap_state(dovecot, model_file, tmp_path):
    from spamnb.delivery import imap

    res = _imap_run_d(tmp_path, model_file, dovecot)
    assert res.exit_code == 0, res.stderr
    state = Path(imap.state_path(model_file)).read_text()
    assert dovecot.password not in state and "password" not in state


def _imap_run_d(tmp_path, model, d):
    from click.testing import CliRunner

    from spamnb.cli import main

    return CliRunner().invoke(main, _imap_args(tmp_path, model, d.host, d.port, d.user, d.password))


def test_tell_over_loopback_tcp_is_for_the_peers_own_user(mallory, compiled, tmp_path, trained_model):
    """spamc -u bob -L ham from another local user, over 127.0.0.1: refused (the kernel's
    socket table says who connected), as on a Unix socket."""
    from spamnb.delivery import access

    users = tmp_path / "users"
    for name in ("bob", MALLORY):
        save_model(trained_model, users / name / "model.joblib")
    s = _spamd_served(compiled, user_models=str(users))
    raw = sample_message("ham", 9).read_bytes().replace(b"Subject:", b"Subject: tcp", 1)

    "127.0.0.1".encode("idna")  # the codec a connect needs, loaded before the child (who cannot read it)

    def tell_as(user, name):
        def ask():
            with socket.create_connection(("127.0.0.1", s.port), timeout=30) as c:
                return _told(c, raw, name)
        return forked_as(user, ask)

    try:
        out = tell_as(mallory, "bob")
        assert out.startswith(b"SPAMD/1.0 77 "), out
        assert load_model(users / "bob" / "model.joblib").known(message_key(raw), raw) is None
        assert b"DidSet: local" in tell_as(mallory, MALLORY)
        assert b"DidSet: local" in tell_as(pwd.getpwuid(0), "bob")
        with socket.create_connection(("127.0.0.1", s.port)) as c:  # the table, read as the server reads it
            assert access.local_peer_uid(c.family, c.getsockname(), c.getpeername()) == os.geteuid()
    finally:
        s.stop()


def test_tell_from_this_machines_own_address_is_for_the_peers_own_user(mallory, compiled, tmp_path, trained_model):
    """spamc -u bob -L spam from another local user who connects from this machine's own
    address on its network (not loopback; as ``spamc -d <the host's address>``, or binding
    it and connecting to 127.0.0.1): it is on this machine all the same, refused as over
    loopback, not taken for another host whose User: --allow trusts."""
    import ipaddress

    from spamnb.delivery import access
    from test_access import own_non_loopback_address

    ip = own_non_loopback_address()
    if ip is None:
        pytest.skip("this machine has no address but loopback to connect from")
    users = tmp_path / "users"
    for name in ("bob", MALLORY):
        save_model(trained_model, users / name / "model.joblib")
    s = _spamd_served(compiled, user_models=str(users),  # listening on loopback, admitting the host's address
                      allowed=access.LOOPBACK + (ipaddress.ip_network(ip),))
    raw = sample_message("ham", 9).read_bytes().replace(b"Subject:", b"Subject: lan", 1)

    def tell_as(user, name):
        def ask():
            with socket.socket() as c:
                c.settimeout(30)
                c.bind((ip, 0))
                c.connect(("127.0.0.1", s.port))
                return _told(c, raw, name)
        return forked_as(user, ask)

    try:
        out = tell_as(mallory, "bob")
        assert out.startswith(b"SPAMD/1.0 77 "), out
        assert b"runs as another user" in out
        assert load_model(users / "bob" / "model.joblib").known(message_key(raw), raw) is None
        assert b"DidSet: local" in tell_as(mallory, MALLORY)
        assert b"DidSet: local" in tell_as(pwd.getpwuid(0), "bob")
    finally:
        s.stop()


def test_a_loopback_peer_that_resets_its_connection_is_trusted_with_no_user():
    """A local client can send its TELL and reset the connection (SO_LINGER 0) before
    the server looks it up: its socket is then in no table and has no peer name. The
    server must not take that for "not on this machine" (whose User: --allow trusts):
    such a peer is unknown, and TELL for a User: is refused."""
    import struct

    from spamnb.delivery import access, spamd_protocol

    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        conn, address = listener.accept()
        with conn:
            assert access.tcp_peer_uid(conn, address) == os.geteuid()  # while it is there
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # a reset
            time.sleep(0.2)
            assert access.tcp_peer_uid(conn, address) == access.UNKNOWN_PEER
    with pytest.raises(spamd_protocol.SpamdError) as err:
        spamd_protocol.tell({"User": "bob", "Set": "local", "Message-class": "spam"}, b"Subject: x\n\nbody",
                            None, rules=access.Rules(tell=True),
                            peer=access.Peer(access.SPAMD, uid=access.UNKNOWN_PEER))
    assert "could not be identified" in str(err.value.args)


@pytest.mark.parametrize("compactions", [10, pytest.param(40, marks=pytest.mark.slow)])
def test_learners_and_forced_compactions_at_once_count_every_message_once(compiled, compactions):
    """4 learners of 25 messages each, one at a time through the journal, while
    compactions are forced again and again: every message counted once."""
    from concurrent.futures import ThreadPoolExecutor

    from spamnb.mail.sources import iter_index
    from spamnb.storage import journal
    from spamnb.storage.modelfile import compact
    from conftest import SAMPLE_INDEX

    msgs = [(m.raw, m.label) for m in iter_index(str(SAMPLE_INDEX))][:100]
    before = load_model(compiled)
    new = [(raw, label) for raw, label in msgs if before.known(message_key(raw), raw) is None]
    n0 = int(before.class_count.sum())
    stop = threading.Event()
    done = []

    def learner(k):
        for raw, label in new[k::4]:
            journal.update(compiled, [(raw, label, None)], timeout=60)

    def compactor():
        while not stop.is_set() and len(done) < compactions:
            compact(compiled, force=True)
            done.append(1)

    thread = threading.Thread(target=compactor)
    thread.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(learner, range(4)))
    finally:
        thread.join(300)
        stop.set()
    compact(compiled, force=True)
    after = load_model(compiled)
    assert done and int(after.class_count.sum()) == n0 + len(new)
    assert all(after.known(message_key(raw), raw) == (1 if label == "spam" else 0) for raw, label in new)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_an_imap_config_others_can_read_or_write_is_refused(tmp_path, mode):
    from spamnb.delivery import imap

    conf = tmp_path / "imap.toml"
    conf.write_text('host = "h"\n')
    conf.chmod(mode)
    with pytest.raises(imap.ImapError, match=f"must be yours and mode 0600 \\(it is {mode:04o}"):
        imap.read_config(conf)
    conf.chmod(0o600)
    assert imap.read_config(conf) == {"host": "h"}


def test_an_imap_config_that_is_a_fifo_is_refused_at_once(tmp_path):
    from spamnb.delivery import imap

    fifo = tmp_path / "imap.toml"
    os.mkfifo(fifo, 0o600)
    start = time.monotonic()
    with pytest.raises(imap.ImapError, match="not a regular file"):
        imap.read_config(fifo)
    assert time.monotonic() - start < 5


def test_starttls_refuses_an_untrusted_certificate(make_dovecot, model_file, tmp_path):
    d = make_dovecot(tls=True)
    args = _imap_args(tmp_path, model_file, "127.0.0.1", d.port, d.user, d.password)
    from click.testing import CliRunner

    from spamnb.cli import main

    res = CliRunner().invoke(main, [*args[:-4], "--security", "starttls", "--model", str(model_file)])
    assert res.exit_code == 1 and "not trusted" in res.stderr and "--cafile" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1


def _told(conn, raw, name):
    """The reply to a TELL of ``raw`` as spam for user ``name``, sent on ``conn``."""
    from test_spamd import request

    conn.sendall(request("TELL", raw, User=name, Message_class="spam", Set="local"))
    conn.shutdown(socket.SHUT_WR)
    out = b""
    while chunk := conn.recv(65536):
        out += chunk
    return out
