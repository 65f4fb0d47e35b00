"""The table of settings: every option a site would set, its configuration key, its type,
its check, the commands that take it and whether it travels to the filter server.

Everything else is built from :data:`TABLE` or checked against it
(``tests/test_settings_table.py``): the configuration's keys
(:data:`spamnb.cli.config.KEYS`), the click options the commands share
(:func:`spamnb.cli.options.option`), the fast paths' parser (:func:`parse`),
the wire fields (:data:`TRAVELS`), the environment's variables (:func:`environment`),
the man pages and ``spamnb config``. Which value a command uses, from which layer, is
:func:`spamnb.storage.settings.resolve`'s.

A row's kind, choices and bounds are its value's rules, applied by one function each:
:func:`convert` (a file's value, the environment's, the command line's text: the
click options' type is built on it), :func:`within` (a number's bounds) and
:func:`check` (all of a file's value's rules, with its :data:`spamnb.checks.CHECKS`
entry). Its default is the one default: code that needs it reads the row.

Standard library only, at the bottom layer: the filter's fast path imports it.

To add a setting: one :class:`Row` here, then its use (the command's parameter;
for the decision, :mod:`spamnb.verdict`). A value that needs more than its kind,
choices and bounds is checked by :data:`spamnb.checks.CHECKS` under the same
``(table, key)``.
"""

from spamnb.verdict import DECISION_OPTIONS, LEARN_MARGIN


class Row:
    """One setting. ``name``: the commands' parameter; ``flags``: its option spellings
    (``off``: the spelling that turns a flag off, e.g. ``--no-log-messages``);
    ``table``/``key``: its configuration key (None: per invocation); ``kind``: str, path,
    int, float, bool, list or choice (``choices``); ``check``: the ``(table, key)`` of its
    :data:`spamnb.checks.CHECKS` entry, for a value that needs more than its kind, choices
    and bounds; ``commands``: the command paths that take it (:data:`EVERY`: all that
    have the parameter); ``travels``: sent with a message to the filter server; ``env``:
    the environment variable that sets it, and ``env_help`` what spamnb(1) says of it;
    ``help``: its help text, or ``{command: text}`` where commands use it differently;
    ``default``: the value when nothing sets it; ``low``/``high``: the bounds of a number,
    on the command line and in a file alike (:func:`within`); ``exists``: a path that must
    be there (kind ``folder``: a folder)."""

    __slots__ = ("name", "flags", "table", "key", "kind", "choices", "check", "commands", "travels", "env",
                 "env_help", "help", "default", "metavar", "off", "low", "high", "exists")

    def __init__(self, name, flags, table, key, kind, commands, *, choices=(), check=False, travels=False,
                 env=None, env_help="", help="", default=None, metavar=None, off=None, low=None, high=None,
                 exists=False):
        self.name, self.flags, self.table, self.key, self.kind = name, tuple(flags), table, key, kind
        self.commands, self.choices, self.travels, self.env = commands, tuple(choices), travels, env
        self.env_help = env_help
        self.check = (table, key) if check else None
        self.help, self.default, self.metavar, self.off = help, default, metavar, off
        self.low, self.high, self.exists = low, high, exists

    def takes(self, command):
        """Whether ``command`` (a command path: ``"filter"``, ``"imap filter"``) takes it."""
        return self.commands == EVERY or command in self.commands

    def help_for(self, command=None):
        """The help text of the option for ``command``."""
        if isinstance(self.help, dict):
            return self.help.get(command) or self.help.get(None, "")
        return self.help

    def __repr__(self):
        return f"Row({self.name!r}, [{self.table}] {self.key})"


EVERY = "*"
#: Commands the ``[decision]`` keys override the model's cut-offs for (``train`` is left
#: out on purpose: its decision options are the cut-offs it stores).
DECIDING = ("classify", "sort", "evaluate", "filter", "serve", "imap filter")
IMAP = ("imap train", "imap filter")
LOGGING = ("serve", "filter", "imap filter")
METRICS = ("serve", "imap filter")
HISTORY = ("serve", "filter", "imap filter", "web", "history", "learn", "forget", "learn-moves", "learn-queue")
NO_HISTORY = ("serve", "filter", "imap filter", "learn", "forget", "learn-moves", "learn-queue")


