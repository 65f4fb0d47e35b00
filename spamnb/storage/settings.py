"""Configuration files: where they are, who may write them, what they say, and which one wins.

One TOML file format (``tomllib``) in tables (``[model]``, ``[decision]``,
``[filter]`` and the others: each row of :data:`spamnb.options.TABLE` names its
table), read in this order, a later one overriding an earlier one key by key:

1. built-in defaults (the commands' own);
2. the system file ``/etc/spamnb/spamnb.toml`` (``$SPAMNB_SYSTEM_CONFIG`` names
   another, for packagers and tests);
3. the user file ``$XDG_CONFIG_HOME/spamnb/config.toml`` (``~/.config/...``),
   then ``spamnb imap``'s older ``imap.toml`` beside it, read as its ``[imap]`` table;
4. the file named by the global ``--config FILE``, else by ``$SPAMNB_CONFIG``;
5. the environment variables spamnb read before it had files (:data:`ENV`);
6. command-line options.

This module reads the files 2-4, knows 5, and orders all six in the one
resolver, :func:`resolve`, which every entrance calls (the fast paths too, so
every way of answering applies the same settings). Which keys exist, and what
kind, choices and bounds each has, is :data:`spamnb.options.TABLE`'s; a value's
checks are :func:`spamnb.options.check`'s. ``os`` only at import; ``tomllib`` is
imported only when a file is there.

A configuration file follows the trust rules of a model file
(:func:`spamnb.storage.store.trust_problem`): owned by the user or root, not
writable by group or others, nor its folder. It may be readable by anyone (the
service user reads the system file); the IMAP table's password is never in
it, only where to get it.
"""

import os

from spamnb import options as _table
from spamnb.storage import locate

SYSTEM_FILE = "/etc/spamnb/spamnb.toml"

#: Environment variables that set a key, over every file (as they did before files):
#: the ``env`` of the rows of :data:`spamnb.options.TABLE`.
ENV = {(r.table, r.key): r.env for r in _table.TABLE if r.env}

#: Names of the sources, in the order they override each other.
DEFAULT, SYSTEM, USER, IMAP_FILE, NAMED, ENVIRONMENT, OPTION = (
    "default", "system file", "user file", "imap file", "config file", "environment", "option")


class ConfigError(ValueError):
    """A configuration file that cannot be used: ``FILE:LINE: what is wrong``."""


def config_home(env=os.environ) -> str:
    return locate.xdg_home("config", env)


def files(env=os.environ, named=None) -> list:
    """``(source, path, must_exist)`` of the files read, in order (module docstring)."""
    home = config_home(env)
    out = [(SYSTEM, env.get("SPAMNB_SYSTEM_CONFIG") or SYSTEM_FILE, False),
           (USER, os.path.join(home, "config.toml"), False),
           (IMAP_FILE, os.path.join(home, "imap.toml"), False)]
    named = named or env.get("SPAMNB_CONFIG")
    if named:
        out.append((NAMED, os.path.expanduser(named), True))
    return out


def key_lines(text: str) -> dict:
    """``{(table, key): line}`` of a TOML text: where each key is written, for
    errors that name FILE:LINE (``tomllib`` keeps no positions). Plain
    ``[table]`` headers and ``key = value`` lines, as a configuration file has them."""
    lines, table = {}, ""
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("[") and not s.startswith("[["):
            table = s[1:s.find("]")].strip().strip('"') if "]" in s else table
            lines.setdefault((table, None), n)
        elif "=" in s and not s.startswith("#"):
            key = s.split("=", 1)[0].strip().strip('"').strip("'")
            if "." in key and not table:  # dotted key at the top: decision.spam_cutoff = ...
                t, _, key = key.partition(".")
                lines.setdefault((t.strip(), key.strip()), n)
            else:
                lines.setdefault((table, key), n)
    return lines


def trusted(path: str, st) -> bool:
    """Whether a configuration file passes the model files' trust rule."""
    from spamnb.storage.store import trust_problem

    return trust_problem(os.path.realpath(path), st, "configuration file") is None


