"""``spamnb setup``: a guided first hour, from the mail the user already sorted.

The steps are :mod:`spamnb.delivery.setup`'s; this module asks and says.
"""

from __future__ import annotations

import os
import sys
import time

import click

from spamnb.cli.options import notice, option

READ_ONLY = "spamnb setup only reads your mail: it never moves, deletes or changes a message."


def _age(days):
    if days >= 730:
        return f"{days / 365.25:.1f} years"
    return "1 day" if round(days) == 1 else f"{days:.0f} days"


def _days(days):
    return "1 day" if days == 1 else f"{days:g} days"


def _show_folders(folders, now, young_days):
    said = {"spam": "spam (a junk folder)", "ham": f"ham (older than {_days(young_days)})",
            "skip": "left out (trash, drafts)"}
    width = max(len(f.name) for f in folders)
    for f in folders:
        ages = f.ages(now)
        span = f"newest {_age(min(ages))} old, oldest {_age(max(ages))}" if ages else "empty"
        click.echo(f"  {f.name:<{width}}  {len(f.messages):>6} messages  {span:<36}  -> {said[f.role]}")
    for f in folders:
        if f.times_from:
            read = " and ".join(f"{n} from their {where}s" for where, n in sorted(f.times_from.items()))
            click.echo(f"  {f.name}: ages read {read}, as their files are newer (copied or restored without "
                       "their times?)")


def _pct(value):
    v, low, high = value
    return f"{v:.1f}% (95% interval {low:.1f}-{high:.1f}%)"


def _finite(ctx, param, value):
    """A number of days: nan and inf pass FloatRange's bounds, and would learn all or nothing."""
    if value is not None and not value - value == 0:
        raise click.BadParameter(f"{value} is not a number of days")
    return value


@click.command()
@click.option("--yes", "-y", is_flag=True, help="Ask nothing (for scripts): learn what is proposed, write the "
                                                 "configuration; an existing model of yours is kept.")
@click.option("--delivery", type=click.Choice(["procmail", "maildrop", "sieve", "imap"]),
              help="The recipe to give (default: guessed from ~/.mailfilter, ~/.dovecot.sieve, an IMAP "
                   "account in the configuration; else procmail).")
@click.option("--install", is_flag=True,
              help="Write the recipe to its file (~/.procmailrc, ~/.mailfilter, ~/.dovecot.sieve, or the systemd "
                   "user unit) when that file does not exist yet; an existing one is never changed. Also make the "
                   "Maildir++ folders the recipe files into (.Junk, .Unsure) when missing.")
@click.option("--no-unsure-folder", "no_unsure", is_flag=True,
              help="Leave unsure mail in INBOX: the recipe files only spam (by default it files unsure mail "
                   "into a folder of its own, .Unsure, made by --install when missing).")
@click.option("--min-age", "young_days", type=click.FloatRange(min=0), metavar="DAYS", callback=_finite,
              help="Learn kept mail as ham only when it arrived at least DAYS days ago (default 3: newer mail "
                   "may not be read, let alone sorted yet); 0 learns it all.")
@option("model_path", "model", command="setup")
@click.option("--imapsieve", "imapsieve_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="For a Dovecot server's administrator: write the IMAPSieve scripts and settings that learn "
                   "each user's moves into and out of Junk into DIR (e.g. /etc/dovecot/sieve-spamnb; files "
                   "there are kept), say what to add to dovecot.conf, and do nothing else. Refuses DIR, or the "
                   "spamnb it names, when another user could change them or a folder above them, and a "
                   "spamnb a mail user cannot run (as root: tried as Dovecot's mail_uid, else nobody).")
