"""``spamnb setup``'s library: a first hour that starts from the mail the user already sorted.

It finds the mail (:func:`find_mail`), proposes what to learn (:func:`propose`),
estimates on it by cross-validation (:func:`estimate`), trains as ``spamnb
train`` does (:func:`train`), and writes the configuration and the delivery
recipe (:func:`write_config`, :func:`recipe`). It only ever *reads* mail: no
message is moved, deleted, flagged or touched (not even a Maildir's ``new/`` ->
``cur/``); what it writes is the model, the configuration file and, when asked, a
recipe file that did not exist.

Why the user's own mail and not the default model: with 30 of a user's ham and
10 of their spam, a model of their own left none of their next 300 ham unsure
and caught 84-89% of new spam, where the default model (2002 mail) caught 41%
of today's spam (measured on mail nobody here tuned on). Below those counts
(:data:`MIN_HAM`, :data:`MIN_SPAM`) setup trains nothing and keeps the default model.
"""

from __future__ import annotations

import email.utils
import os
import shutil
import time
from dataclasses import dataclass, field

from spamnb.mail import sources

#: Fewest sorted messages setup trains on: the counts behind the figures above
#: (30 ham + 10 spam of a user's own beat the default model on their later mail).
MIN_HAM = 30
MIN_SPAM = 10
#: Sorted mail from which a user's first day held the first-day target (at most 1% of their
#: ham unsure or spam, 95% of spam caught) in every window after their first 100 messages
#: (docs/accuracy.md, "The first day after spamnb setup"). Below it setup still trains (the
#: target held on average from 30 + 10, with corrections made at once) and says so.
FIRST_DAY_HAM = 100
FIRST_DAY_SPAM = 30
#: Mail younger than this may not have been read, let alone sorted: not learned as ham
#: (``spamnb setup --min-age DAYS`` changes it).
HAM_MIN_AGE_DAYS = 3
#: A file's time this much newer than its arrival time (its Maildir name's) is not the
#: delivery's: the file was copied or restored without its times (a delivery writes the
#: file within seconds of naming it).
COPY_SLACK = 3600.0
#: The oldest time a Maildir file name is read as (2001-09-09, 10 digits): a name that
#: starts with a smaller number was not made by the maildir's own naming rule.
NAME_TIME_FLOOR = 1_000_000_000
#: Where a message's arrival time was read, when not from its file's time.
FROM_NAME, FROM_DATE = "Maildir file name", "Date field"
#: Folder names (case-insensitive, Maildir++ dot and parents stripped) that hold spam.
JUNK_NAMES = frozenset({"junk", "spam", "junk e-mail", "junk email", "bulk mail", "junkmail"})
#: Folders that are neither: mail on its way out, half-written, or thrown away unsorted.
SKIP_NAMES = frozenset({"trash", "deleted", "deleted items", "deleted messages", "bin", "drafts", "outbox",
                        "queue", "templates", "unsure"})
DAY = 86400.0


@dataclass
class Folder:
    """One folder found: ``role`` is ``spam``, ``ham`` or ``skip``; ``messages`` are
    ``(source, raw or None, unix time)``: raw None when ``source`` is a file to read."""

    name: str
    path: str
    kind: str
    role: str
    messages: list = field(default_factory=list, repr=False)
    #: How many messages' times were read from their file name (:data:`FROM_NAME`)
    #: or Date field (:data:`FROM_DATE`) because their file's time was newer.
    times_from: dict = field(default_factory=dict, repr=False)

    def ages(self, now):
        return [(now - t) / DAY for _, _, t in self.messages]


def role_of(name: str) -> str:
    """``spam`` for a junk folder (``.Junk``, ``Spam``, ``.Junk.2024``), ``skip`` for
    trash, drafts and the like (``.Archive.Trash`` too), else ``ham``."""
    parts = name.strip("/").lstrip(".").replace("/", ".").lower().split(".")
    if any(p in JUNK_NAMES for p in parts):
        return "spam"
    if any(p in SKIP_NAMES for p in parts):
        return "skip"
    return "ham"