def _listen_row(name, flag, table, serving, more):
    """The row of the addresses a door of ``serve`` listens on (``[TABLE] listen``: --spamd,
    --milter): ``serving`` says what it does there, ``more`` follows the addresses."""
    return Row(name, (flag,), table, "listen", "list", ("serve",), check=True, metavar="ADDRESS",
               help=f"Also {serving}: HOST:PORT, a PORT on 127.0.0.1, or a Unix socket, unix:PATH or a path "
                    f"with a / (repeatable). {more}")


_DECISION_HELP = {
    "ham_cutoff": "Decide ham when P(spam|x) <= this.",
    "spam_cutoff": "Decide spam when P(spam|x) > this.",
    "cost_unsure": "Loss of holding a message as unsure.",
    "cost_fn": "Loss of letting a spam through (default 1).",
    "cost_fp": "Loss of filing a ham as spam (default 10).",
}

TABLE = (
    Row("model_path", ("--model",), "model", "path", "path", EVERY, env="SPAMNB_MODEL",
        env_help="The model commands use without --model; else $XDG_DATA_HOME/spamnb/model.joblib "
                 "(~/.local/share/spamnb/model.joblib), else the default model.",
        help={None: "Model file (default $SPAMNB_MODEL, else $XDG_DATA_HOME/spamnb/model.joblib).",
              "setup": "Where to save the model (default $SPAMNB_MODEL, else "
                       "$XDG_DATA_HOME/spamnb/model.joblib)."}),
    Row("allow_insecure_model", ("--allow-insecure-model",), "model", "allow_insecure", "bool", EVERY,
        travels=True, help="Load a model file that other users can write (administrators only: "
                           "a model file is code)."),
    Row("store", ("--store",), "store", "url", "str", EVERY, check=True, env="SPAMNB_STORE", metavar="URL",
        env_help="The store that keeps the model for commands without --store or --model "
                 "(redis://HOST:PORT/DB or another URL --store takes; docs/many-hosts.md).",
        help="Keep the model in a store shared by several hosts instead of a file: "
             "redis://HOST:PORT/DB, rediss:// (TLS), unix:///PATH or a Sentinel group, "
             "redis+sentinel://HOST:PORT,HOST:PORT/SERVICE/DB (rediss+sentinel:// with TLS, which "
             "Sentinels across hosts need), with ?prefix=NAME: "
             "(default $SPAMNB_STORE; docs/many-hosts.md)."),
    *(Row(name, ("--" + name.replace("_", "-"),), "decision", name, "float", DECIDING, travels=True,
          help=_DECISION_HELP[name]) for name in DECISION_OPTIONS),
    Row("socket_path", ("--socket",), "serve", "socket", "path", ("serve", "filter"), check=True,
        env="SPAMNB_SOCKET", metavar="PATH",
        env_help="The socket of spamnb serve; else $XDG_RUNTIME_DIR/spamnb/socket, else /tmp/spamnb-$UID/socket.",
        help={"serve": "Socket to listen on (default $SPAMNB_SOCKET, else $XDG_RUNTIME_DIR/spamnb/socket, "
                       "else /tmp/spamnb-$UID/socket; its folder is made mode 0700).",
              "filter": "Ask the `spamnb serve` server on this socket first (default $SPAMNB_SOCKET, else "
                        "$XDG_RUNTIME_DIR/spamnb/socket, else /tmp/spamnb-$UID/socket; used when it is there)."}),
    Row("max_bytes", ("--max-bytes",), "serve", "max_bytes", "int", ("serve",), default=64 * 1024 * 1024,
        low=1, help="Refuse messages larger than this (the client then filters them itself)."),
    Row("timeout", ("--timeout",), "serve", "timeout", "float", ("serve",), default=10.0, low=0.1,
        help="Drop a request that has not arrived whole within this many seconds (on every listener; a "
             "--metrics connection is closed then, whatever it sent)."),
    Row("max_connections", ("--max-connections",), "serve", "max_connections", "int", ("serve",), default=32,
        low=1,
        help="Requests served at once, per listener; a connection beyond them is closed at once (spamnb "
             "filter then filters the message itself). On a --spamd or --milter listener as many more wait up "
             "to 2 s for a slot, then are refused (spamd: SPAMD/1.0 75 EX_TEMPFAIL; the milter: closed, the "
             "MTA applies milter_default_action); any more at once."),
    Row("pidfile", ("--pidfile",), "serve", "pidfile", "path", ("serve",), check=True, metavar="PATH",
        help="Write the server's pid here once it listens (atomically; removed on exit). Refuses to start "
             "while a live server holds it."),
    _listen_row("spamd_addresses", "--spamd", "spamd", "serve SpamAssassin's spamc/spamd protocol here",
                "For spamc, Exim's spam= ACL, Haraka."),
    Row("allow", ("--allow",), "spamd", "allow", "list", ("serve",), check=True, metavar="CIDR",
        help="Networks whose clients may use --spamd and --milter on TCP besides this machine (repeatable); "
             "needed to listen on an address other than loopback."),
    Row("user_models", ("--user-models",), "spamd", "user_models", "folder", ("serve",), check=True,
        metavar="DIR", exists=True, help="spamd: the User: header picks DIR/USER/model.joblib when it exists; "
                                        "milter: a message's one recipient (its local part) does."),
    Row("store_users", ("--store-users",), "spamd", "store_users", "bool", ("serve",),
        help="spamd and milter, with --store: the User: header (the milter: a message's one recipient) picks "
             "that user's model in the store when there is one "
             "(put there with `spamnb store push MODEL URL --user NAME`)."),
    Row("allow_tell", ("--allow-tell",), "spamd", "allow_tell", "bool", ("serve",),
        help="spamd: let clients learn and forget messages (TELL, spamc -L) in their own --user-models "
             "model, as spamd's --allow-tell. From this machine User: must be the client's own user (root, "
             "the server's user, the system's accounts (an MTA's) and --spamd-trusted-user may name anyone)."),
    Row("allow_tell_served", ("--allow-tell-served",), "spamd", "allow_tell_served", "bool", ("serve",),
        help="spamd: TELL may also change the served model, which scores everyone without a model of their "
             "own (implies --allow-tell)."),
    Row("spamd_trusted_users", ("--spamd-trusted-user",), "spamd", "trusted_users", "list", ("serve",),
        check=True, metavar="NAME",
        help="spamd: a person's account (a uid from login.defs' UID_MIN to UID_MAX) that may name any user "
             "in User: (spamc -u), as root, the server's user and the system's accounts (an MTA's: nobody, "
             "Debian-exim) may (repeatable). Any other person's account may name only itself; a client of "
             "another host in --allow, any."),
    Row("spamd_max_bytes", ("--spamd-max-bytes",), "spamd", "max_bytes", "int", ("serve",),
        default=10 * 1024 * 1024, metavar="BYTES", low=1,
        help="spamd: refuse at once a message declared (or found) larger than this; spamc then passes it "
             "through unscanned (spamc's own -s limit is 500 KB by default). milter: a message larger than "
             "this or --max-bytes is accepted unscanned, never held beyond it."),
    Row("spamd_socket_mode", ("--spamd-socket-mode",), "spamd", "socket_mode", "str", ("serve",), check=True,
        default="0600", metavar="OCTAL",
        help="Mode of --spamd and --milter Unix sockets (0660: the socket's group may connect too; Postfix's "
             "smtpd connects as postfix)."),
    _listen_row("milter_addresses", "--milter", "milter", "speak the milter protocol (version 6) here, for "
                "Postfix's smtpd_milters and Sendmail's INPUT_MAIL_FILTER",
                "Who may connect: --allow; a message's one recipient picks its --user-models model."),
    Row("milter_reject", ("--milter-reject",), "milter", "reject", "bool", ("serve",),
        help="milter: refuse spam at the end of DATA (550 5.7.1) instead of tagging it; unsure mail is "
             "tagged, never refused."),
    Row("milter_on_error", ("--milter-on-error",), "milter", "on_error", "choice", ("serve",),
        choices=("accept", "tempfail"), default="accept",
        help="milter: a message that could not be scanned is accepted unscanned (accept), or refused for now "
             "with 451 4.3.0 (tempfail: the client sends it again later)."),
    Row("exit_zero", ("--exit-zero",), "filter", "exit_zero", "bool", ("filter",),
        help="Exit 0 for any classification (for procmail's :0fw)."),
    Row("learn_", ("--learn", "-u"), "filter", "learn", "bool", ("filter",), travels=True,
        help="Also learn the message as what it was classified, when not unsure and scored within "
             f"{LEARN_MARGIN:g} log-odds of the cut-off that decided it (a thick threshold)."),
    Row("evidence", ("--evidence",), "filter", "evidence", "int", ("filter",), default=0, metavar="N",
        low=0, help="Add an X-Spam-Evidence header with the N strongest tokens."),
    Row("log_messages", ("--log-messages",), "log", "messages", "bool", LOGGING, off="--no-log-messages",
        help="Write one line per message: time, verdict, score, cut-offs, size, milliseconds, user, "
             "Message-ID, whether it was learned."),
    Row("log_format", ("--log-format",), "log", "format", "choice", LOGGING, choices=("text", "json"),
        default="text", help="text: key=value pairs (grep verdict=spam); json: one object a line."),
    Row("log_to", ("--log-to",), "log", "to", "choice", LOGGING, choices=("stderr", "syslog"),
        default="stderr", help="stderr (journald keeps it under systemd) or syslog (facility mail)."),
    Row("metrics_address", ("--metrics",), "metrics", "listen", "str", METRICS, check=True, metavar="HOST:PORT",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics (a bare PORT: on 127.0.0.1; "
             "needs the metrics extra: pip install 'spamnb[metrics]')."),
    Row("metrics_allow", ("--metrics-allow",), "metrics", "allow", "list", METRICS, check=True, metavar="CIDR",
        help="Networks whose clients may read --metrics besides this machine (repeatable); "
             "needed to listen on an address other than loopback."),
    Row("history", ("--history",), "history", "path", "path", HISTORY, check=True, metavar="FILE",
        help={None: "Record each verdict in this SQLite file (default MODEL.history.sqlite, beside the model; "
                    "`spamnb web` shows it).",
              "web": "The history to show (default MODEL.history.sqlite, beside the model; with --store, the "
                     "store's: every host's verdicts).",
              "history": "The history to read (default MODEL.history.sqlite, beside the model, as `spamnb web` "
                         "shows; with --store, the store's: every host's verdicts)."}),
    Row("history_store", ("--history-store",), "history", "store", "bool", NO_HISTORY,
        help="Record each verdict in the model's store (--store URL), where `spamnb web --store URL` shows "
             "every host's: one history for a site."),
    Row("no_history", ("--no-history",), "history", "off", "bool", NO_HISTORY,
        help="Record nothing in the history."),
    Row("listen", ("--listen",), "web", "listen", "str", ("web",), check=True, default="127.0.0.1:8783",
        metavar="HOST:PORT", help="Where to listen (a PORT alone is on 127.0.0.1; port 0 picks a free one)."),
    Row("allow", ("--allow",), "web", "allow", "list", ("web",), check=True, metavar="CIDR",
        help="Networks whose browsers may connect besides this machine (repeatable); needed to listen on an "
             "address other than loopback. They still need the token."),
    Row("host", ("--host",), "imap", "host", "str", IMAP, check=True, help="IMAP server."),
    Row("port", ("--port",), "imap", "port", "int", IMAP, low=1, high=65535,
        help="Port (default 993 with tls, else 143)."),
    Row("user", ("--user",), "imap", "user", "str", IMAP, help="Login name."),
    Row("password_file", ("--password-file",), "imap", "password_file", "path", IMAP, check=True,
        help="A file whose first line is the password."),
    Row("password_command", ("--password-command",), "imap", "password_command", "str", IMAP, metavar="CMD",
        help="A command that prints the password (e.g. 'pass show mail/imap')."),
    Row("security", ("--security",), "imap", "security", "choice", IMAP, choices=("tls", "starttls", "none"),
        help="tls (the default, certificates checked), starttls, or none (127.0.0.1 only)."),
    Row("cafile", ("--cafile",), "imap", "cafile", "path", IMAP, check=True, exists=True,
        help="CA certificates to trust for the server's certificate (a self-signed one)."),
    Row("force_plaintext", ("--force-plaintext",), "imap", "force_plaintext", "bool", IMAP,
        help="Allow --security none to a host other than 127.0.0.1."),
    Row("model_path", ("--model",), "imap", "model", "path", IMAP,  # imap.toml's own key for the model
        help="Model file (default $SPAMNB_MODEL, else $XDG_DATA_HOME/spamnb/model.joblib)."),
    Row("ham", ("--ham",), "imap", "ham", "list", ("imap train",), metavar="FOLDER",
        help="A folder of ham (repeatable)."),
    Row("spam", ("--spam",), "imap", "spam", "list", ("imap train",), metavar="FOLDER",
        help="A folder of spam (repeatable)."),
    Row("folder", ("--folder",), "imap", "folder", "str", ("imap filter",),
        help="The folder to filter (default INBOX)."),
    Row("junk", ("--junk",), "imap", "junk", "str", ("imap filter",),
        help="Where spam goes (default: the folder with the \\Junk special use, else Junk; made when missing)."),
    Row("unsure_folder", ("--unsure-folder",), "imap", "unsure_folder", "str", ("imap filter",),
        help="Move unsure mail here too (default: it stays, unflagged)."),
    Row("interval", ("--interval",), "imap", "interval", "float", ("imap filter",), default=300.0,
        low=1, help="With --watch: seconds between passes when nothing arrives (your moves into and out of Junk "
                    "are seen at the next pass)."),
    Row("learn_verdicts", ("--learn-verdicts",), "imap", "learn_verdicts", "bool", ("imap filter",),
        off="--no-learn-verdicts", default=True,
        help="Also learn its own verdicts near the decision, as `spamnb filter -u` does (with a model of your "
             "own); your corrections are learned either way."),
)

#: ``{(table, key): row}``: the configuration's keys.
BY_KEY = {(r.table, r.key): r for r in TABLE if r.table}
#: ``{flag: [rows]}``: an option's rows (``--allow`` is serve's and web's).
BY_FLAG = {}
for _row in TABLE:
    for _flag in _row.flags + ((_row.off,) if _row.off else ()):
        BY_FLAG.setdefault(_flag, []).append(_row)
del _row, _flag

#: The units: settings a layer gives together or not at all. The most specific layer
#: (an option, the environment, a file) naming any of them supplies all of them; a
#: layer naming more than one of :data:`LOCATION` is a conflict.
DECISION = DECISION_OPTIONS
LOCATION = ("model_path", "store")
HISTORY_CHOICE = ("history", "history_store", "no_history")
UNITS = (DECISION, LOCATION, HISTORY_CHOICE)
#: Options that exclude each other on one command line: (names, the one-line error).
EXCLUSIVE = ((("model_path", "store"), "give --model or --store, not both"),
             (("history", "no_history"), "give --history FILE or --no-history, not both"),
             (("history", "history_store"), "give --history FILE or --history-store, not both"),
             (("history_store", "no_history"), "give --history-store or --no-history, not both"))
#: The settings whose values travel with a message to the filter server (:mod:`spamnb.delivery.wire`).
TRAVELS = tuple(dict.fromkeys(r.name for r in TABLE if r.travels))

#: The environment variables spamnb reads that are not a setting's (a setting's is its
#: row's ``env``): ``{variable: what spamnb(1) says of it}``. :func:`environment` lists both.
VARIABLES = {
    "SPAMNB_CONFIG": "A configuration file read after the system and user files, when the global --config "
                     "names none.",
    "SPAMNB_SYSTEM_CONFIG": "The system configuration file, read instead of /etc/spamnb/spamnb.toml "
                            "(for packagers and tests).",
    "SPAMNB_CORPUS": "The archive the default model is trained from, the first time it is needed "
                     "(default: the shipped corpora/spamassassin.tar.xz).",
    "SPAMNB_LOCK_TIMEOUT": "Seconds a writer waits for the model's lock (default 120; a learn during a "
                           "delivery, 10), this value for both when set.",
    "SPAMNB_DEBUG": "Set to 1: show the traceback of an error instead of its one line.",
}

#: Options of the site commands that have no key, and why: each is about one run.
PER_INVOCATION = {
    "filter": {},
    "serve": {},
    "imap filter": {"--watch": "whether this run keeps watching is the unit's or the shell's choice",
                    "--dry-run": "a rehearsal of one run",
                    "--config": "names the file itself"},
    "imap train": {"--config": "names the file itself"},
    "web": {"--verbose": "a debugging aid for one run"},
    "learn": {"--spam": "the label of the messages given", "--ham": "the label of the messages given",
              "--recursive": "how to read the folders given", "--strict": "how to read the folders given"},
    "forget": {"--spam": "the label of the messages given", "--ham": "the label of the messages given",
               "--recursive": "how to read the folders given", "--strict": "how to read the folders given"},
    "setup": {"--yes": "whether this run asks", "--delivery": "the recipe this run gives",
              "--install": "whether this run writes the recipe", "--no-unsure-folder": "the recipe this run gives",
              "--min-age": "which mail this run learns", "--imapsieve": "an administrator's run for a Dovecot server"},
    "learn-moves": {"--junk": "names a folder of the Maildir given", "--unsure-folder": "names a folder "
                    "of the Maildir given", "--dry-run": "a rehearsal of one run",
                    "--quiet": "how much one run says"},
    "learn-queue": {"--list": "what this run does", "--max-seconds": "how long this run may take (the pipe "
                    "program's budget)", "--quiet": "how much one run says"},
}
#: The options of :data:`PER_INVOCATION` that :func:`parse` reads too, for the fast paths:
#: ``{command: {flag: (name, value)}}``, a flag that sets ``name`` to ``value``.
SWITCHES = {command: {"--spam": ("label", "spam"), "--ham": ("label", "ham")} for command in ("learn", "forget")}


def unit_of(name):
    """The unit (:data:`UNITS`) ``name`` belongs to, or None."""
    return next((u for u in UNITS if name in u), None)


def rows_of(command):
    """``{name: row}`` of the settings ``command`` takes (a command path). For a name with
    two keys (``model_path``: ``[model] path`` and ``imap.toml``'s ``[imap] model``), the
    command's own table's row comes last and wins."""
    out = {}
    for r in TABLE:
        if r.takes(command):
            out[r.name] = r
    return out


def environment():
    """``[(variable, text)]`` of every environment variable spamnb reads, as spamnb(1)
    lists them: each setting's (its row's ``env``: it sets the setting over every
    configuration file, an option over it), then :data:`VARIABLES`."""
    out = [(r.env, f"{r.env_help} It sets [{r.table}] {r.key} over the configuration files; "
                   f"{r.flags[0]} over it.") for r in TABLE if r.env]
    return out + list(VARIABLES.items())


def exit_zero_given(args):
    """Whether a ``filter`` command line (or the whole one, after ``spamnb``) asks for
    ``--exit-zero``, read before anything else of it: a message that cannot be filtered
    (bad options, a configuration that cannot be read) still goes out with that status."""
    return any(flag in args for r in TABLE if r.name == "exit_zero" for flag in r.flags)


def convert(row, value, text=False):
    """``value`` for ``row`` as the command takes it: a file's (or the environment's)
    value of its TOML type, or (``text``) the command line's text, read as ``int()`` and
    ``float()`` read it; a choice one of the row's ``choices``. ValueError saying what is
    wrong. The one conversion of each kind: of the files (:func:`check`,
    :func:`spamnb.storage.settings.resolve`), of the fast paths' parser (:func:`parse`)
    and of the click options (:func:`spamnb.cli.options.option`). The bounds of a number
    are :func:`within`'s."""
    if text and isinstance(value, str):
        if row.kind == "int":
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"not an integer, got {value!r}") from None
        if row.kind == "float":
            try:
                return float(value)  # nan and inf too, as click's FLOAT reads them
            except ValueError:
                raise ValueError(f"not a number, got {value!r}") from None
    if row.kind == "list":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            raise ValueError(f"must be a list of strings, got {value!r}")
        return list(items)
    if row.kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value
    if row.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be an integer, got {value!r}")
        return value
    if row.kind == "float":
        import math

        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"must be a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {value!r}")
    if row.kind == "choice" and value not in row.choices:
        raise ValueError(f"must be one of {', '.join(map(repr, row.choices))}, got {value!r}")
    return value