@click.pass_context
def setup(ctx, yes, delivery, install, no_unsure, young_days, model_path, imapsieve_dir):
    """Start from your own mail: find it, learn it, estimate, and give the recipe.

    Finds your mail (~/Maildir with its .Junk or Spam folder, MH folders
    and mbox files in ~/Mail or ~/mail, /var/mail/$USER) and says what is
    there. It proposes to learn what you filed as junk as spam, and the mail
    you kept (INBOX, Archive, Sent, ...) for more than 3 days (--min-age) as
    ham, except what the default model calls spam, which it lists for you to
    sort. A message's age is its file's time, or, when that is newer, the
    time its Maildir file name starts with (a name without one: its Date
    field), so that a copy which lost the files' times is judged by when the
    mail came; setup says when it did so. It
    estimates by 10-fold cross-validation how well a model of your own mail
    does on it, with an interval, trains that model as `spamnb train`
    does, writes [model] path to ~/.config/spamnb/config.toml, and prints the
    delivery recipe with spamnb's full path (--install writes it). The recipe
    files spam into your junk folder and unsure mail into .Unsure (Unsure for
    Sieve and IMAP; --no-unsure-folder: it stays in INBOX); --install makes
    the folders it names when missing.

    With fewer than 30 ham or 10 spam sorted it trains nothing: it says how
    many more to sort, and the default model stays in use until then.

    It never moves, deletes or changes a message.

    \b
    Examples:
      spamnb setup
      spamnb setup --yes --delivery maildrop
      spamnb setup --install
      spamnb setup --install --no-unsure-folder --min-age 7
    """
    from spamnb.delivery import setup as lib
    from spamnb.model import SpamModel
    from spamnb.storage import modelfile, settings
    from spamnb.storage.where import own_backend

    if imapsieve_dir:
        _imapsieve(lib, imapsieve_dir)
        return
    home = os.path.expanduser("~")
    now = time.time()
    young_days = lib.HAM_MIN_AGE_DAYS if young_days is None else young_days
    ask = (lambda text, default=True: True) if yes else \
        (lambda text, default=True: click.confirm(text, default=default))
    click.echo(READ_ONLY)
    imap_host = _imap_setting(ctx, "train", "host")

    folders = lib.find_mail(home, now=now, young_days=young_days)
    if folders:
        click.echo("\nYour mail:")
        _show_folders(folders, now, young_days)
    else:
        click.echo("\nNo mail found in ~/Maildir, ~/Mail, ~/mail or /var/mail.")
    if imap_host:
        click.echo(f"\nAn IMAP account is configured ({imap_host}): learn from it with\n"
                   "  spamnb imap train --ham INBOX --spam Junk   (read-only)")

    trained = False
    if folders:
        screen = None
        if any(f.messages for f in folders if f.role == "ham"):  # no ham: nothing to screen
            notice("screening your ham with the default model...")
            screen = modelfile.load_model(modelfile.cache_default(notice=notice))
        proposal = lib.propose(folders, screen=screen, now=now, young_days=young_days)
        click.echo(f"\nProposed: learn {len(proposal.ham)} ham and {len(proposal.spam)} spam.")
        if proposal.young:
            click.echo(f"  left out: {proposal.young} messages younger than {_days(young_days)} "
                       "(perhaps not sorted yet; --min-age changes it)")
        if proposal.doubtful:
            click.echo(f"  left out: {len(proposal.doubtful)} kept messages the default model calls spam; "
                       "sort them yourself (move spam to your junk folder) and run setup again:")
            for source, p in proposal.doubtful[:20]:
                click.echo(f"    {lib.shown(source, home)}  (P(spam) {p:.3f})")
            if len(proposal.doubtful) > 20:
                click.echo(f"    ... and {len(proposal.doubtful) - 20} more")
        trained = _learn(proposal, lib, SpamModel, modelfile, own_backend, model_path, yes, ask)
    if trained:
        path = str(modelfile.own_model_path(model_path))
        config_file = os.path.join(settings.config_home(), "config.toml")
        if ask(f"Write [model] path to {config_file}?"):
            click.echo(lib.write_config(config_file, path))
    kind = delivery or lib.delivery_of(home, imap_host)
    _recipe(lib, kind, home, folders, install, None if no_unsure else lib.UNSURE_FOLDER,
            _imap_setting(ctx, "filter", "unsure_folder"))
    _learning_from_moves(lib, kind, home, folders, install)
    click.echo(f"\nDone. {READ_ONLY}")


