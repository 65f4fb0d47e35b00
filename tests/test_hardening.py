"""What a hostile neighbour or a hostile file can do (issue "Hardening"): each attack
reproduced first, then held off here.

The attacks by another local user run as a throwaway user made with ``useradd``;
they need root, and skip with that reason otherwise.
"""

from __future__ import annotations

import email
import email.policy
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

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import learnable_cutoffs, sample_message
from spamnb.delivery import fastfilter, wire
from spamnb.delivery.hook import add_headers, filter_message, replace_verdicts
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
    try:
        return pwd.getpwnam(MALLORY)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", MALLORY],
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
        want, want_label, _ = filter_message(load_model(compiled), raw, "model.joblib", [None] * 5)
        assert (res.stdout, res.returncode) == (want, {"spam": 0, "ham": 1, "unsure": 2}[want_label])
    finally:
        srv.close()


# -- 11. XDG paths ---------------------------------------------------------------------------

def test_a_relative_xdg_cache_home_is_ignored():
    env = {"XDG_CACHE_HOME": "relative/cache", "HOME": "/home/u"}
    assert locate.default_cache_path(env) == "/home/u/.cache/spamnb/default-model.joblib"
    assert locate.default_cache_path({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == "/c/spamnb/default-model.joblib"


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
        head = wire.encode_request(str(compiled), "m", [None] * 5, b"x" * (64 * 1024 * 1024 - 1))[0]
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
