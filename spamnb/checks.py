"""The checks a setting's value must pass, once: what ``config --check`` applies
to a file and what every command applies at start are these same functions.

Standard library only, and nothing imported at module level beyond ``os``:
the filter's cold path may import this. Each check takes a value as a file or an
option gives it and returns it as the command uses it, or raises ``ValueError``
with a short sentence that names what is wrong (the caller adds FILE:LINE or the
option's name). A sentence never shows a store URL's password: :func:`redact`.

:data:`CHECKS` maps a configuration key ``(table, key)`` to its check, for the
keys whose value needs more than its row's kind, choices and bounds (those are the
row's own, in :mod:`spamnb.options`: :func:`spamnb.options.check` applies them, then
the check here); :data:`TOGETHER` the rules that take several keys at once (a
listener beyond loopback and who may connect to it).
"""

import os

LOOPBACK = ("127.0.0.0/8", "::1/128")
#: A Unix socket's path, in bytes, at most (``sun_path`` holds 108 with its NUL).
SOCKET_PATH_MAX = 107


def _text(value):
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def each(check):
    """The check of a list (a TOML array, a repeated option) whose every item passes ``check``."""
    def all_of(values):
        items = [values] if isinstance(values, str) else values
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"must be a list, got {values!r}")
        return [check(v) for v in items]
    return all_of


def local_user(name):
    """The name of a user this machine knows."""
    import pwd

    try:
        pwd.getpwnam(name)
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{name!r} is no user of this machine") from None
    return name


# -- listeners: addresses, networks, socket modes -------------------------------------------------


def listen_address(text, any_port=False):
    """``("unix", path)`` or ``("tcp", host, port)`` of a listener: a path (with a
    ``/``, or after ``unix:`` as Postfix writes it), ``HOST:PORT``, ``[V6]:PORT``, or a
    bare ``PORT`` on 127.0.0.1 (``any_port``: port 0 too, which picks a free one)."""
    _text(text)
    if text.startswith("unix:"):
        return ("unix", _unix_path(_text(text[5:])))
    if "/" in text:
        return ("unix", _unix_path(text))
    return ("tcp", *_host_port(text, any_port, "give HOST:PORT (a port from 1 to 65535), a port, or a socket path"))


def tcp_address(text, any_port=False):
    """``(host, port)`` of a TCP listener (``HOST:PORT``, ``[V6]:PORT``, a bare ``PORT``)."""
    _text(text)
    return _host_port(text, any_port, "give HOST:PORT (a port from 1 to 65535) or a port")