def name_time(path):
    """The arrival time a Maildir file name starts with (``1733312345.M1P2.host:2,S``:
    the delivery's seconds), or None when the name does not start so."""
    head = os.path.basename(path).split(".", 1)[0]
    if not (head.isascii() and head.isdigit() and len(head) <= 12):
        return None
    t = int(head)
    return float(t) if t >= NAME_TIME_FLOOR else None


def _header_date(path):
    """The Date field of the message in ``path`` (its header only: at most 64 kB read), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(65536)
    except OSError:
        return None
    return _date_of(head.replace(b"\r\n", b"\n"), None)


def arrival(path, mtime, now, young_days):
    """``(time, where)``: when the message in ``path`` arrived. Its file's time, unless
    that is newer than what its Maildir file name says (``where``: :data:`FROM_NAME`),
    or, for a name without a time (an MH folder's ``1``, ``2``...) and a file time
    that would make it too young to learn, newer than its Date field
    (:data:`FROM_DATE`; only then is its header read). ``where`` is None when the
    file's time stands."""
    named = name_time(path)
    if named is not None:
        return (named, FROM_NAME) if mtime - named > COPY_SLACK else (mtime, None)
    if now - mtime >= young_days * DAY:
        return mtime, None  # old enough by its file's time: its Date could only make it older
    dated = _header_date(path)
    if dated is not None and mtime - dated > COPY_SLACK:
        return dated, FROM_DATE
    return mtime, None


def _file_messages(paths, now, young_days, times_from):
    out = []
    for path in paths:
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue  # delivered away while we listed: not ours to worry about
        t, where = arrival(path, mtime, now, young_days)
        if where:
            times_from[where] = times_from.get(where, 0) + 1
        out.append((path, None, t))
    return out


def _date_of(raw: bytes, fallback: float) -> float:
    head = raw.split(b"\n\n", 1)[0]
    for line in head.split(b"\n"):
        if line[:5].lower() == b"date:":
            try:
                return email.utils.parsedate_to_datetime(line[5:].decode("latin-1").strip()).timestamp()
            except (TypeError, ValueError, IndexError, OverflowError):
                break
    return fallback


def _read_folder(folder, now, young_days):
    """``(source, raw or None, time)`` of a folder's messages, reading nothing but them
    (and the header of a file too young by its file's time alone: :func:`arrival`)."""
    path, kind = folder.path, folder.kind
    if kind == "maildir":
        return _file_messages(sources.maildir_paths(path, report=lambda *_: None), now, young_days, folder.times_from)
    if kind == "mh":  # listed, not read: each file is read once, when setup needs its tokens
        return _file_messages(sources.mh_paths(path), now, young_days, folder.times_from)
    mtime = os.stat(path).st_mtime  # an mbox message: its Date, else the file's time
    return [(m.source, m.raw, _date_of(m.raw, mtime)) for m in sources.iter_messages(path, on_error=lambda *_: None)]


def shown(path, home):
    """``path`` with ``home`` as ``~``, as the user thinks of it."""
    return "~" + path[len(home):] if home and path.startswith(home.rstrip("/") + "/") else path


def _kind(path):
    try:
        return sources.detect_kind(path)
    except sources.SourceError:
        return None


def find_mail(home: str, env=os.environ, now=None, young_days=HAM_MIN_AGE_DAYS) -> list:
    """The folders of ``home``'s mail: ``~/Maildir`` (Maildir++: INBOX, ``.Folder``; or
    ``Folder`` maildirs beside it), MH folders under ``~/Mail``, mbox files in ``~/mail``
    and ``~/Mail``, and the spool ``/var/mail/$USER``. Each message's time is when it
    arrived (:func:`arrival`), as of ``now``; ``young_days`` as :func:`propose`'s."""
    now = time.time() if now is None else now
    found = []

    def add(name, path, kind):
        found.append(Folder(name, path, kind, role_of(os.path.basename(path) if name != "INBOX" else "INBOX")))

    for root in ("Maildir", ".maildir"):
        top = os.path.join(home, root)
        if _kind(top) != "maildir":
            continue
        add(f"{shown(top, home)} (INBOX)", top, "maildir")
        for name in sources.sorted_listing(top, lambda *_: None):
            sub = os.path.join(top, name)
            if name not in ("cur", "new", "tmp") and os.path.isdir(os.path.join(sub, "cur")):
                add(shown(sub, home), sub, "maildir")
    for root in ("Mail", "mail"):
        top = os.path.join(home, root)
        if not os.path.isdir(top) or os.path.islink(top):
            continue
        for name in sources.sorted_listing(top, lambda *_: None):
            path = os.path.join(top, name)
            if name.startswith(".") or any(f.path == path for f in found):
                continue
            kind = _kind(path)
            if kind in ("mh", "mbox", "maildir"):
                add(shown(path, home), path, kind)
    user = env.get("USER") or env.get("LOGNAME")
    spool = os.path.join("/var/mail", user) if user else None
    if spool and os.path.isfile(spool) and os.access(spool, os.R_OK) and os.path.getsize(spool):
        found.append(Folder(spool, spool, "mbox", "ham"))
    for folder in found:
        folder.messages = _read_folder(folder, now, young_days)
    return found


@dataclass
class Proposal:
    """What setup would learn: ``ham`` and ``spam`` as ``(source, raw, label)``, and why
    the rest is left out: ``young`` (too recent to be sorted), ``doubtful`` (ham the
    default model calls spam: ``(source, P(spam))``, for the user to decide).

    A message's ``raw`` is None (a file not read yet), its bytes (an mbox's), or, once
    read, a :class:`~spamnb.scale.parallel.Tokenized` in ``table``: screening,
    cross-validation and training all take its tokens, so each message is read and
    tokenized once (:meth:`read`), and only its tokens are kept, as ids."""

    ham: list
    spam: list
    young: int
    doubtful: list
    table: object = field(default=None, repr=False)

    @property
    def enough(self) -> bool:
        return len(self.ham) >= MIN_HAM and len(self.spam) >= MIN_SPAM

    def shortfall(self, ham=MIN_HAM, spam=MIN_SPAM) -> str:
        """What to sort to reach ``ham`` and ``spam`` messages ('' when there): by default,
        before setup trains."""
        need = [f"{n - len(have)} more {what}" for n, have, what in
                ((ham, self.ham, "ham (mail you keep)"), (spam, self.spam, "spam (into a Junk folder)"))
                if len(have) < n]
        return " and ".join(need)

    def messages(self):
        return self.ham + self.spam

    def read(self, config):
        """Every message tokenized under ``config``, reading only those not read under it
        yet; one that cannot be read stays a path, for training to skip as ``train`` does."""
        from spamnb.scale.parallel import TokenTable

        if self.table is None:
            self.table = TokenTable()

        def each(items):
            out = []
            for item in items:
                try:
                    out.append(tokenized(item, config, self.table))
                except OSError:
                    out.append((item[0], None, item[2]))
            return out

        self.ham, self.spam = each(self.ham), each(self.spam)
        return self


def read_raw(source, raw):
    if raw is not None:
        return raw
    with open(source, "rb") as f:
        return f.read()


def tokenized(item, config, table):
    """``item`` ``(source, raw, label)`` with ``raw`` its :class:`~spamnb.scale.parallel.Tokenized`
    under ``config``: read and tokenized unless it is one already. OSError when its file
    cannot be read."""
    from spamnb.scale.parallel import Tokenized

    source, raw, label = item
    if isinstance(raw, Tokenized):
        if raw.config == config:
            return item
        raw = raw.raw  # tokenized under other settings: read again
    return source, Tokenized.of(read_raw(source, raw), config, table, given=raw is not None), label


def propose(folders, screen=None, now=None, young_days=HAM_MIN_AGE_DAYS) -> Proposal:
    """Junk folders' mail as spam; the other folders' mail older than ``young_days``
    (:data:`HAM_MIN_AGE_DAYS`) as ham, except what ``screen`` (a model: the default
    one) files as spam, which is listed instead."""
    now = time.time() if now is None else now
    ham, spam, doubtful, young = [], [], [], 0
    for folder in folders:
        for source, raw, t in folder.messages:
            if folder.role == "spam":
                spam.append((source, raw, "spam"))
            elif folder.role == "ham":
                if now - t < young_days * DAY:
                    young += 1
                else:
                    ham.append((source, raw, "ham"))
    table = None
    if screen is not None and ham:
        from spamnb.model import BATCH, batches
        from spamnb.scale.parallel import TokenTable

        table, config = TokenTable(), screen.tokenizer

        def readable():
            for item in ham:
                try:
                    yield tokenized(item, config, table)  # its tokens: estimate and train take them too
                except OSError:
                    continue  # gone or unreadable since it was listed: not learned either

        kept = []
        for batch in batches(readable(), BATCH):  # scored in classify_many's batches
            verdicts = screen.classify_token_lists([raw.tokens(config) for _, raw, _ in batch])
            for item, c in zip(batch, verdicts):
                if c.label == "spam":
                    doubtful.append((item[0], c.spam_probability))
                else:
                    kept.append(item)
        ham = kept
    return Proposal(ham, spam, young, doubtful, table)


def estimate(proposal: Proposal, make_model, k=10, seed=0):
    """Stratified K-fold cross-validation on the proposal (K at most the spam count):
    :func:`spamnb.evaluation.metrics.decision_intervals` at the model's cut-offs."""
    from spamnb.evaluation import evaluate, metrics

    k = max(2, min(k, len(proposal.spam), len(proposal.ham)))
    fresh = make_model()  # its settings: what every fold's model tokenizes and decides with
    proposal.read(fresh.tokenizer)  # once: train takes the same tokens
    scores = evaluate.cross_validate(make_model, proposal.messages(), k=k, seed=seed)
    cut = fresh.cutoffs
    out = metrics.decision_intervals(scores.y, scores.proba, cut.ham_cutoff, cut.spam_cutoff, known=scores.known)
    return {**out, "folds": k}


def train(proposal: Proposal, model, backend) -> dict:
    """Train the fresh ``model`` on the proposal, as ``spamnb train`` does (sharded,
    duplicates counted once), and replace ``backend``'s model with it."""
    from spamnb.scale import parallel

    proposal.read(model.tokenizer)  # a no-op after estimate
    done = parallel.train(model, proposal.messages(), registry=True, on_error=lambda *_: None)
    backend.replace(model)
    return done


# -- configuration and delivery ---------------------------------------------------------------

DELIVERIES = ("procmail", "maildrop", "sieve", "imap")


def command_path(argv0: str, executable: str) -> str:
    """spamnb's full path for a recipe (a delivery agent has no PATH of the user's):
    the script this process runs as, else ``spamnb`` on PATH, else ``PYTHON -m spamnb``
    (run as ``python -m spamnb``, argv[0] is the package's ``__main__.py``)."""
    if os.path.basename(argv0) == "spamnb" and os.path.isfile(argv0):
        return os.path.abspath(argv0)
    return shutil.which("spamnb") or f"{executable} -m spamnb"


def command_words(argv0: str, executable: str) -> list:
    """spamnb's command as separate words, for a program run without a shell's PATH (the
    IMAPSieve pipe program): the ``spamnb`` script this process runs as; when started as
    ``python -m spamnb`` (argv[0] is the package's ``__main__.py``), this interpreter with
    ``-I -m spamnb`` (:data:`spamnb.delivery.imapsieve.MODULE`); else ``spamnb`` on PATH,
    else the interpreter so."""
    from spamnb.delivery.imapsieve import MODULE

    if os.path.basename(argv0) == "spamnb" and os.path.isfile(argv0):
        return [os.path.abspath(argv0)]
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    module = [executable, *MODULE]
    if os.path.realpath(argv0) == os.path.realpath(os.path.join(package, "__main__.py")):
        return module
    found = shutil.which("spamnb")
    return [os.path.abspath(found)] if found else module


def delivery_of(home: str, imap_host=None) -> str:
    """What the user delivers with, judged by the files they have; procmail when nothing says."""
    if os.path.exists(os.path.join(home, ".mailfilter")):
        return "maildrop"
    if os.path.exists(os.path.join(home, ".dovecot.sieve")) or os.path.isdir(os.path.join(home, "sieve")):
        return "sieve"
    if imap_host and not os.path.exists(os.path.join(home, ".procmailrc")):
        return "imap"
    return "procmail"


#: The folder a recipe files unsure mail into, unless told not to (Maildir++ name; Sieve
#: and IMAP name it without the dot).
UNSURE_FOLDER = ".Unsure"
#: How a recipe tells unsure mail: the verdict spamnb's X-Spam-Status gives it (one line,
#: never folded; SpamAssassin's "No" first, since unsure mail is delivered).
UNSURE_TEST = "tests=SPAMNB_UNSURE"


def recipe(kind: str, spamnb: str, home: str, junk: str | None = None, unsure: str | None = UNSURE_FOLDER) -> tuple:
    """``(file it goes in, text)`` of the delivery recipe: docs/delivery.md's, with
    spamnb's full path, the user's junk folder (a Maildir++ ``.Junk`` by default) and
    the folder for unsure mail (``unsure``; None: unsure mail stays in INBOX)."""
    junk = junk or ".Junk"
    if kind == "procmail":
        text = ("MAILDIR=$HOME/Maildir/\nDEFAULT=$MAILDIR\n\n# spamnb's full path: what `command -v spamnb` prints\n"
                f":0fw\n| {spamnb} filter --exit-zero -u\n\n:0\n* ^X-Spam-Flag: YES\n{junk}/\n")
        if unsure:
            text += ("\n# unsure mail: a folder of its own (delete the three lines below and it stays in INBOX)\n"
                     f":0\n* ^X-Spam-Status: No, .*{UNSURE_TEST}\n{unsure}/\n")
        return os.path.join(home, ".procmailrc"), text
    if kind == "maildrop":
        text = (f'xfilter "{spamnb} filter --exit-zero -u"\nif (/^X-Spam-Flag: YES/)\n{{\n'
                f'    to "$HOME/Maildir/{junk}/"\n}}\n')
        if unsure:
            text += ("# unsure mail: a folder of its own (delete the if below and it stays in INBOX)\n"
                     f'if (/^X-Spam-Status: No, .*{UNSURE_TEST}/)\n{{\n    to "$HOME/Maildir/{unsure}/"\n}}\n')
        return os.path.join(home, ".mailfilter"), text + 'to "$HOME/Maildir/"\n'
    if kind == "sieve":
        text = ('require ["vnd.dovecot.filter", "fileinto"];\nfilter "spamnb";\n'
                f'if header :is "X-Spam-Flag" "YES" {{\n    fileinto "{junk.lstrip(".")}";\n}}\n')
        if unsure:
            text += ("# unsure mail: a folder of its own (delete the if below and it stays in INBOX)\n"
                     f'if header :contains "X-Spam-Status" "{UNSURE_TEST}" {{\n'
                     f'    fileinto "{unsure.lstrip(".")}";\n}}\n')
        return os.path.join(home, ".dovecot.sieve"), text
    if kind == "imap":
        unit = imap_unit(spamnb, unsure and unsure.lstrip("."))
        return os.path.join(home, ".config", "systemd", "user", "spamnb-imap.service"), unit
    raise ValueError(f"unknown delivery {kind!r} (one of {', '.join(DELIVERIES)})")


def imap_unit(spamnb: str, unsure: str | None = None) -> str:
    """contrib/systemd/user/spamnb-imap.service, running this spamnb (with ``--unsure-folder``
    when ``unsure`` names one)."""
    extra = f" --unsure-folder {unsure}" if unsure else ""
    return ("[Unit]\nDescription=spamnb IMAP filter (files spam into Junk, learns from your moves)\n"
            "After=network-online.target\n\n[Service]\nType=simple\n"
            f"ExecStart={spamnb} imap filter --watch{extra}\nUMask=0077\nRestart=on-failure\nRestartSec=60s\n"
            "NoNewPrivileges=yes\nRestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\nRestrictNamespaces=yes\n"
            "RestrictRealtime=yes\nRestrictSUIDSGID=yes\nLockPersonality=yes\nSystemCallArchitectures=native\n"
            "SystemCallFilter=@system-service\nSystemCallFilter=~@privileged @resources\n"
            "SystemCallErrorNumber=EPERM\nMemoryMax=1G\n\n[Install]\nWantedBy=default.target\n")


#: IMAP servers' lists of the folders a mail client shows, in a Maildir++ (Dovecot's,
#: Courier's), and how each names a top-level folder.
SUBSCRIPTIONS = (("subscriptions", "{}"), ("courierimapsubscribed", "INBOX.{}"))


def make_folders(home: str, names, kind: str) -> list:
    """Make the Maildir++ folders ``names`` (``.Junk``, ``.Unsure``) that ``kind``'s recipe
    files into, in ``~/Maildir``, when missing: ``cur/``, ``new/``, ``tmp/`` and the
    ``maildirfolder`` marker, and the folder added to the IMAP server's subscriptions
    file where there is one (else a mail client may not show it). For procmail and
    maildrop, ``~/Maildir`` itself is made when missing (their recipe delivers there; a
    missing folder makes maildrop defer every message); for Sieve only an existing
    ``~/Maildir`` is used (Dovecot's mail may be stored otherwise). Says what it made."""
    from spamnb.delivery.maildir_sort import ensure_folder, ensure_maildir

    top = os.path.join(home, "Maildir")
    if kind not in ("procmail", "maildrop", "sieve") or (kind == "sieve" and _kind(top) != "maildir"):
        return []
    said = []
    try:
        if not os.path.isdir(top):
            ensure_maildir(top)
            said.append(f"made {top}")
    except OSError as exc:
        return [f"could not make {top}: {exc.strerror or exc}; make it and its folders yourself"]
    for name in names:
        path = os.path.join(top, name)
        if os.path.isdir(os.path.join(path, "cur")):
            continue
        try:
            ensure_folder(path)
            said.append(f"made the folder {path}")
            for file, form in SUBSCRIPTIONS:
                listed = os.path.join(top, file)
                if os.path.isfile(listed) and subscribe(listed, form.format(name.lstrip("."))):
                    said.append(f"added {form.format(name.lstrip('.'))} to {listed}")
        except OSError as exc:  # a file in its place, no permission: say so, the recipe is still given
            said.append(f"could not make the folder {path}: {exc.strerror or exc}")
    return said


def subscribe(path: str, name: str) -> bool:
    """Add the line ``name`` to the subscriptions file ``path`` unless it is there. True when added."""
    with open(path, "rb") as f:
        text = f.read()
    lines = text.split(b"\n")
    if name.encode() in lines:
        return False
    with open(path, "ab") as f:
        f.write((b"\n" if text and not text.endswith(b"\n") else b"") + name.encode() + b"\n")
    return True


def write_new(path: str, text: str) -> bool:
    """Write ``text`` to ``path`` (mode 0600) only if nothing is there: a user's own
    recipe is never replaced. True when written."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


def write_config(path: str, model_path: str) -> str:
    """Set ``[model] path`` in the configuration file: a new file, or a ``[model]``
    table added to one without it; a file that has one is left as it is. Says what it did."""
    import json

    table = f"[model]\npath = {json.dumps(model_path)}\n"
    if write_new(path, "# written by `spamnb setup`\n" + table):
        return f"wrote {path}"
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if any(line.strip() == "[model]" for line in text.splitlines()):
        return f"left {path} as it is (it has a [model] table already)"
    with open(path, "a", encoding="utf-8") as f:
        f.write(("\n" if text and not text.endswith("\n") else "") + "\n" + table)
    return f"added [model] path to {path}"