def within(row, value):
    """``value``, a number of ``row``, when it is within the row's ``low`` and ``high``;
    ValueError saying the bounds otherwise: the one place a setting's bounds are applied,
    to a file's value (:func:`check`) and to the command line's (:func:`parse`, the click
    options)."""
    low, high = row.low, row.high
    if (low is not None and value < low) or (high is not None and value > high):
        span = (f"from {low} to {high}" if high is not None else f"at least {low}") if low is not None \
            else f"at most {high}"
        raise ValueError(f"must be {span}, got {value!r}")
    return value


def check(row, value):
    """A file's ``value`` for ``row`` as the command takes it, once it passes every rule
    of the row: its kind and choices (:func:`convert`), its bounds (:func:`within`), its
    check (:data:`spamnb.checks.CHECKS`, imported only for a row that has one); ValueError
    saying what is wrong. What ``config --check`` applies to a file and the commands at start."""
    value = within(row, convert(row, value))
    if row.check:
        from spamnb import checks

        checks.CHECKS[row.check](value)
    return value


def exclusive(given):
    """ValueError (the one-line error of :data:`EXCLUSIVE`) when ``given``, the names
    set on one command line (or in one layer), holds two that exclude each other."""
    for names, message in EXCLUSIVE:
        if all(given.get(n) not in (None, False) for n in names):
            raise ValueError(message)


