"""``spamnb filter`` without click, numpy, scipy or joblib: the per-message fast path.

procmail and maildrop start ``spamnb filter`` once for every delivered
message, so its start-up is the product's latency. :mod:`spamnb._entry` sends
``filter`` command lines here when they use only the options handled below;
this module then, in order:

1. reads the message from standard input, once;
2. asks the filter server (:mod:`spamnb.delivery.server`) when a socket is there
   (``--socket PATH``, else ``$SPAMNB_SOCKET``, else the default path of
   :func:`spamnb.storage.locate.default_socket_path`) and it serves the same model;
3. else scores the message itself with the model's compiled scorer
   (:mod:`spamnb.storage.scorer`) plus the changes in the model's journal
   (:mod:`spamnb.storage.journal`): tokenizer + binary search, standard
   library only; with ``--learn`` it then appends the message to the journal
   (the lock, one record, one fsync), and when that takes the journal past its
   bound it starts ``spamnb compact`` in the background and does not wait;
4. else, when the model is there but its scorer is missing, stale, damaged
   or untrusted (a model copied with ``cp``): loads the model, rebuilds the
   scorer beside it when that is safe (a trusted model in a folder we can
   write: :func:`spamnb.storage.modelfile.load_and_compile`), says so in one
   line on stderr -- or says why it could not, since every delivery is then
   slow -- and answers from the loaded model (:func:`with_model`);
5. else -- model not built yet or not trusted, bad options, any error at all
   -- runs the full click command in this process with the bytes already
   read (:func:`full_path`), which gives the exact output and error messages
   of ``spamnb filter``.

With a store (``--store URL`` or ``$SPAMNB_STORE``: docs/many-hosts.md) there
is no model file: :func:`via_store` asks the store (one round trip) and
answers.

Every step gives byte-identical output and the same exit status as the click
command (tests/test_fastpath.py holds them equal), and nothing is written
until a step has the whole answer, so a failing step leaves nothing behind for
the next. Mail is never lost: :func:`main` runs all of it behind the delivery
paths' one failure boundary (:class:`spamnb.verdict.Boundary`), so that when the
store fails, or even the full path cannot run, the message is written out
unchanged with exit status 3 (0 with ``--exit-zero``), as the click command does.
"""

import io
import os
import sys
import time  # loaded by the interpreter's own start-up: free here

from spamnb.storage import locate
from spamnb.verdict import (DECISION_OPTIONS, EXIT_CODES, EXIT_ERROR, Boundary, DecisionError, Fallback,
                            default_model_notice, deliver_unchanged, is_verdict_block, may_hold_verdicts,
                            model_name)

# Seconds to wait for the server before doing the work here.
SOCKET_TIMEOUT = 10.0

#: The settings this path implements; a command line or configuration that sets any
#: other of ``filter``'s (``--evidence``) goes to the click command.
FAST = frozenset(("model_path", "store", "allow_insecure_model", "socket_path", "exit_zero", "learn_",
                  "log_messages", "log_format", "log_to", "history", "no_history", *DECISION_OPTIONS))


def parse_args(args):
    """The settings of a ``filter`` command line alone (no files, no environment), or None
    when this path does not handle it: :func:`settings_of` over nothing else."""
    from spamnb.storage import settings

    return settings_of(args, {}, settings.Layers([], {}))


def settings_of(args, env=os.environ, layers=None):
    """``{name: value}`` of every setting of a ``filter`` command line, from the options
    (:func:`spamnb.options.parse`) and the configuration as the click command last read
    and checked it (:func:`spamnb.storage.settings.read_cache`), ordered by the one
    resolver (:func:`spamnb.storage.settings.resolve`); None when only the click command
    can answer: an option or value this path does not handle, options that exclude each
    other, files changed since, a setting only the click command applies."""
    from spamnb import options
    from spamnb.storage import settings

    try:
        given = options.parse(args, "filter")
    except (LookupError, ValueError):  # the click command says what is wrong
        return None
    if any(name not in FAST for name in given):
        return None
    if layers is None:
        layers = settings.checked_layers(env)  # no files, the usual case: a few stats, no TOML parser
    if layers is None:  # files the click command has not read and checked yet: it does, once
        return None
    try:
        resolved = settings.resolve("filter", given, env, layers=layers)
    except ValueError:  # two places for the model in one layer...: the click command says so
        return None
    rows = options.rows_of("filter")
    if any(name not in FAST and s.value != rows[name].default for name, s in resolved.items()):
        return None
    return {name: s.value for name, s in resolved.items()}