def read(path: str, *, must_exist=False, flat_table=None):
    """``(tables, lines)`` of the file at ``path`` (``({}, {})`` when absent and not
    ``must_exist``). ``flat_table``: a file of plain keys read as that table
    (the older ``imap.toml``). ConfigError for an unreadable, untrusted or
    malformed file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if must_exist:
            raise ConfigError(f"{path}: no such configuration file") from None
        return {}, {}
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    if not trusted(path, st):
        raise ConfigError(f"{path}: refusing to read a configuration file that others could change: it "
                          f"must be owned by you or root and not writable by group or others, nor its folder "
                          f"(chmod go-w)")
    import tomllib

    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        where = str(exc)
        line = where.rsplit("line ", 1)[-1].split(",")[0] if "line " in where else "1"
        raise ConfigError(f"{path}:{line}: {where}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    lines = key_lines(text)
    if flat_table:
        data = {flat_table: {k.replace("-", "_"): v for k, v in data.items()}}
        lines = {(flat_table, k.replace("-", "_")): n for (t, k), n in lines.items() if k}
    return data, lines


class Layers:
    """The files read, in order: ``value(table, key)`` is the last one's, the
    environment (:data:`ENV`) over all of them."""

    def __init__(self, layers, env=os.environ):
        self.layers = layers  # [(source, path, tables, lines)]
        self.env = env

    @classmethod
    def load(cls, env=os.environ, named=None, skip_errors=False):
        layers = []
        for source, path, must in files(env, named):
            try:
                tables, lines = read(path, must_exist=must, flat_table="imap" if source == IMAP_FILE else None)
            except ConfigError:
                if skip_errors:
                    continue
                raise
            if tables or must:
                layers.append((source, path, tables, lines))
        return cls(layers, env)

    def _sources(self):
        """``(source, path, {(table, key): (value, line)})`` of each layer, the most
        specific first: the environment, then the files from the last read."""
        env = {k: (self.env[var], None) for k, var in ENV.items() if self.env.get(var)}
        yield ENVIRONMENT, None, env
        for source, path, tables, lines in reversed(self.layers):
            yield source, path, _Keys(tables, lines)

    def where(self, table, key):
        """``(value, source, path, line)`` of a key, or None when nothing sets it. A key
        of a unit (:data:`spamnb.options.UNITS`: the decision, where the model is, the
        history) comes from the most specific layer naming any key of its unit, or
        from none: a user file's ``[model] path`` replaces a system file's ``[store] url``."""
        keys = _unit_keys(table, key)
        for source, path, found in self._sources():
            if any(k in found for k in keys):
                if (table, key) not in found:
                    return None
                value, line = found[(table, key)]
                return value, source, (f"${ENV[(table, key)]}" if path is None else path), line
        return None

    def conflicts(self):
        """``[(path, line, text)]``: a layer naming two places for the model, or a history
        file and no history (:data:`spamnb.options.EXCLUSIVE`): within one layer, the
        more specific layers having no say."""
        out = []
        for source, path, found in self._sources():
            for names, _ in _table.EXCLUSIVE:
                rows = [r for n in names for r in _table.TABLE if r.name == n and r.table
                        and (r.table, r.key) in found and found[(r.table, r.key)][0] not in (False, None, "")]
                rows = list({(r.table, r.key): r for r in rows if r.table != "imap"}.values())
                if len(rows) > 1:
                    said = " and ".join(f"${r.env}" if path is None else f"[{r.table}] {r.key}" for r in rows)
                    line = max((found[(r.table, r.key)][1] or 0) for r in rows) or None
                    what = "where the model is" if "store" in names else "the history"
                    out.append((path or "the environment", line, f"{said} both say {what}: keep one"))
        return out

    def get(self, table, key, default=None):
        found = self.where(table, key)
        return default if found is None or found[1] == ENVIRONMENT else found[0]

    def items(self):
        """``(path, table, key, value, line, table line)`` of every key of every file,
        in file order (a table that is not a table is itself an item, key None)."""
        for _, path, tables, lines in self.layers:
            for table, keys in tables.items():
                at = lines.get((table, None)) or lines.get(("", table))
                if not isinstance(keys, dict):
                    yield path, table, None, keys, at, at
                    continue
                for key, value in keys.items():
                    yield path, table, key, value, lines.get((table, key)) or at, at


class _Keys:
    """One file's ``{(table, key): (value, line)}``, looked up without copying it."""

    def __init__(self, tables, lines):
        self.tables, self.lines = tables, lines

    def __contains__(self, tk):
        t = self.tables.get(tk[0])
        return isinstance(t, dict) and tk[1] in t

    def __getitem__(self, tk):
        return self.tables[tk[0]][tk[1]], self.lines.get(tk)


def _unit_keys(table, key):
    row = _table.BY_KEY.get((table, key))
    unit = _table.unit_of(row.name) if row is not None and row.table != "imap" else None
    if unit is None:
        return ((table, key),)
    return tuple((r.table, r.key) for r in _table.TABLE if r.name in unit and r.table and r.table != "imap")


# -- the one resolver ----------------------------------------------------------------------


class Setting(tuple):
    """A value a command uses: ``(value, source, where)``; ``source`` one of the source
    names (:data:`OPTION`, :data:`ENVIRONMENT`, a file's, :data:`DEFAULT`), ``where``
    the option, ``$VARIABLE`` or ``FILE:LINE`` that set it (None for a default)."""

    __slots__ = ()

    def __new__(cls, value, source, where=None):
        return tuple.__new__(cls, (value, source, where))

    value = property(lambda self: self[0])
    source = property(lambda self: self[1])
    where = property(lambda self: self[2])


