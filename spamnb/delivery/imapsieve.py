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
  one journal record). It always exits 0 and writes one line to stderr, which
  Dovecot puts in its log: the move is done before the script runs, and a
  failing learn must neither block nor undo it;
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


def pipe_program(spamnb: str) -> str:
    """The program the Sieve scripts pipe a moved message to (``spamnb-learn spam|ham``)."""
    return f"""#!/bin/sh
# spamnb-learn spam|ham: learn the message on standard input into the mail
# user's own model. Piped to by report-spam.sieve and report-ham.sieve (Dovecot's
# IMAPSieve, vnd.dovecot.pipe); runs as the mail user, with their HOME.
#
# It always exits 0: the move is done before this runs, and a failing learn must
# neither block nor undo it. What it learned goes to syslog (`journalctl -t
# spamnb-learn`, or the mail log), a failure to stderr, which is Dovecot's log.
# The message goes through a private temporary file, so that `spamnb learn`
# takes its fast path (no numpy: a journal append).
SPAMNB={shlex.quote(spamnb)}
PATH=/usr/local/bin:/usr/bin:/bin
export PATH
case "$1" in
    spam|ham) label=$1 ;;
    *) echo "spamnb-learn: called with '$1', not spam or ham: nothing learned" >&2; exit 0 ;;
esac
umask 077
dir=$(mktemp -d "${{TMPDIR:-/tmp}}/spamnb-learn.XXXXXXXXXX") || {{
    echo "spamnb-learn: no temporary folder: the message is not learned as $label" >&2; exit 0; }}
trap 'rm -rf "$dir"' EXIT
trap 'exit 0' HUP INT TERM
if ! cat > "$dir/message"; then
    echo "spamnb-learn: cannot read the message: not learned as $label" >&2; exit 0
fi
who=${{USER:-$(id -un)}}
# In the background and waited for, so that Dovecot's SIGTERM (sieve_pipe_exec_timeout)
# ends this script at once rather than when spamnb is done.
"$SPAMNB" learn --"$label" "$dir/message" > "$dir/said" 2>&1 &
learner=$!
trap 'kill "$learner" 2>/dev/null; echo "spamnb-learn: $who: stopped by Dovecot (sieve_pipe_exec_timeout): not learned as $label" >&2; exit 0' HUP INT TERM
if wait "$learner"; then
    logger -t spamnb-learn -p mail.info -- "$who: $(cat "$dir/said")" 2>/dev/null || :
else
    echo "spamnb-learn: $who: learning as $label failed (the move is done): $(head -n 3 "$dir/said")" >&2
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
# as root (`sievec {folder}/report-spam.sieve`, and report-ham.sieve) and
# reload Dovecot (`doveadm reload`).
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


def files(spamnb: str, folder: str = DEFAULT_DIR, junk: str = "Junk", unsure: str = "Unsure") -> dict:
    """``{file name: (mode, text)}`` of what goes into ``folder``."""
    return {"report-spam.sieve": (0o644, report_spam()), "report-ham.sieve": (0o644, report_ham(junk, unsure)),
            PIPE: (0o755, pipe_program(spamnb)), CONF: (0o644, conf(folder, junk, unsure))}


def install(folder: str, spamnb: str, junk: str = "Junk") -> list:
    """Write :func:`files` into ``folder`` (made 0755 when missing): ``[(path, written)]``,
    written False where a file was there already (never replaced: an admin's edits stay).

    Dovecot runs what is in ``folder`` as every mail user (``sieve_pipe_bin_dir``), and
    compiles the scripts beside them: ValueError, and nothing written, when the folder
    or a file kept there is not ours or root's, or others may write to it (a sticky
    folder too: they could create a file there before we or ``sievec`` do)."""
    folder = os.path.abspath(folder)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    _check_safe(folder, os.stat(folder))
    for name in files(spamnb, folder, junk):
        try:
            _check_safe(os.path.join(folder, name), os.lstat(os.path.join(folder, name)))
        except FileNotFoundError:
            continue
    done = []
    for name, (mode, text) in files(spamnb, folder, junk).items():
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        except FileExistsError:
            done.append((path, False))
            continue
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), mode)  # the umask may have taken bits (a group-readable 0644)
            f.write(text)
        done.append((path, True))
    return done


def _check_safe(path, st):
    """ValueError unless ``path`` (its ``st``, a link not followed) is a folder or a regular
    file of ours or root's that nobody else may write to."""
    import stat

    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise ValueError(f"{path} is neither a folder nor a regular file")
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
        raise ValueError(f"{path} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}: Dovecot "
                         "runs what is there as every mail user, so it must be yours or root's and writable by "
                         "nobody else (chown root, chmod go-w)")