# -- the two fast ways ---------------------------------------------------------------


def via_server(sock_path, raw, path, is_default, opts, facts=None):
    """Ask the filter server; ``(output, label)``, or Fallback for any failure.
    ``facts``: a dict to fill with the verdict's score, probability and learning (for the log line)."""
    import _socket  # not `socket`: its wrapper module costs more than the round trip

    from spamnb.delivery import wire

    if not wire.private_socket_dir(sock_path):
        raise Fallback("no private server socket")
    from spamnb.options import TRAVELS

    values = {name: opts.get(name) for name in TRAVELS}  # the settings that travel, from the table
    learn = values["learn_"] = bool(values.get("learn_")) and not is_default  # the default model learns nothing
    request = wire.encode_settings(os.path.abspath(path), model_name(path, is_default), raw, values)
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(SOCKET_TIMEOUT)
        _connect(s, sock_path)
        if wire.peer_uid(s) != os.geteuid():
            raise Fallback("server runs as another user")
        wire.send_all(s, request)
        status, label, pos, block, reason = wire.read_reply(s)
    except (OSError, ValueError, wire.WireError) as exc:
        raise Fallback(f"server: {exc}") from None
    finally:
        s.close()
    if status != wire.OK or label not in EXIT_CODES:
        raise Fallback(f"server declined: {reason}")
    # The server says where the verdict goes and what it is; the message bytes are
    # ours. Anything but spamnb's own header lines, anywhere in it: do the work here.
    if may_hold_verdicts(raw):  # the server places ours in the message without incoming verdict fields
        from spamnb.mail.mime import strip_verdicts

        raw = strip_verdicts(raw)
    if not (0 <= pos <= len(raw) and is_verdict_block(block, label)):
        raise Fallback("the server's answer is not a verdict")
    if learn and reason:  # answered, and could not learn it: say so, as the click path does
        from spamnb.delivery.hook import not_learned

        sys.stderr.write(not_learned(reason) + "\n")
    if facts is not None:  # from our own, checked, X-Spam-Status line: "Yes, score=S required=T ... probability=P ..."
        status = block.split(b"X-Spam-Status: ", 1)[1].split(b"\n", 1)[0].decode("ascii").rstrip("\r")
        items = dict(x.split("=", 1) for x in status.split(", ", 1)[1].split(" ") if "=" in x)
        # whether the server learned it is in the server's own line ("?": its rule, its cut-offs)
        facts.update(score=float(items["score"]), p=float(items["probability"]), cutoffs=None,
                     learned="?" if learn and not reason and label != "unsure" else None)
    return raw[:pos] + block + raw[pos:], label


def _connect(s, sock_path, tries=20):
    """Connect; a full accept queue (EAGAIN on a socket with a timeout) is retried briefly."""
    import errno
    import time

    for i in range(tries):
        try:
            s.connect(sock_path)
            return
        except BlockingIOError as exc:
            if exc.errno != errno.EAGAIN or i == tries - 1:
                raise
            time.sleep(0.005 * (i + 1))


class NoScorer(Fallback):
    """The model looks usable but its compiled scorer is not (``kind``: a
    :data:`spamnb.storage.scorer.REBUILDABLE` kind): :func:`with_model` can answer."""

    def __init__(self, message, kind):
        super().__init__(message)
        self.kind = kind