def resolve(command, given=None, env=os.environ, named=None, layers=None, names=None):
    """``{name: Setting}`` of every setting ``command`` (a command path: ``"filter"``,
    ``"imap filter"``) takes, as it will use it: ``given`` (the options on its command
    line, ``{name: value}``), then the environment, then ``--config``/``$SPAMNB_CONFIG``,
    then the user's file, then the system file (``layers``, read when None), then the
    default. The units of :data:`spamnb.options.UNITS` come whole from one layer: an
    option of the decision sets the whole decision; ``--model`` replaces a file's
    ``[store] url``. ValueError for options that exclude each other, ConfigError
    (``FILE:LINE: ...``) for a layer naming two places for the model or a value of a
    wrong type. ``names``: only these settings (a running server's decision). Every
    entrance calls it: the fast paths, spamd for a user's own file, a server
    rereading its files, ``setup`` and ``config`` directly, and every click command
    once per run (:func:`spamnb.cli.options.take_settings`)."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    _table.exclusive(given)
    if layers is None:
        layers = Layers.load(env, named)
    found = layers.conflicts()
    if found:
        path, line, text = found[0]
        raise ConfigError(f"{path}:{line}: {text}" if line else f"{path}: {text}")
    rows = {}
    for r in _table.TABLE:
        if r.takes(command) and (names is None or r.name in names):
            rows.setdefault(r.name, []).insert(0, r)  # the command's own table's key first
    out = {}
    for name, choices in rows.items():
        row = choices[-1]
        unit = _table.unit_of(name)
        from_option = [n for n in (unit or (name,)) if n in given]
        if from_option:
            flag = _flag_of(rows, from_option[0])
            out[name] = Setting(given.get(name), OPTION, flag)
            continue
        for row in choices:
            found = layers.where(row.table, row.key) if row.table else None
            if found is not None:
                break
        if found is None:
            out[name] = Setting(row.default, DEFAULT)
            continue
        value, source, path, line = found
        try:
            value = _table.convert(row, value)
        except ValueError as exc:
            raise ConfigError(f"{path}:{line}: [{row.table}] {row.key}: {exc}" if line else
                              f"{path}: {exc}") from None
        if source == ENVIRONMENT and row.kind == "path":
            value = os.path.expanduser(value)
        out[name] = Setting(value, source, f"{path}:{line}" if line else path)
    return out


def _flag_of(rows, name):
    return rows[name][-1].flags[0] if name in rows else None


def _naming(layers, names, given=()):
    """Who names any of the settings ``names``, the most specific first: ``[text]``."""
    out = [f"{table_flag} (option)" for table_flag in given]
    rows = [r for r in _table.TABLE if r.name in names and r.table and r.table != "imap"]
    for source, path, found in layers._sources():
        for r in rows:
            if (r.table, r.key) in found:
                line = found[(r.table, r.key)][1]
                out.append(f"${r.env} (environment)" if path is None else
                           f"[{r.table}] {r.key} from {path}" + (f":{line}" if line else ""))
    return out


def location(layers, given=()):
    """One line saying where the model a command uses is, and why: ``given``, the
    location's options on its command line (``["--model"]``). E.g. ``--model (option)
    replaces [store] url from /etc/spamnb/spamnb.toml:3``."""
    named = _naming(layers, _table.LOCATION, given)
    if not named:
        return ("where the model is: the default search ($XDG_DATA_HOME/spamnb/model.joblib, "
                "else the default model): no option, variable or file names it")
    return f"where the model is: {named[0]}" + (f" replaces {'; '.join(named[1:])}" if named[1:] else "")


def decision_note(layers, given=()):
    """One line saying that a configured decision overrides the model's stored cut-offs,
    or None. The decision is one unit: the line names every key of the one layer that
    supplies it (``given``: the decision options on the command line, ``["--spam-cutoff"]``),
    and the less specific layers whose decision keys it sets aside."""
    rows = [r for r in _table.TABLE if r.name in _table.DECISION and r.table == "decision"]
    said = []
    if given:
        said.append(f"{', '.join(given)} (options)")
    for source, path, found in layers._sources():
        keys = [(r, found[(r.table, r.key)]) for r in rows if (r.table, r.key) in found]
        if not keys:
            continue
        at = min((line for _, (_, line) in keys if line), default=None)
        head = getattr(found, "lines", {}).get(("decision", None))
        at = head if head and (at is None or head < at) else at
        what = ", ".join(f"{r.key} = {value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool)
                         else f"{r.key} = {value!r}" for r, (value, _) in keys)
        said.append(f"[decision] {what} from {path}" + (f":{at}" if at else ""))
    if not said:
        return None
    aside = f"; it sets aside {'; '.join(said[1:])}" if said[1:] else ""
    return f"the decision of {said[0]}, as one unit, overrides the model's stored cut-offs{aside}"


# -- the fast filter path's cache ----------------------------------------------------------
#
# `spamnb filter` runs once per delivery. Importing tomllib (with `typing` and `re`)
# and parsing costs it about a third more CPU through the server (measured with
# /usr/bin/time beside a run without a file), and checking every key is the click
# command's (:func:`spamnb.cli.config.problems`). So a click command that has read and checked the
# files keeps them in a marshal file (:func:`write_cache`), valid while every file,
# and its folder, has the same identity, owner and mode as when it was read (a chmod
# that makes one untrusted changes its ctime); the fast path reads only that
# (:func:`read_cache`) and leaves files it has not seen checked to the click command,
# so both answer alike for the same files. marshal is built in: nothing to import.


def cache_path(env=os.environ) -> str:
    return os.path.join(locate.xdg_home("cache", env), "config.cache")


def stamps(env=os.environ, named=None):
    """What the cache is valid for: each file's and its folder's identity, owner and mode."""
    out = []
    for _, path, _ in files(env, named):
        try:
            st, dst = os.stat(path), os.stat(os.path.dirname(os.path.abspath(path)))
        except OSError:
            out.append((path, None))
            continue
        out.append((path, (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_uid, st.st_mode,
                           dst.st_ino, dst.st_uid, dst.st_mode)))
    return out


def read_cache(env=os.environ):
    """The checked layers of the files as they are now, or None (no cache, or a file changed)."""
    import marshal

    try:
        fd = os.open(cache_path(env), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        saved, layers = marshal.loads(os.read(fd, 1 << 20))
    except (OSError, ValueError, EOFError, TypeError):
        return None
    finally:
        os.close(fd)
    return Layers(layers, env) if saved == stamps(env) else None


def checked_layers(env=os.environ):
    """For the fast paths: the files as the click command last read and checked them
    (:func:`read_cache`); empty :class:`Layers` when there are no files (a few stats, no
    TOML parser); None when only the click command can answer (files changed since)."""
    if not any(os.path.exists(path) for _, path, _ in files(env)):
        return Layers([], env)
    return read_cache(env)


def write_cache(layers, stamped, env=os.environ):
    """Keep ``layers`` (read and checked, the files as ``stamped`` before reading) for the fast path."""
    import marshal

    cache = cache_path(env)
    try:
        data = marshal.dumps((stamped, layers.layers))
        os.makedirs(os.path.dirname(cache), mode=0o700, exist_ok=True)
        tmp = f"{cache}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, cache)
    except (OSError, ValueError):  # a value marshal cannot keep (a TOML date), a read-only home: no cache
        pass


def decision(layers, command=None, given=None):
    """The decision the files give a deciding ``command`` (by default the first of them),
    over the decision options ``given`` on its command line, as the one resolver gives it
    (:func:`resolve`: one unit, from the most specific layer naming any of it), as one
    :class:`spamnb.verdict.Decision`. ConfigError as :func:`resolve`'s."""
    from spamnb.verdict import DECISION_OPTIONS, Decision

    found = resolve(command or _table.DECIDING[0], given or {}, env=layers.env, layers=layers,
                    names=DECISION_OPTIONS)
    return Decision.of({n: s.value for n, s in found.items()})


