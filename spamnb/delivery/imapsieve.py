"""Learning from moves on a Dovecot server: Pigeonhole's IMAPSieve scripts and settings.

Dovecot runs an administrator's Sieve script when a user copies or moves a
message into a folder (``imapsieve_mailboxN_*`` settings, ``causes = COPY``);
the script pipes the message to a program (``vnd.dovecot.pipe``), which runs
as the mail user. This module writes those files, with spamnb's full path:

* ``report-spam.sieve``: a message put into Junk is learned as spam;
* ``report-ham.sieve``: a message taken out of Junk (or out of the folder unsure
  mail is filed in) into another folder is learned as ham, unless that folder
  is a trash folder (:data:`TRASH`), as Dovecot's own "antispam with IMAPSieve"
  how-to has it: deleting spam is no verdict on it; nor the unsure folder; nor
  Junk, where ``report-spam.sieve`` learns it as spam (Dovecot runs every
  matching rule);
* ``spamnb-learn``: the pipe program. It runs ``spamnb learn --spam|--ham`` on
  the message, which learns it into the mail user's own model once (learning a
  message known under the same label again changes nothing, and learning it
  under the other label moves it: forgets it as spam and learns it as ham in
  one journal record). It always exits 0: the move is done before the script
  runs, and a failing learn must neither block nor undo it. A learn that fails is
  one line on stderr (Dovecot's log) and is kept in the user's queue, learned by
  their next move or ``spamnb learn-queue``; every learn is a line in their learn
  log (:mod:`spamnb.delivery.learnqueue`). It learns nothing for a mail
  user without a home of their own (HOME unset, ``/``, or the uid's own home
  under another user name: virtual users under one vmail uid), whose moves
  would go into a model every such user shares;
* ``90-spamnb-imapsieve.conf``: the settings, for ``/etc/dovecot/conf.d/``.

IMAPSieve calls a ``MOVE`` a ``COPY`` (Pigeonhole's storage plugin reports both
causes as COPY), so a copy into Junk is learned as a move is: the scripts
cannot tell them apart. A move between two other folders runs no script.

contrib/dovecot/ holds these files as :func:`files` writes them for
``/usr/local/bin/spamnb`` in :data:`DEFAULT_DIR`.
"""

from __future__ import annotations

import os
import shlex
import stat

#: Where the contrib copies (and docs/delivery.md) put the files.
DEFAULT_DIR = "/etc/dovecot/sieve-spamnb"
#: Folders that moving a message out of Junk into teaches nothing (Sieve's
#: ``string`` test compares them case-insensitively).
TRASH = ("Trash", "Deleted Messages", "Deleted Items", "Bin")
PIPE = "spamnb-learn"
CONF = "90-spamnb-imapsieve.conf"

_SIEVE_HEAD = 'require ["vnd.dovecot.pipe", "copy", "imapsieve", "environment", "variables"];\n'


def report_spam() -> str:
    return ("# spamnb: a message put into Junk (moved, or copied: IMAPSieve calls both COPY)\n"
            "# is learned as spam, into the mail user's own model. Run by Dovecot's IMAPSieve\n"
            f"# (imapsieve_mailbox1_*, {CONF}).\n"
            + _SIEVE_HEAD +
            f'pipe :copy "{PIPE}" ["spam"];\n')


def report_ham(junk: str = "Junk", unsure: str = "Unsure") -> str:
    skip = ", ".join(f'"{name}"' for name in (*TRASH, junk, unsure))
    return (f"# spamnb: a message taken out of {junk} (or the unsure folder) into another folder is\n"
            "# learned as ham (learning it as ham forgets it as spam). Into a trash folder it\n"
            "# teaches nothing: deleting spam says nothing new about it; into the unsure\n"
            "# folder neither; into Junk it is spam (report-spam.sieve). Run by Dovecot's IMAPSieve\n"
            f"# (imapsieve_mailbox2_* and imapsieve_mailbox3_*, {CONF}).\n"
            + _SIEVE_HEAD +
            'if environment :matches "imap.mailbox" "*" {\n'
            '    set "mailbox" "${1}";\n'
            "}\n"
            f'if string "${{mailbox}}" [{skip}] {{\n'
            "    stop;\n"
            "}\n"
            f'pipe :copy "{PIPE}" ["ham"];\n')