def _host_port(text, any_port, how):
    import ipaddress

    host, number_ = "127.0.0.1", text
    if text.startswith("["):
        host, _, number_ = text[1:].partition("]")
        number_ = number_[1:] if number_.startswith(":") else ""
    elif ":" in text:
        host, _, number_ = text.rpartition(":")
    if not number_.isdigit() or not (0 if any_port else 1) <= int(number_) < 65536:
        raise ValueError(f"{text}: {how}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise ValueError(f"{text}: the host must be an IP address (or localhost)") from None
        host = "127.0.0.1"
    return host, int(number_)


def network(text):
    """An ``ipaddress`` network of an address or CIDR (``10.0.0.0/8``; host bits may be set)."""
    import ipaddress

    try:
        return ipaddress.ip_network(_text(text), strict=False)
    except ValueError:
        raise ValueError(f"{text}: not an address or CIDR network") from None


def networks(values):
    return tuple(each(network)(values))


def loopback():
    """The loopback networks: who may always connect to a listener."""
    import ipaddress

    return tuple(ipaddress.ip_network(n) for n in LOOPBACK)


def exposure(host, allowed, allow):
    """Listening beyond loopback needs networks that may connect (as spamd's ``-A``);
    ``allow``: how the caller names them (``--allow CIDR``, ``[spamd] allow``)."""
    import ipaddress

    if not ipaddress.ip_address(host).is_loopback and not allowed:
        raise ValueError(f"{host} listens beyond this machine: say who may connect with {allow}")


def listening(addresses, allowed, allow, tcp_only=False):
    """``[listen_address(a)...]`` of ``addresses`` (a list, or one address), each one
    that listens beyond loopback with networks ``allowed`` (:func:`networks`'s) to let in."""
    found = each(tcp_address if tcp_only else listen_address)(addresses)
    for where in found:
        host = where[0] if tcp_only else (where[1] if where[0] == "tcp" else None)
        if host is not None:
            exposure(host, allowed, allow)
    return found


def socket_mode(text):
    """The mode of a Unix socket, octal text (``"0660"``) as the option takes it."""
    try:
        mode = int(text, 8) if isinstance(text, str) else -1
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise ValueError(f"{text!r} is not an octal mode (e.g. \"0660\")")
    return mode


# -- files and folders ---------------------------------------------------------------------------


def private_folder(folder):
    """A folder of ours that nobody else can enter (mode 0700), when it exists: where a
    private socket lives. Missing is fine (the server makes it)."""
    import stat

    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return folder
    except OSError as exc:
        raise ValueError(f"cannot read its folder {folder}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise ValueError(f"its folder {folder} must be a folder of yours with mode 0700 "
                         f"(it is {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid})")
    return folder


def existing_folder(path):
    """A folder that is there (``--user-models``: the users' models are looked up in it)."""
    if not isinstance(path, str) or not os.path.isdir(path):
        raise ValueError(f"{path}: no such folder")
    return path


def _if_there(path, fine, problem):
    """``path``; ValueError ``problem`` when something is there (a link not followed)
    whose mode ``fine(mode)`` refuses."""
    try:
        st = os.lstat(path)
    except OSError:
        return path
    if not fine(st.st_mode):
        raise ValueError(problem)
    return path


def _unix_path(text):
    """The absolute path of a Unix socket to listen on: one the kernel takes, and nothing
    but a socket there already (a stale one is replaced)."""
    import stat

    full = os.path.abspath(text)  # as the servers bind it
    if len(os.fsencode(full)) > SOCKET_PATH_MAX:
        raise ValueError(f"{text}: a Unix socket's path has at most {SOCKET_PATH_MAX} bytes")
    return _if_there(full, stat.S_ISSOCK, f"{text} exists and is not a socket")


def socket_path(path):
    """The private socket of ``serve`` (and of ``filter``, its client): a path a Unix
    socket can have, in a folder that is ours and mode 0700 (or not there yet)."""
    _text(path)
    private_folder(os.path.dirname(_unix_path(path)))
    return path


def pidfile(path):
    """Where ``serve --pidfile`` writes: a regular file when it is there already (a
    link is never followed)."""
    import stat

    return _if_there(_text(path), stat.S_ISREG, f"{path} is not a regular file")


def history_file(path):
    """The history's SQLite file: not a folder."""
    import stat

    return _if_there(_text(path), lambda mode: not stat.S_ISDIR(mode), f"{path} is a folder, not a history file")


def readable_file(path, shown=None):
    """A regular file we can read (a CA file, a client certificate); ``shown``: how the
    error names it (the path)."""
    _text(path)
    full, shown = os.path.expanduser(path), shown or path
    if os.path.isdir(full):
        raise ValueError(f"{shown} is a folder, not a file")
    try:
        with open(full, "rb"):
            pass
    except OSError as exc:
        raise ValueError(f"cannot read {shown}: {exc.strerror}") from None
    return path


def private_problem(st, shown, what):
    """Why a file whose ``os.stat`` is ``st`` cannot hold a secret (a password), or None:
    it must be a regular file of ours that nobody else can read or write (0600 or stricter)."""
    import shlex
    import stat

    if not stat.S_ISREG(st.st_mode):
        return f"{what} {shown} is not a regular file"
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return (f"{what} {shown} must be yours and mode 0600 (it is {stat.S_IMODE(st.st_mode):04o}, "
                f"owner uid {st.st_uid}): chmod 600 {shlex.quote(str(shown))}")
    return None


def open_private(path, what="password file", shown=None):
    """``path`` (``~`` expanded) opened for reading (binary), once it is known to pass
    :func:`private_problem` (checked on the open file: no race with a rename); ValueError
    otherwise, naming it ``shown`` (the path). OSError (a missing file) passes through."""
    fd = os.open(os.path.expanduser(path), os.O_RDONLY | os.O_NONBLOCK)  # a FIFO cannot hang us
    f = os.fdopen(fd, "rb")
    try:
        problem = private_problem(os.fstat(fd), path if shown is None else shown, what)
        if problem:
            raise ValueError(problem)
    except BaseException:
        f.close()
        raise
    return f


def private_file(path, what="password file"):
    """The check of a key naming a file that holds a secret: :func:`open_private`'s rule."""
    _text(path)
    try:
        open_private(path, what).close()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path}: {exc.strerror}") from None
    return path


# -- the store's URL -----------------------------------------------------------------------------