def cold(raw, path, is_default, opts, facts=None):
    """Score with the compiled scorer beside the model and the model's journal;
    ``(output, label)``, else NoScorer when only the scorer is wrong, Fallback
    otherwise. With ``--learn``, then learn the message (:func:`learn_here`)."""
    # the tokenizer: not needed when the server answers
    from spamnb.delivery.hook import filter_verdict, message_tokens
    from spamnb.storage import journal
    from spamnb.storage.scorer import REBUILDABLE, ScorerError, fresh_scorer, token_hash
    from spamnb.storage.store import ModelError

    allow = opts["allow_insecure_model"]
    opened = None
    try:
        opened = journal.open_journal(path, allow_insecure=allow)  # before the snapshot: see open_journal
        sc = fresh_scorer(path, allow_insecure=allow)
        toks = message_tokens(sc, raw)
        handed, opened = opened, None  # read() closes it, whatever happens there
        j = journal.read(path, sc.save_id, sc.folded, allow_insecure=allow, opened=handed)
        if j is not None:  # the changes learned since the snapshot, to this message's tokens
            sc.overlay = journal.Overlay.of(j, only={token_hash(t) for t in set(toks)})
        kept, pos, block, d = filter_verdict(sc, raw, model_name(path, is_default), [opts[k] for k in DECISION_OPTIONS],
                                       toks=toks)
        out, label, learns = kept[:pos] + block + kept[pos:], d.label, d.learns
    except ScorerError as exc:
        if exc.kind in REBUILDABLE:
            raise NoScorer(str(exc), exc.kind) from None
        raise Fallback(str(exc)) from None  # the click command says what is wrong
    except (DecisionError, ModelError) as exc:
        raise Fallback(str(exc)) from None
    finally:
        if opened:
            os.close(opened[0])
    learned = opts["learn_"] and learns and not is_default and learn_here(path, raw, label, toks, allow)
    remember(opts, path, raw, d, learned)
    if facts is not None:
        facts.update(score=d.score, p=d.p, cutoffs=d.cutoffs, learned=label if learned else None)
    return out, label


def remember(opts, model_path, raw, d, learned=False):
    """Record the verdict ``d`` in the history of :func:`spamnb.storage.locate.history_path`
    (``model_path``: None for a store's model): a failure is a note on stderr."""
    where = locate.history_path(False if opts["no_history"] else opts["history"], model_path)  # the history unit
    if where is None:
        return
    from spamnb.storage import history

    # leave_open: the process ends with os._exit, no checkpoint to wait for
    history.record_now(where, raw, d.label, d.score, d.p, via="filter", learned=d.label if learned else None,
                       cutoffs=d.cutoffs, log=warn, leave_open=True)


def learn_here(path, raw, label, toks, allow_insecure):
    """``filter -u``'s learning on the cold path: one record appended to the journal
    (as ``spamnb learn`` would), waiting at most :data:`spamnb.delivery.hook.LEARN_TIMEOUT`
    for the lock; a failure is a warning and the verdict is delivered (False:
    not learned). Fallback when only the full model can learn it (nothing is
    written then)."""
    from spamnb.delivery.hook import LEARN_TIMEOUT, not_learned
    from spamnb.storage import journal
    from spamnb.storage.store import ModelError, lock_timeout

    try:
        done = journal.update(path, [(raw, label, toks)], allow_insecure=allow_insecure,
                              timeout=lock_timeout(LEARN_TIMEOUT), warn=warn)
    except journal.NeedsModel as exc:
        raise Fallback(str(exc)) from None
    except ModelError as exc:
        sys.stderr.write(not_learned(exc) + "\n")
        return False
    if done["needs_compaction"]:
        compact_in_background(path, allow_insecure)
    return True


def warn(text):
    """A note on stderr, as the click commands write one (``spamnb: text``)."""
    sys.stderr.write(f"spamnb: {text}\n")