def _imap_setting(ctx, command, key):
    """A setting of ``spamnb imap COMMAND`` from the configuration (imap.toml too), as the
    one resolver gives it to that command (:func:`spamnb.storage.settings.resolve`), or None."""
    from spamnb.storage import settings

    try:
        return settings.resolve(f"imap {command}", named=ctx.find_root().params.get("config_file"),
                                names=(key,))[key].value
    except ValueError:  # a file the imap command will refuse with FILE:LINE: nothing to propose from
        return None


def _learn(proposal, lib, SpamModel, modelfile, own_backend, model_path, yes, ask) -> bool:
    """Estimate and train when enough is sorted; say how much more otherwise. True when trained."""
    if not proposal.enough:
        click.echo(f"\nToo little sorted mail for a model of your own: sort {proposal.shortfall()}, then run "
                   f"spamnb setup again. With {lib.MIN_HAM} ham and {lib.MIN_SPAM} spam of their own, users' "
                   "models beat the default one on their later mail; until then the default model is used.")
        return False
    target = modelfile.own_model_path(model_path)
    if target.exists():
        if yes:
            click.echo(f"\nYou have a model at {target}: setup keeps it (run setup without --yes to replace it).")
            return False
        if not click.confirm(f"\nYou have a model at {target} (with what it learned since). Replace it?",
                             default=False):
            return False
    elif not ask("\nTrain a model of your own on them?"):
        return False
    notice("cross-validating on your mail...")
    est = lib.estimate(proposal, SpamModel)
    c = est["confusion"]
    click.echo(f"\nEstimated on your own mail ({est['folds']}-fold cross-validation, {c.n_ham} ham, "
               f"{c.n_spam} spam):\n"
               f"  ham not left in the inbox (unsure or spam): {_pct(est['ham_misfiled_pct'])}\n"
               f"  spam caught:                                {_pct(est['spam_caught_pct'])}\n"
               "  (the interval is what this many messages can show; more sorted mail narrows it)")
    backend = own_backend(str(target), None)
    done = lib.train(proposal, SpamModel(), backend)
    click.echo(f"trained on {done['learned']} messages; saved to {backend.name}")
    if proposal.shortfall(lib.FIRST_DAY_HAM, lib.FIRST_DAY_SPAM):
        click.echo(f"In the first days, move what it misfiles or leaves unsure soon: with fewer than "
                   f"{lib.FIRST_DAY_HAM} ham and {lib.FIRST_DAY_SPAM} spam learned, each correction counts "
                   "(spam left in your inbox is learned as ham until you move it).")
    return True


def _junk(home, folders):
    """The user's Maildir++ junk folder (``.Junk``, ``.Spam``...) found in ~/Maildir, or None."""
    return next((os.path.basename(f.path) for f in folders
                 if f.role == "spam" and f.kind == "maildir" and os.path.dirname(f.path) ==
                 os.path.join(home, "Maildir")), None)


def _recipe(lib, kind, home, folders, install, unsure, imap_unsure):
    spamnb = lib.command_path(sys.argv[0], sys.executable)
    junk = _junk(home, folders) or ".Junk"
    # IMAP settings that name an unsure folder already: the unit needs no option for it
    target, text = lib.recipe(kind, spamnb, home, junk, None if kind == "imap" and imap_unsure else unsure)
    shown = lib.shown(target, home)
    click.echo(f"\nThe {kind} recipe, for {shown}:\n")
    click.echo(text)
    if kind == "imap":
        click.echo("then: systemctl --user daemon-reload && systemctl --user enable --now spamnb-imap")
    if unsure:
        where = {"imap": imap_unsure or unsure.lstrip("."), "sieve": unsure.lstrip(".")}.get(kind, unsure)
        click.echo(f"Unsure mail goes to {where}: look there now and then, and sort it as the mail you correct "
                   "(docs/setup.md, \"Correcting it\"); setup --no-unsure-folder leaves it in INBOX.")
    if install:
        if lib.write_new(target, text):
            click.echo(f"wrote {target}")
        else:
            click.echo(f"{target} exists: setup leaves it as it is; add the recipe above to it yourself")
        for line in lib.make_folders(home, [junk] + ([unsure] if unsure else []), kind):
            click.echo(line)
    elif kind != "imap":
        click.echo(f"(spamnb setup --install writes it when {shown} does not exist yet, and makes its folders)")