STORE_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
#: A Sentinel group's URL (``redis+sentinel://HOST:PORT,.../SERVICE/DB``, as redis-vl, LangChain
#: and Redis-Sentinel-Url spell it; ``rediss+sentinel://``: TLS to the Sentinels and to every
#: server they name), and a Sentinel's port when the URL gives none.
SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: The schemes that speak TLS (and so take redis-py's ``ssl_*`` parameters).
TLS_SCHEMES = ("rediss", "rediss+sentinel")
SENTINEL_PORT = 26379
#: The query parameters the store reads itself; the others go to redis-py.
STORE_OWN = ("prefix", "timeout", "password_file")
#: ... and those of a Sentinel URL only (its Sentinels' password; replicas a learn waits for;
#: passwords in clear text beyond loopback, on a network nobody else can reach).
SENTINEL_OWN = ("sentinel_password_file", "wait", "force_plaintext")
#: What ``force_plaintext=`` says yes with.
YES = ("1", "yes", "true")
#: redis-py's query parameters that name a file, read at the first request (said now instead):
#: TLS URLs only.
STORE_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
#: Every query parameter a store URL may hold; any other is refused by name (redis-py would
#: pass it to its connection as a keyword, a TypeError at the first request).
STORE_PARAMETERS = STORE_OWN + SENTINEL_OWN + ("db",) + STORE_FILES
PASSWORD_IN_URL = ("give the password with ?password_file=PATH, not in the URL (a URL shows up in process "
                   "lists, shell history, unit files and logs)")


def redact(url):
    """``url`` with the password of its user part and of its query (``password=``,
    ``ssl_password=``: :func:`is_secret`) replaced by ``***``: what every message and
    log line shows of a store URL."""
    if not isinstance(url, str):
        return url
    from urllib.parse import unquote

    head, sep, query = url.partition("?")
    query, hash_, fragment = query.partition("#")
    if not sep:
        head, hash_, fragment = head.partition("#")
    scheme, colons, rest = head.partition("://")
    if colons:
        auth, slash, path = rest.partition("/")
        if "@" in auth:
            user, at, host = auth.rpartition("@")
            if ":" in user:
                user = user.split(":", 1)[0] + ":***"
            head = scheme + colons + user + at + host + slash + path
    def hidden(name):  # (its name as the URL spells it when that name holds a control character)
        shown = unquote(name).strip().lower()
        return (shown if shown.isprintable() else name.lower()) + "=***"

    if sep:
        query = "&".join(hidden(p.partition("=")[0]) if is_secret(unquote(p.partition("=")[0])) else p
                         for p in query.split("&"))
    return head + sep + query + hash_ + fragment


def is_secret(name):
    """Whether a store URL's query parameter ``name`` holds a secret: ``password``, and
    redis-py's ``ssl_password`` (the passphrase of the client's key), in any case, and with
    anything but letters, digits and ``_`` left out (``password%00``, ``pass word``: a name
    made to slip past the check still holds what its sender meant as a password)."""
    return "".join(c for c in name.lower() if c.isalnum() or c == "_").endswith("password")


def _count(text):
    """Whether ``text`` is a count in ASCII digits (``str.isdigit`` takes ``²``, which int() refuses)."""
    return text.isascii() and text.isdigit()


def is_store_url(text):
    return isinstance(text, str) and "://" in text and text.partition("://")[0] in STORE_SCHEMES


def store_url(url):
    """A store URL (docs/many-hosts.md): its scheme, host, port and database, no password
    in it (user part or query), its ``password_file`` private, ``prefix`` and ``timeout``
    as the store takes them, the files it names readable. Returns ``url``."""
    store_url_parts(url)
    return url


def store_url_parts(url):
    """``(parts, query, ours)`` of a store URL that passes :func:`store_url`: urlsplit's
    parts, the query as ``parse_qs`` gives it without the store's own parameters,
    and those (``prefix``, ``timeout``, ``password_file``: the last of each)."""
    import math
    from urllib.parse import parse_qs, urlsplit

    _text(url)
    if not is_store_url(url):
        raise ValueError(f"{redact(url)}: not a store URL: give redis://HOST:PORT/DB, rediss://... (TLS), "
                         f"unix:///PATH or redis+sentinel://HOST:PORT,.../SERVICE/DB (rediss+sentinel://: TLS)")
    try:
        parts = urlsplit(url)
        sentinel = parts.scheme in SENTINEL_SCHEMES
        if not sentinel:  # (a Sentinel URL's host part is a list: sentinel_group reads it)
            parts.port  # noqa: B018 (urlsplit reads the port only when asked: a bad one raises here)
    except ValueError:
        raise ValueError(f"{redact(url)}: the port must be a number from 1 to 65535") from None
    query = parse_qs(parts.query, keep_blank_values=True)
    if parts.password or any(is_secret(k) for k in query):
        raise ValueError(f"{redact(url)}: {PASSWORD_IN_URL}")
    unknown = sorted(k for k in query if k not in STORE_PARAMETERS)
    if unknown:
        name = unknown[0] if unknown[0].isprintable() and "=" not in unknown[0] else repr(unknown[0])
        raise ValueError(f"{redact(url)}: unknown parameter {name}= (a store URL takes "
                         f"{', '.join(k + '=' for k in STORE_PARAMETERS)}: docs/many-hosts.md)")
    tls = [k for k in STORE_FILES if k in query]
    if tls and parts.scheme not in TLS_SCHEMES:
        raise ValueError(f"{redact(url)}: {tls[0]}= is for TLS, {' and '.join(s + '://' for s in TLS_SCHEMES)} "
                         f"URLs (this one is {parts.scheme}://)")
    if "db" in query and not _count(query["db"][-1]):
        raise ValueError(f"{redact(url)}: the database must be a number, not {query['db'][-1]!r}")
    if sentinel:
        sentinels = sentinel_group(parts, query, redact(url))[0]
        sentinel_trust(parts.scheme, sentinels, query, redact(url))
    elif any(k in query for k in SENTINEL_OWN):
        raise ValueError(f"{redact(url)}: wait=, sentinel_password_file= and force_plaintext= are for "
                         f"{SENTINEL_SCHEME}:// URLs")
    elif parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"{redact(url)}: give the socket's path, unix:///PATH")
    elif not parts.hostname:
        raise ValueError(f"{redact(url)}: give the server's host, {parts.scheme}://HOST:PORT/DB")
    db = query.get("db", [""])[-1] if parts.scheme == "unix" else parts.path.strip("/")
    if db and not _count(db) and not sentinel:
        raise ValueError(f"{redact(url)}: the database must be a number, not {db!r}")
    ours = {k: query.pop(k)[-1] for k in STORE_OWN + SENTINEL_OWN if k in query}
    if "wait" in ours and not (_count(ours["wait"]) and int(ours["wait"]) < 1000):
        raise ValueError(f"{redact(url)}: wait must be a number of replicas, not {ours['wait']!r}")
    if "prefix" in ours:
        prefix = ours["prefix"]
        if not prefix or len(prefix) > 128 or not prefix.isprintable() or any(c in prefix for c in " *?[]\\"):
            raise ValueError(f"{redact(url)}: prefix must be 1 to 128 printable characters without spaces or "
                             f"wildcards (*?[]\\), e.g. prefix=spamnb:")
    if "timeout" in ours:
        try:
            seconds = float(ours["timeout"])
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"{redact(url)}: timeout must be a number of seconds above 0, "
                             f"not {ours['timeout']!r}")
    try:
        if "password_file" in ours:
            private_file(ours["password_file"], "password file")
        if "sentinel_password_file" in ours:
            private_file(ours["sentinel_password_file"], "password file")
        for name in STORE_FILES:
            if name in query:  # said now, by name, not as redis-py's "Error 2 connecting" at the first request
                readable_file(query[name][-1], f"{name}={query[name][-1]}")
    except ValueError as exc:
        raise ValueError(f"{redact(url)}: {exc}") from None
    return parts, query, ours