def command_line(command, args, env=os.environ, layers=None, only=None, arguments=None):
    """``{name: value}`` of every setting of a ``command`` command line for a fast path:
    the options (:func:`spamnb.options.parse`, from the table), then the environment and
    the configuration as the click command last read and checked it
    (:func:`checked_layers`), ordered by :func:`resolve`. None when only the click command
    can answer: an option or value the table's parser does not take, options that exclude
    each other, files changed since, or a setting outside ``only`` (the names that fast
    path implements) given or set to other than its default. ``arguments``: a list the
    command line's arguments are added to (none are taken without it)."""
    try:
        given = _table.parse(args, command, arguments=arguments)
    except (LookupError, ValueError):  # the click command says what is wrong
        return None
    if only is not None and any(name not in only for name in given):
        return None
    if layers is None:
        layers = checked_layers(env)  # no files, the usual case: a few stats, no TOML parser
    if layers is None:  # files the click command has not read and checked yet: it does, once
        return None
    try:
        resolved = resolve(command, given, env, layers=layers)
    except ValueError:  # two places for the model in one layer...: the click command says so
        return None
    rows = _table.rows_of(command)
    if only is not None and any(n not in only and s.value != rows[n].default for n, s in resolved.items()):
        return None
    return {**given, **{name: s.value for name, s in resolved.items()}}  # (given: switches no layer sets)