def _learning_from_moves(lib, kind, home, folders, install):
    """How the user's corrections are learned with a local Maildir: the learn-moves timer
    (written with --install), and on Dovecot the administrator's IMAPSieve."""
    from spamnb.delivery import maildir_moves

    if kind == "imap":  # imap filter learns from the moves itself
        return
    spamnb = lib.command_path(sys.argv[0], sys.executable)
    junk = _junk(home, folders) or ".Junk"
    click.echo(f"\nYour corrections: move a message the filter got wrong into {junk} (it is learned as spam) "
               "or out of it into another folder but Trash (ham). `spamnb learn-moves` learns those moves; "
               "a systemd user timer runs it every 10 minutes:")
    folder = os.path.join(home, ".config", "systemd", "user")
    for name, text in maildir_moves.units(spamnb, junk).items():
        path = os.path.join(folder, name)
        if not install:
            click.echo(f"  {lib.shown(path, home)}")
        elif lib.write_new(path, text):
            click.echo(f"  wrote {path}")
        else:
            click.echo(f"  {path} exists: setup leaves it as it is")
    if not install:
        click.echo("  (spamnb setup --install writes them; contrib/systemd/user has them too)")
    click.echo(f"then: {spamnb} learn-moves        # once now: it records your Maildir\n"
               "      systemctl --user daemon-reload && systemctl --user enable --now spamnb-learn-moves.timer\n"
               f"(or from cron: */10 * * * * {spamnb} learn-moves -q)")
    if kind == "sieve":
        click.echo("On a Dovecot server, your administrator can have Dovecot learn each move as you make it "
                   "instead (IMAPSieve: settings in dovecot.conf, for all users at once; a user cannot set "
                   "them up): `spamnb setup --imapsieve /etc/dovecot/sieve-spamnb`, run as root, writes them "
                   "(docs/delivery.md).")


def _imapsieve(lib, folder):
    """``--imapsieve DIR``: write Dovecot's IMAPSieve files for the administrator, and say what next."""
    from spamnb.delivery import imapsieve

    spamnb = lib.command_words(sys.argv[0], sys.executable)
    try:
        folder, done = imapsieve.install(folder, spamnb)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    for path, written in done:
        click.echo(f"wrote {path}" if written else f"{path} exists: left as it is")
    click.echo(f"""
Then, as root on the mail server (Debian: apt-get install dovecot-sieve):
  cp {folder}/{imapsieve.CONF} /etc/dovecot/conf.d/
  # merge it with your settings if you set mail_plugins, sieve_plugins, sieve_global_extensions
  # or imapsieve_mailbox1 to 3 elsewhere (doveconf -n shows them)
  sievec -c {folder}/{imapsieve.CONF} {folder}/report-spam.sieve
  sievec -c {folder}/{imapsieve.CONF} {folder}/report-ham.sieve
  doveadm reload
(sievec -c: the scripts compile with the settings file itself, whatever dovecot.conf holds.)
Each user's moves into and out of Junk are then learned into their own model, as
that user (a model of their own first: spamnb setup). A failing learn never blocks
or undoes the move (Dovecot stops a slow one after sieve_pipe_exec_timeout): the
message is kept in the user's ~/.local/state/spamnb/learn-queue/ and learned by
their next move, or by `spamnb learn-queue` (a timer: docs/delivery.md). Each
learn, queued learn and drop is a line in their ~/.local/state/spamnb/learn.log
(and syslog: journalctl -t spamnb-learn); a failure is one in Dovecot's log too.
A user without a home of their own in the userdb (virtual users under one uid) learns
nothing, so that no model is shared: give each a home (mail_home = /var/vmail/%d/%n).""")