def sentinel_trust(scheme, sentinels, query, shown):
    """ValueError unless a Sentinel URL protects the store's password: the primary that the
    Sentinels name receives it, so they must need a password themselves (else anyone who
    reaches one can tell it to name their own server), and without TLS the passwords go in
    clear text, so to loopback Sentinels only, unless ``force_plaintext=yes`` says that the
    network between the hosts is one nobody else can reach (docs/many-hosts.md)."""
    def given(k):
        return k in query and query[k][-1] != ""

    forced = query.get("force_plaintext", [None])[-1]
    if forced is not None:
        if forced.lower() not in YES:
            raise ValueError(f"{shown}: force_plaintext must be yes, not {forced!r} (leave it out for no)")
        if scheme != SENTINEL_SCHEME:
            raise ValueError(f"{shown}: force_plaintext= is for {SENTINEL_SCHEME}:// URLs (this one has TLS)")
    if given("password_file") and not given("sentinel_password_file"):
        raise ValueError(f"{shown}: with password_file= give the Sentinels' password too, "
                         f"sentinel_password_file=PATH (their requirepass): a Sentinel anyone can reach without "
                         f"one can be told to name any server as the primary, which then receives the store's "
                         f"password")
    if scheme == SENTINEL_SCHEME and (given("password_file") or given("sentinel_password_file")) \
            and forced is None:
        far = [host for host, _ in sentinels if not is_loopback(host)]
        if far:
            raise ValueError(f"{shown}: without TLS the passwords would go to {far[0]} in clear text: use "
                             f"rediss+sentinel:// with ssl_ca_certs= (or, on a network nobody else can reach, "
                             f"force_plaintext=yes)")