def command(spamnb) -> list:
    """spamnb's command as words: ``spamnb`` a full path (one word) or a list of words."""
    return [spamnb] if isinstance(spamnb, (str, os.PathLike)) else list(spamnb)


#: How the pipe program runs spamnb when setup was started as ``python -m spamnb``:
#: isolated (``-I``), so that neither the mail user's folder nor their environment
#: decides which spamnb is imported.
MODULE = ("-I", "-m", "spamnb")


def pipe_program(spamnb) -> str:
    """The program the Sieve scripts pipe a moved message to (``spamnb-learn spam|ham``);
    ``spamnb``: its full path, or the words that run it (:data:`MODULE`)."""
    from spamnb.delivery import learnqueue as q

    words = shlex.join(os.fspath(w) for w in command(spamnb))
    values = {"@SPAMNB@": words, "@MAX_MESSAGES@": str(q.MAX_MESSAGES), "@MAX_BYTES@": str(q.MAX_BYTES),
              "@MAX_MB@": str(q.MAX_BYTES // 2**20), "@LOG_MAX_BYTES@": str(q.LOG_MAX_BYTES),
              "@PIPE_SECONDS@": str(q.PIPE_SECONDS)}
    text = _PIPE
    for key, value in values.items():
        text = text.replace(key, value)
    return text


#: :func:`pipe_program`'s text, @NAME@ filled in (its awk and shell braces would make an
#: f-string unreadable).
_PIPE = r"""#!/bin/sh
# spamnb-learn spam|ham: learn the message on standard input into the mail
# user's own model. Piped to by report-spam.sieve and report-ham.sieve (Dovecot's
# IMAPSieve, vnd.dovecot.pipe); runs as the mail user, with their HOME.
#
# It always exits 0: the move is done before this runs, and a failing learn must
# neither block nor undo it. A learn that fails, or that Dovecot stops, is not lost:
# the message is kept in ~/.local/state/spamnb/learn-queue/ (at most @MAX_MESSAGES@
# messages and @MAX_MB@ MB; past that the oldest are dropped), and the next move learns
# the queue, oldest first, before its own message (`spamnb learn-queue` does too, from
# a timer). Each learn, queued learn and dropped learn is a line in
# ~/.local/state/spamnb/learn.log (rotated at 1 MiB), and in syslog when there is one
# (`journalctl -t spamnb-learn`); a failure is also a line on stderr, which is
# Dovecot's log. The message goes through a private temporary file, so that
# `spamnb learn` takes its fast path (no numpy: a journal append).
#
# It learns nothing for a mail user without a home of their own: HOME unset, /,
# or the home the system gives the uid the mail runs as while the mail user is
# another name (a virtual user whose userdb has no home, under a shared vmail
# uid); spamnb would learn into that home's model, which every such user shares.
PATH=/usr/local/bin:/usr/bin:/bin
export PATH
case "$1" in
    spam|ham) label=$1 ;;
    *) echo "spamnb-learn: called with '$1', not spam or ham: nothing learned" >&2; exit 0 ;;
esac
umask 077
dir=$(mktemp -d "${TMPDIR:-/tmp}/spamnb-learn.XXXXXXXXXX") || {
    echo "spamnb-learn: no temporary folder: the message is not learned as $label" >&2; exit 0; }
trap 'rm -rf "$dir"' EXIT
trap 'exit 0' HUP INT TERM
if ! cat > "$dir/message"; then
    echo "spamnb-learn: cannot read the message: not learned as $label" >&2; exit 0
fi
uid=$(id -u)
login=$(id -un 2>/dev/null || echo "$uid")
who=${USER:-$login}
home=$(printf '%s' "${HOME:-}" | sed 's:/*$::')
system_home=$(getent passwd "$uid" | cut -d: -f6 | sed 's:/*$::')
case "$home" in
    /?*) shared= ;;
    *) shared=yes ;;
esac
if [ "$home" = "$system_home" ] && [ "$who" != "$login" ] && [ "${who%%@*}" != "$login" ]; then
    shared=yes
fi
if [ -n "$shared" ]; then
    echo "spamnb-learn: $who: no home of their own (HOME=${HOME-unset}, uid $login): not learned as $label, so that nothing goes into a model other users share (give each user a home in Dovecot's userdb)" >&2
    exit 0
fi
state=$home/.local/state/spamnb
queue=$state/learn-queue
log=$state/learn.log
queued=

mid_of() {  # the Message-ID of a message file as the log gives it (spamnb.delivery.learnqueue.message_id)
    LC_ALL=C awk '
        /^\r?$/ { exit }
        found && /^[ \t]/ { v = v $0; next }
        found { exit }
        tolower(substr($0, 1, 11)) == "message-id:" { found = 1; v = substr($0, 12) }
        END { gsub(/[^!-~]/, "", v); print (v == "" ? "-" : substr(v, 1, 200)) }' "$1" 2>/dev/null || echo -
}
mid=$(mid_of "$dir/message")

note() {  # note WHAT LABEL MESSAGE-ID TEXT: a line in the learn log, and in syslog when there is one
    line="$(date -u +%Y-%m-%dT%H:%M:%SZ) $1 $2 $3: $(printf '%s' "$4" | tr -s '\t\r\n' '   ')"
    {
        mkdir -p "$state"
        if [ -f "$log" ] && [ "$(wc -c < "$log")" -ge @LOG_MAX_BYTES@ ]; then mv -f "$log" "$log.1"; fi
        printf '%s\n' "$line" >> "$log"
    } 2>/dev/null
    case "$1" in learned) level=info ;; *) level=warning ;; esac
    if [ -S /dev/log ]; then logger -t spamnb-learn -p "mail.$level" -- "$who: $line" 2>/dev/null; fi
}

said() {  # what spamnb said, on one line
    head -n 3 "$dir/said" 2>/dev/null | tr -s '\t\r' '  ' | paste -s -d ' ' -
}

keep() {  # keep WHY: the message kept for a retry, written whole before it is named STAMP.PID.LABEL
    stamp=$(date +%s%N)
    case "$stamp" in *[!0-9]*|'') stamp=$(date +%s)000000000 ;; esac
    if { mkdir -p "$queue" && cp "$dir/message" "$queue/.new.$$" &&
         mv -f "$queue/.new.$$" "$queue/$stamp.$$.$label"; } 2>/dev/null; then
        queued=yes
        note queued "$label" "$mid" "$1; kept in $queue for a retry"
        bound
        return 0
    fi
    rm -f "$queue/.new.$$" 2>/dev/null
    echo "spamnb-learn: $who: cannot keep the message in $queue: not learned as $label" >&2
    note dropped "$label" "$mid" "$1; and it cannot be kept in $queue: not learned"
    return 1
}

bound() {  # at most @MAX_MESSAGES@ learns and @MAX_BYTES@ bytes wait: the oldest are dropped until they do, a line each
    (cd "$queue" && set -- [0-9]* && [ -e "$1" ] && wc -c -- "$@") 2>/dev/null |
        awk -v n=@MAX_MESSAGES@ -v b=@MAX_BYTES@ '$2 != "total" { size[++k] = $1; name[k] = $2; s += $1 }
            END { for (i = 1; i <= k && (k - i + 1 > n || s > b); i++) { print name[i]; s -= size[i] } }' |
        while read -r old; do
            note dropped "${old##*.}" "$(mid_of "$queue/$old")" "the queue is full (at most @MAX_MESSAGES@ messages, @MAX_MB@ MB): the oldest learn is dropped, not learned"
            rm -f "$queue/$old"
        done
}

stopped() {  # Dovecot's SIGTERM (sieve_pipe_exec_timeout): spamnb stopped, the message kept
    kill "$learner" 2>/dev/null
    echo "spamnb-learn: $who: stopped by Dovecot (sieve_pipe_exec_timeout): not learned as $label now; kept in $queue for a retry" >&2
    [ -n "$queued" ] || keep "stopped by Dovecot (sieve_pipe_exec_timeout)"
    exit 0
}

run() {  # run spamnb in the background and wait for it, so that Dovecot's SIGTERM ends this at once
    @SPAMNB@ "$@" > "$dir/said" 2>&1 &
    learner=$!
    trap stopped HUP INT TERM
    wait "$learner"
}

set -- "$queue"/[0-9]*
if [ -e "$1" ]; then
    # learns wait: this one goes after them, so that the last move of a message is what is learned
    # (when it cannot be kept, it is learned now all the same)
    if keep "learns wait before it"; then
        if ! run learn-queue -q --max-seconds @PIPE_SECONDS@; then
            echo "spamnb-learn: $who: learning as $label failed (the move is done; it waits in $queue): $(said)" >&2
        fi
        exit 0
    fi
fi
run learn --"$label" "$dir/message"
code=$?
if [ "$code" -eq 0 ]; then
    note learned "$label" "$mid" "$(said)"
else
    echo "spamnb-learn: $who: learning as $label failed (the move is done): $(said); kept in $queue for a retry" >&2
    keep "spamnb failed (exit $code): $(said)"
fi
exit 0
"""


def conf(folder: str = DEFAULT_DIR, junk: str = "Junk", unsure: str = "Unsure") -> str:
    """The Dovecot settings (``/etc/dovecot/conf.d/90-spamnb-imapsieve.conf``)."""
    return f"""# spamnb learns from the moves users make into and out of {junk} (Pigeonhole's IMAPSieve).
# For /etc/dovecot/conf.d/ (needs dovecot-sieve); the scripts are in {folder}.
# If your configuration sets mail_plugins for imap, sieve_plugins or
# sieve_global_extensions elsewhere, merge these values into those lines, and
# renumber the imapsieve_mailboxN rules after yours. Then compile the scripts
# as root with this file as sievec's configuration, so that they compile with
# these settings whatever dovecot.conf holds (`sievec -c {folder}/{CONF}
# {folder}/report-spam.sieve`, and report-ham.sieve), and reload Dovecot
# (`doveadm reload`).
protocol imap {{
  mail_plugins = $mail_plugins imap_sieve
}}
plugin {{
  sieve_plugins = sieve_imapsieve sieve_extprograms
  sieve_global_extensions = +vnd.dovecot.pipe +vnd.dovecot.environment
  sieve_pipe_bin_dir = {folder}

  # into {junk}: learned as spam (a MOVE and a COPY are both cause COPY)
  imapsieve_mailbox1_name = {junk}
  imapsieve_mailbox1_causes = COPY
  imapsieve_mailbox1_before = file:{folder}/report-spam.sieve

  # out of {junk} into any other folder: learned as ham (a trash folder, {unsure}: nothing; see the script)
  imapsieve_mailbox2_name = *
  imapsieve_mailbox2_from = {junk}
  imapsieve_mailbox2_causes = COPY
  imapsieve_mailbox2_before = file:{folder}/report-ham.sieve

  # out of {unsure} (where unsure mail is filed) into any other folder: learned as ham (into {junk}: spam)
  imapsieve_mailbox3_name = *
  imapsieve_mailbox3_from = {unsure}
  imapsieve_mailbox3_causes = COPY
  imapsieve_mailbox3_before = file:{folder}/report-ham.sieve
}}
"""


def files(spamnb, folder: str = DEFAULT_DIR, junk: str = "Junk", unsure: str = "Unsure") -> dict:
    """``{file name: (mode, text)}`` of what goes into ``folder``."""
    return {"report-spam.sieve": (0o644, report_spam()), "report-ham.sieve": (0o644, report_ham(junk, unsure)),
            PIPE: (0o755, pipe_program(spamnb)), CONF: (0o644, conf(folder, junk, unsure))}


#: Why what the pipe program runs, and the folder it is in, must be ours or root's.
EVERY_USER = "Dovecot runs it as every mail user, so it must be yours or root's and writable by nobody else"


def check_command(spamnb, package=None) -> None:
    """ValueError (one line: the path and why) unless nobody but root and the user running
    this can change what ``spamnb`` runs: the ``spamnb`` script, or the interpreter and
    spamnb's package folder (``package``: this one) for :data:`MODULE`, each with every
    folder above it and every link on the way (:func:`spamnb.storage.store.trusted_path`).
    For :data:`MODULE`, the interpreter run as Dovecot runs it (no PYTHONPATH, another
    folder) must also import this very package."""
    import subprocess

    from spamnb.storage.store import trusted_path

    words = [os.fspath(w) for w in command(spamnb)]
    if not words or not os.path.isabs(words[0]):
        raise ValueError(f"spamnb's command {shlex.join(words)!r} does not start with a full path")
    if tuple(words[1:]) == MODULE:
        trusted_path(words[0], "the Python interpreter", EVERY_USER)
        package = package or _package()
        real = trusted_path(package, "spamnb's package folder", EVERY_USER)
        probe = [words[0], "-I", "-c", "import os, spamnb; print(os.path.dirname(os.path.realpath(spamnb.__file__)))"]
        try:
            found = subprocess.run(probe, cwd="/", env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                                   timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            raise ValueError(f"cannot run {words[0]}: {exc}") from None
        if found != real:
            raise ValueError(f"{shlex.join(words)}, run as Dovecot runs it (no PYTHONPATH, not in this folder), "
                             f"imports {found or 'no spamnb'}, not {real}: install spamnb for {words[0]}, or run "
                             "setup --imapsieve with the spamnb script")
    elif len(words) == 1:
        real = trusted_path(words[0], "spamnb", EVERY_USER)
        if not (os.path.isfile(real) and os.access(real, os.X_OK)):
            raise ValueError(f"spamnb {words[0]} is not a program that can be run")
    else:
        raise ValueError(f"spamnb's command {shlex.join(words)!r} is neither one path nor an interpreter with "
                         f"{' '.join(MODULE)}")


def check_mail_user(spamnb, package=None) -> None:
    """ValueError (one line: what is in the way, and what to do) unless a mail user can run
    what ``spamnb`` names: Dovecot runs it as each of them, and a learn that cannot run
    spamnb fails for every move (:func:`spamnb.delivery.mailuser.check`)."""
    from spamnb._version import __version__
    from spamnb.delivery import mailuser

    words = [os.fspath(w) for w in command(spamnb)]
    mailuser.check(words, package or _package(), __version__)


def _package() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def install(folder: str, spamnb, junk: str = "Junk", *, check_runs: bool = True) -> tuple:
    """Write :func:`files` into ``folder`` (made 0755 where missing): ``(its real path,
    [(path, written)])``, written False where a file was there already (never replaced:
    an admin's edits stay). The settings name the real path.

    Dovecot runs what is in ``folder`` as every mail user (``sieve_pipe_bin_dir``), and
    compiles the scripts beside them: ValueError, and nothing written, when what
    ``spamnb`` names could be changed by another user (:func:`check_command`), when the
    folder or any folder above it (a sticky one aside: others can add names there, not
    replace ours), or a file kept there, is not ours or root's or others may write to it
    (the folder itself not even sticky: they could create a file there before we or
    ``sievec`` do), or when the way to it goes through a link another user could change.
    Each folder is opened from the one above without following a link and checked on its
    descriptor, one made here too, and the files are written through that descriptor.
    ``check_runs``: also refuse, before anything is made, a spamnb a mail user cannot run
    (:func:`check_mail_user`)."""
    from spamnb.storage.store import open_trusted_folder, owner_problem

    check_command(spamnb)
    if check_runs:
        check_mail_user(spamnb)
    fd, real = open_trusted_folder(os.path.abspath(folder), "the IMAPSieve folder", EVERY_USER)
    try:
        written = files(spamnb, real, junk)
        for name in written:
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            path = os.path.join(real, name)
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise ValueError(f"{path} is neither a folder nor a regular file")
            problem = owner_problem(path, st)
            if problem:
                raise ValueError(f"{problem}; {EVERY_USER}")
        done = []
        for name, (mode, text) in written.items():
            path = os.path.join(real, name)
            try:
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=fd)
            except FileExistsError:
                done.append((path, False))
                continue
            with os.fdopen(out, "w") as f:
                os.fchmod(f.fileno(), mode)  # the umask may have taken bits (a group-readable 0644)
                f.write(text)
            done.append((path, True))
        return real, done
    finally:
        os.close(fd)