def compact_in_background(path, allow_insecure=False):
    """Start ``spamnb compact`` for the model at ``path`` in its own session and
    return the process at once: the delivery does not wait for it (nor for its exit).

    It runs where no module can be planted: ``python -I`` (no working folder, no
    ``PYTHON*`` variables, no user site) in ``/``, with the model's absolute path and
    an import path of this process's own folders that no other user can write to
    (:func:`safe_import_path`). ``python -m spamnb`` in the caller's folder ran a
    ``spamnb.py`` or ``spamnb/`` planted in a shared folder such as /tmp."""
    import subprocess

    code = ("import sys; i = sys.argv.index('--'); sys.path[:0] = sys.argv[1:i]; "
            "sys.argv = ['spamnb'] + sys.argv[i + 1:]; from spamnb._entry import main; main()")
    args = [sys.executable, "-I", "-c", code, *safe_import_path(), "--",
            "compact", "--if-needed", "--quiet", "--model", os.path.abspath(path)]
    if allow_insecure:
        args.append("--allow-insecure-model")
    try:
        return subprocess.Popen(args, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError:
        return None  # the next learner tries again


def safe_import_path():
    """The folders a background spamnb may import from: the one spamnb itself was
    imported from, then this process's absolute ``sys.path`` entries, without the
    working folder and without any folder another user can write to (sticky or not:
    anyone may create ``spamnb.py`` in /tmp)."""
    import spamnb

    here = os.path.dirname(os.path.dirname(os.path.abspath(spamnb.__file__)))
    cwd = os.getcwd()
    out = []
    for entry in [here, *sys.path]:
        if not entry or not os.path.isabs(entry) or entry in out or (entry == cwd and entry != here):
            continue
        try:
            st = os.stat(entry)
        except OSError:
            continue
        if st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022:
            out.append(entry)
    return out


def with_model(raw, opts, kind, env=os.environ, facts=None):
    """``(output, label)`` from the whole model, for a model whose scorer is unusable
    (``kind``), rebuilding the scorer on the way when it can; None on any failure
    (the click command then runs, and reports it).

    Loads the model once, as the click command would, so this delivery costs
    what the full path costs; the note (rebuilt, or why not) goes to stderr,
    where procmail's log keeps it.
    """
    try:
        from spamnb.delivery.hook import filter_verdict
        from spamnb.storage.modelfile import load_and_compile

        path, is_default = locate.resolve_model(opts["model_path"], env)
        model, note = load_and_compile(path, kind, allow_insecure=opts["allow_insecure_model"])
        if note:
            sys.stderr.write(f"spamnb filter: {note}\n")
        kept, pos, block, d = filter_verdict(model, raw, model_name(path, is_default),
                                             [opts[k] for k in DECISION_OPTIONS])
        result = kept[:pos] + block + kept[pos:], d.label
    except Exception:  # noqa: BLE001 - the full path decides, and says what is wrong
        return None
    remember(opts, path, raw, d)
    if facts is not None:
        facts.update(score=d.score, p=d.p, cutoffs=d.cutoffs, learned=None)
    if is_default:  # the notice the click path prints
        sys.stderr.write(f"spamnb: {default_model_notice(path)}\n")
    return result


def socket_path(opts, env=os.environ):
    return opts["socket_path"] if opts["socket_path"] else locate.default_socket_path(env)


def answer(raw, opts, env=os.environ, facts=None):
    """``(output, label)`` from the server or the scorer; Fallback when neither can."""
    path, is_default = locate.resolve_model(opts["model_path"], env)
    sock = socket_path(opts, env)
    result = None
    if os.path.exists(sock):
        try:
            result = via_server(sock, raw, path, is_default, opts, facts)
        except Fallback:
            result = None
    if result is None:
        result = cold(raw, path, is_default, opts, facts)
    if is_default:  # the notice the click path prints
        sys.stderr.write(f"spamnb: {default_model_notice(path)}\n")
    return result


def via_store(raw, url, opts, facts=None):
    """``(output, label)`` from the model in the store at ``url``: one round trip (and
    one to learn with ``-u``), no numpy or click. A store that fails (unreachable,
    or holding a malformed value) raises: :func:`main`'s boundary passes the message
    through, as the click command does. ``facts``: filled for the log line, as
    :func:`cold` fills it."""
    from spamnb.delivery.hook import filter_verdict, message_tokens, not_learned
    from spamnb.storage.redisstore import RedisBackend
    from spamnb.storage.store import ModelError

    backend = RedisBackend.from_url(url)
    view = backend.view()
    toks = message_tokens(view, raw)
    kept, pos, block, d = filter_verdict(view, raw, model_name(backend.short_name, False),
                                         [opts[k] for k in DECISION_OPTIONS], toks=toks)
    learned = opts["learn_"] and d.learns
    if learned:
        try:
            backend.learn([(raw, d.label, toks)])
        except ModelError as exc:  # the verdict stands: deliver it, unlearned
            sys.stderr.write(not_learned(exc) + "\n")
            learned = False
    if facts is not None:
        facts.update(score=d.score, p=d.p, cutoffs=d.cutoffs, learned=d.label if learned else None)
    remember(opts, None, raw, d, learned)  # no model file: only a named history records
    return kept[:pos] + block + kept[pos:], d.label


# -- entry ----------------------------------------------------------------------------


def full_path(load_cli, args, raw=None):
    """Run the click ``filter`` command in this process (it exits).

    ``load_cli()`` imports and returns the click group (:mod:`spamnb._entry`
    passes it in: delivery sits below the command line). ``raw``, when given,
    is the message already read from standard input: the command reads it from
    a replacement stdin. If even that cannot start (say numpy is broken), the
    error reaches :func:`main`'s boundary, which passes the message through.
    """
    if raw is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(raw))
    cli_main = load_cli()
    cli_main(args=["filter", *args])