def sentinel_group(parts, query, shown):
    """``(sentinels, service, db)`` of a Sentinel URL's urlsplit ``parts`` and query:
    ``[(host, port)...]`` of ``HOST[:PORT],[V6]:PORT...`` (port 26379 when not given),
    the service of its path and the database of its path or ``?db=``; ValueError
    naming what is wrong (``shown``: the URL without its password)."""
    sentinels = []
    for item in parts.netloc.rpartition("@")[2].split(","):
        host, colon, number_ = item.rpartition(":")
        if not colon or not _count(number_) or (host.startswith("[") != host.endswith("]")):
            host, number_ = item, ""  # no port (an IPv6 address without one is in brackets too)
        host = host.strip("[]")
        if not host or (number_ and not 1 <= int(number_) < 65536):
            raise ValueError(f"{shown}: name the Sentinels as HOST[:PORT],HOST[:PORT]... (a port from 1 to 65535)")
        sentinels.append((host, int(number_ or SENTINEL_PORT)))
    path = [p for p in parts.path.split("/") if p]
    db = query.get("db", [path[1] if len(path) > 1 else "0"])[-1]
    if not path or len(path) > 2 or not _count(db):
        raise ValueError(f"{shown}: name the Sentinels' service and the database: .../SERVICE[/DB] (e.g. /spamnb/0)")
    from urllib.parse import unquote

    return sentinels, unquote(path[0]), int(db)


# -- IMAP --------------------------------------------------------------------------------------


def host(text):
    """A host name or address: not empty, no spaces or control characters."""
    _text(text)
    if not text.isprintable() or any(c.isspace() for c in text):
        raise ValueError(f"{text!r} is not a host name")
    return text


def is_loopback(name):
    import ipaddress

    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def plaintext(security, host_, force):
    """IMAP without TLS sends the password in clear text: only to loopback, unless forced."""
    if security == "none" and host_ and not is_loopback(host_) and not force:
        raise ValueError(f"security none would send the password to {host_} in clear text: only to 127.0.0.1 "
                         "(or say force_plaintext, --force-plaintext)")


# -- the table -----------------------------------------------------------------------------------

#: ``(table, key)`` -> check(value) -> value, raising ValueError: what a key's value must
#: be beyond its row's kind, choices and bounds (:func:`spamnb.options.check`).
CHECKS = {
    ("store", "url"): store_url,
    ("serve", "socket"): socket_path,
    ("serve", "pidfile"): pidfile,
    ("spamd", "listen"): each(listen_address),
    ("spamd", "allow"): networks,
    ("spamd", "socket_mode"): socket_mode,
    ("spamd", "trusted_users"): each(local_user),
    ("spamd", "user_models"): existing_folder,
    ("milter", "listen"): each(listen_address),
    ("metrics", "listen"): tcp_address,
    ("metrics", "allow"): networks,
    ("history", "path"): history_file,
    ("web", "listen"): lambda text: tcp_address(text, any_port=True),
    ("web", "allow"): networks,
    ("imap", "host"): host,
    ("imap", "cafile"): readable_file,
    ("imap", "password_file"): private_file,
}


def _exposed(allow, tcp_only, any_port=False):
    def check(listen, allowed):
        if any_port:
            exposure(tcp_address(listen, any_port=True)[0], networks(allowed or ()), allow)
        else:
            listening(listen, networks(allowed or ()), allow, tcp_only)
    return check


#: spamd's and the milter's listeners: both take [spamd] allow (``--allow``)
_DOORS_EXPOSED = _exposed('[spamd] allow (e.g. allow = ["192.0.2.0/24"])', False)
#: Rules on several keys at once: ``((first key, other keys...), check(first, others...))``,
#: an error said at the first key's line; applied when the first key is set.
TOGETHER = [
    ((("spamd", "listen"), ("spamd", "allow")), _DOORS_EXPOSED),
    ((("milter", "listen"), ("spamd", "allow")), _DOORS_EXPOSED),
    ((("metrics", "listen"), ("metrics", "allow")), _exposed("[metrics] allow (the Prometheus server's address)", True)),
    ((("web", "listen"), ("web", "allow")), _exposed('[web] allow (e.g. allow = ["192.0.2.0/24"])', True, True)),
    ((("imap", "security"), ("imap", "host"), ("imap", "force_plaintext")), plaintext),
]
