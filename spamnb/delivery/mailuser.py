"""Whether Dovecot's mail users can run the spamnb a setup names.

Dovecot runs the IMAPSieve pipe program as each mail user, with a clean
environment. A spamnb that root can run and they cannot (a venv built on a Python
under ``/root``, mode 0700) fails every learn with ``Permission denied``, which only
Dovecot's log shows. :func:`check` finds that out at setup time:

* as root, it runs the command itself (``spamnb --version``) as the mail user
  (Dovecot's ``mail_uid`` when its configuration sets one, else ``nobody``), with
  that user's groups only, a clean environment and ``/`` as its folder; when that
  fails, :func:`unreachable` names the path in the way;
* as anyone else, who cannot become another user, it checks the paths: every
  folder on the way searchable, and the files readable and runnable, by others.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import stat
import subprocess

#: What a refusal tells the administrator to do.
HOW = ("install spamnb where every user can run it, e.g. a venv under /opt (python3 -m venv /opt/spamnb), "
       "and run setup --imapsieve with that one")
#: The environment the command is tried in: what Dovecot's pipe program sets up, no more.
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
#: Permission bits, as (owner, group, others) triples are read.
READ, RUN = 4, 1


class Account:
    """Who the command is tried as: ``name``, ``uid``, ``gid`` and ``groups``; ``label``:
    how a message names them."""

    def __init__(self, name, uid, gid, groups, label=None):
        self.name, self.uid, self.gid, self.groups = name, uid, gid, tuple(groups)
        self.label = label or f"user {name}"

    def may(self, st, bits) -> bool:
        """Whether this account has ``bits`` (READ, RUN) on a file of ``st``, as the
        kernel decides it without ACLs: the owner's, the group's or the others' bits."""
        shift = 6 if st.st_uid == self.uid else 3 if st.st_gid in self.groups else 0
        return (st.st_mode >> shift) & bits == bits


#: "Any other user": the others' bits.
OTHERS = Account("others", -1, -1, (), label="other users")


def mail_account(doveconf=None) -> Account:
    """The account Dovecot runs mail as when one runs all of it (``mail_uid``, as with
    virtual users under ``vmail``), else ``nobody``: a user with no rights of their own,
    as a person's account has none to spamnb's files."""
    name = _configured_mail_uid(doveconf)
    try:
        pw = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name or "nobody")
    except (KeyError, ValueError):
        return Account(name or "nobody", 65534, 65534, (65534,))
    return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, os.getgrouplist(pw.pw_name, pw.pw_gid))


def _configured_mail_uid(doveconf=None) -> str:
    doveconf = doveconf or shutil.which("doveconf", path="/usr/bin:/usr/sbin:/usr/local/bin:/usr/local/sbin")
    if doveconf is None:
        return ""
    try:
        found = subprocess.run([doveconf, "-h", "mail_uid"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return found.stdout.strip() if found.returncode == 0 else ""


def unreachable(path, needs, who=OTHERS) -> str | None:
    """Why ``who`` cannot use ``path`` (``needs``: READ and/or RUN on the file itself), or
    None: a folder on the way (links followed, each from the folder it is in, before any
    ``..`` after it) they cannot search, a missing path, or a file without the bits."""
    from spamnb.storage.store import resolve_links

    def enter(folder):
        problem = _search_problem(folder, who)
        if problem:
            raise _InTheWay(problem)

    try:
        here = resolve_links(os.fspath(path), None, enter=enter, strict=True)
        st = os.stat(here)
    except _InTheWay as exc:
        return str(exc)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{path}: too many symbolic links"
        return f"{exc.filename}: {exc.strerror}"
    if not who.may(st, needs):
        what = {READ: "read", RUN: "run", READ | RUN: "read and run"}[needs]
        return f"{who.label} cannot {what} {here} (mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid})"
    return None


class _InTheWay(Exception):
    """A folder on the way that the account cannot search (the reason)."""


def _search_problem(folder, who) -> str | None:
    st = os.stat(folder)
    if who.may(st, RUN):
        return None
    return f"{who.label} cannot enter {folder} (mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid})"


def needed(words, package) -> list:
    """``[(path, needs)]`` of what running ``words`` takes: a script and the interpreter
    its ``#!`` line names, or an interpreter and spamnb's ``package`` folder."""
    first = words[0]
    if len(words) > 1:
        return [(first, RUN), (package, READ | RUN), (os.path.join(package, "__init__.py"), READ)]
    out = [(first, READ | RUN)]
    interpreter = _shebang(first)
    if interpreter:
        out.append((interpreter, RUN))
    return out


def _shebang(path) -> str | None:
    try:
        with open(path, "rb") as f:
            line = f.readline(256)
    except OSError:
        return None
    words = line[2:].split() if line.startswith(b"#!") else []
    return os.fsdecode(words[0]) if words and words[0].startswith(b"/") else None


def check(words, package, version, who=None) -> None:
    """ValueError, one line naming what is in the way and :data:`HOW`, unless a mail user
    can run ``words`` (spamnb's command): as root, ``words --version`` run as ``who``
    (:func:`mail_account` by default) must say ``version``; otherwise :func:`needed`'s
    paths must be open to others."""
    if os.geteuid() != 0:
        for path, needs in needed(words, package):
            problem = unreachable(path, needs, OTHERS)
            if problem:
                raise ValueError(f"a mail user could not run spamnb ({' '.join(words)}): {problem}: {HOW}")
        return
    who = who or mail_account()
    ran, said = _run_as(who, [*words, "--version"])
    if ran and version in said.split():
        return
    if ran:
        said = f"`{' '.join(words)} --version` says {said[:80]!r}, not spamnb {version}"
    problem = next(filter(None, (unreachable(p, n, who) for p, n in needed(words, package))), None)
    raise ValueError(f"the mail user {who.name} cannot run spamnb ({' '.join(words)}): "
                     f"{problem or said}: {HOW}")


def _run_as(who, argv) -> tuple:
    """``(True, what it said)`` when ``argv`` ran as ``who`` and exited 0, else
    ``(False, what went wrong)``, in one line."""
    try:
        done = subprocess.run(argv, user=who.uid, group=who.gid, extra_groups=list(who.groups), env=CLEAN_ENV,
                              cwd="/", stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                              timeout=60)
    except subprocess.TimeoutExpired:
        return False, f"`{' '.join(argv)}` did not answer within 60 s"
    except OSError as exc:
        return False, f"{argv[0]}: {exc.strerror or exc}"
    if done.returncode == 0:
        return True, " ".join(done.stdout.split())
    lines = (done.stderr or done.stdout).strip().splitlines()
    return False, f"`{' '.join(argv)}` failed (exit {done.returncode}): {lines[-1] if lines else 'no word said'}"