def _read_stdin():
    try:
        return sys.stdin.buffer.read()
    except (OSError, ValueError, AttributeError):
        return None


def _write_and_exit(out, code):
    """Write ``out`` to standard output and end the process with status ``code``.

    The interpreter's clean shutdown (module teardown, a last garbage
    collection) is skipped with ``os._exit`` once both streams are flushed:
    it is a noticeable share of a delivery through the server, and this
    process holds nothing that needs it.
    """
    try:
        sys.stdout.buffer.write(out)
        sys.stdout.buffer.flush()
    except (OSError, ValueError):
        code = EXIT_ERROR
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


def main(args, load_cli, env=os.environ):
    """``spamnb filter ARGS``: the fast way when it can, else the click command
    (see :func:`full_path` for ``load_cli``), all of it behind the delivery paths'
    failure boundary (:class:`spamnb.verdict.Boundary`): whatever fails -- the
    configuration, the model, the store, a bug -- the message goes out unchanged,
    one line on stderr, exit status 3 (0 with ``--exit-zero``)."""
    got = {"raw": None, "exit_zero": __import__("spamnb.options").options.exit_zero_given(args)}  # for fail()

    def fail(reason, exc):
        raw = got["raw"]
        if raw is None:  # failed before the message was read: read it now
            raw = _read_stdin() or b""
        opts = got.get("opts")
        if opts is not None and opts.get("log_messages"):
            log_failure(opts, reason, raw)
        code = deliver_unchanged(raw, reason, got["exit_zero"])
        _write_and_exit(b"", code)

    with Boundary(fail, interrupts=True):
        _filter(args, load_cli, env, got)


def _filter(args, load_cli, env, got):
    """:func:`main`'s work; ``got`` receives the message and the ``--exit-zero`` in force."""
    opts = settings_of(args, env)
    if opts is None:
        full_path(load_cli, args)
        return
    got["exit_zero"] = opts["exit_zero"]
    got["opts"] = opts
    start = time.perf_counter()
    raw = got["raw"] = _read_stdin()
    if raw is None:
        full_path(load_cli, args)
        return
    facts = {} if opts["log_messages"] else None
    url = opts["store"]  # the resolver's choice: --model and --store never both
    if url:
        out, label = via_store(raw, url, opts, facts)
        if facts:
            log_line(opts, label, facts, raw, time.perf_counter() - start)
        _write_and_exit(out, 0 if opts["exit_zero"] else EXIT_CODES[label])
    try:
        out, label = answer(raw, opts, env, facts)
    except NoScorer as exc:
        if opts["learn_"]:  # the click command loads the model, learns, and saves its scorer
            full_path(load_cli, args, raw)
            return
        result = with_model(raw, opts, exc.kind, env, facts)
        if result is None:
            full_path(load_cli, args, raw)
            return
        out, label = result
    except Exception:  # noqa: BLE001 - Fallback or anything unexpected: the full path decides
        full_path(load_cli, args, raw)
        return
    if facts:
        log_line(opts, label, facts, raw, time.perf_counter() - start)
    _write_and_exit(out, 0 if opts["exit_zero"] else EXIT_CODES[label])


def log_failure(opts, reason, raw):
    """``filter --log-messages``' line for a message delivered unchanged, unscanned."""
    try:
        import pwd

        from spamnb.delivery.events import Recorder

        Recorder(fmt=opts["log_format"] or "text", to=opts["log_to"] or "stderr").error(
            "failed", reason, via="filter", unscanned=True, raw=raw, user=pwd.getpwuid(os.geteuid()).pw_name)
    except Exception as exc:  # noqa: BLE001 - a log line never costs a delivery
        sys.stderr.write(f"spamnb: warning: no log line: {exc}\n")


def log_line(opts, label, facts, raw, seconds):
    """``filter --log-messages``' line (:mod:`spamnb.delivery.events`), as the click command writes it."""
    try:
        import pwd

        from spamnb.delivery.events import Recorder

        user = pwd.getpwuid(os.geteuid()).pw_name
        Recorder(fmt=opts["log_format"] or "text", to=opts["log_to"] or "stderr").message(
            "filter", label, facts["score"], facts["p"], facts["cutoffs"], len(raw), seconds, raw=raw, user=user,
            learned=facts["learned"], why="filter-u")
    except Exception as exc:  # noqa: BLE001 - a log line never costs a delivery
        sys.stderr.write(f"spamnb: warning: no log line: {exc}\n")