def parse(args, command="filter", arguments=None):
    """``{name: value}`` of the options of a ``command`` command line, from the table
    (and the command's :data:`SWITCHES`); ValueError ``--opt VALUE: what is wrong`` for a
    bad value (:func:`convert`, :func:`within`) or options that exclude each other;
    LookupError for what the table does not parse (another option, a repeated option,
    ``--help``, an argument unless ``arguments``, a list the arguments are added to),
    which only the click command handles."""
    rows = rows_of(command)
    flags = {}
    for r in rows.values():
        for f in r.flags:
            flags[f] = (r, True)
        if r.off:
            flags[r.off] = (r, False)
    out = {}
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if arguments is not None and not arg.startswith("-"):
            arguments.append(arg)
            i += 1
            continue
        switch = SWITCHES.get(command, {}).get(arg)
        if switch is not None:
            if switch[0] in out:
                raise LookupError(arg)
            out[switch[0]] = switch[1]
            i += 1
            continue
        if name not in flags or (eq and name.startswith("-") and not name.startswith("--")):
            raise LookupError(arg)
        r, on = flags[name]
        if r.kind == "bool":
            if eq:
                raise LookupError(arg)
            value = on
        else:
            if r.kind == "list":
                raise LookupError(arg)  # repeatable: the click command
            if not eq:
                if i + 1 >= len(args):
                    raise LookupError(arg)
                i += 1
                value = args[i]
            try:
                value = within(r, convert(r, value, text=True))
            except ValueError as exc:
                raise ValueError(f"{name} {value}: {exc}") from None
        if r.name in out:
            raise LookupError(arg)
        out[r.name] = value
        i += 1
    exclusive(out)
    return out

