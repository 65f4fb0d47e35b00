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
paths' one failure boundary (:func:`filter_boundary`), so that when the
store fails, or even the full path cannot run, the message is written out
unchanged with exit status 3 (0 with ``--exit-zero``), as the click command does.
"""

import io
import os
import sys
import time  # loaded by the interpreter's own start-up: free here

from spamnb import options
from spamnb.delivery import pipeline
from spamnb.storage import locate
from spamnb.verdict import (DECISION_OPTIONS, EXIT_CODES, Decision, DecisionError, Fallback, default_model_notice,
                            deliver_unchanged, filtered_status, is_verdict_block, may_hold_verdicts, model_name,
                            write_out)

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
    """``{name: value}`` of every setting of a ``filter`` command line, or None when only
    the click command can answer (:func:`spamnb.storage.settings.command_line`: the
    table's parser and the one resolver, over the settings this path implements)."""
    from spamnb.storage import settings

    return settings.command_line("filter", args, env, layers, only=FAST)


# -- the two fast ways ---------------------------------------------------------------


def via_server(sock_path, raw, path, is_default, opts, facts=None):
    """Ask the filter server; ``(output, label)``, or Fallback for any failure.
    ``facts``: a dict to fill with the verdict's score and probability, and whether the
    server learned it, from its answer (for the line)."""
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
        sys.stderr.write(pipeline.not_learned(reason) + "\n")
    if facts is not None:  # from our own, checked, X-Spam-Status line: "Yes, score=S required=T ... probability=P ..."
        status = block.split(b"X-Spam-Status: ", 1)[1].split(b"\n", 1)[0].decode("ascii").rstrip("\r")
        items = dict(x.split("=", 1) for x in status.split(", ", 1)[1].split(" ") if "=" in x)
        # whether the server learned it is in the server's own line ("?": its rule, its cut-offs)
        facts.update(score=float(items["score"]), p=float(items["probability"]),
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


class JournalStore:
    """The model at ``path`` as :func:`spamnb.delivery.pipeline.learn` learns into it here:
    one journal record per message (:func:`spamnb.storage.journal.update`), a compaction
    started in the background when that takes the journal past its bound."""

    def __init__(self, path, allow_insecure=False):
        self.path, self.allow = path, allow_insecure

    def learn(self, items, *, forget=False, warn=None, timeout=None, **_):
        from spamnb.storage import journal

        done = journal.update(self.path, items, forget=forget, warn=warn, allow_insecure=self.allow, timeout=timeout)
        if done["needs_compaction"]:
            compact_in_background(self.path, self.allow)
        return done


class ColdSource(pipeline.Source):
    """The model's compiled scorer with the changes of its journal (standard library
    only); ``filter -u`` learns by one journal record (:meth:`learn`)."""

    def __init__(self, path, is_default, allow_insecure):
        self.path, self.allow = path, allow_insecure
        self.name = model_name(path, is_default)
        self.learns = not is_default  # the default model learns nothing

    def read(self, raw):
        from spamnb.delivery.hook import message_tokens
        from spamnb.storage import journal
        from spamnb.storage.scorer import fresh_scorer, token_hash

        opened = journal.open_journal(self.path, allow_insecure=self.allow)  # before the snapshot: see open_journal
        try:
            sc = fresh_scorer(self.path, allow_insecure=self.allow)
            toks = message_tokens(sc, raw)
            handed, opened = opened, None  # read() closes it, whatever happens there
            j = journal.read(self.path, sc.save_id, sc.folded, allow_insecure=self.allow, opened=handed)
        finally:
            if opened:
                os.close(opened[0])
        if j is not None:  # the changes learned since the snapshot, to this message's tokens
            sc.overlay = journal.Overlay.of(j, only={token_hash(t) for t in set(toks)})
        return sc, toks

    def learn(self, raw, label, toks, model):
        """One record appended to the journal (as ``spamnb learn`` would), waiting at most
        :data:`spamnb.delivery.pipeline.LEARN_TIMEOUT` for the lock; Fallback when only the
        full model can learn it (nothing is written then)."""
        from spamnb.storage import journal
        from spamnb.storage.store import ModelError, lock_timeout

        try:
            JournalStore(self.path, self.allow).learn([(raw, label, toks)], warn=warn,
                                                      timeout=lock_timeout(pipeline.LEARN_TIMEOUT))
        except journal.NeedsModel as exc:
            raise Fallback(str(exc)) from None
        except ModelError as exc:
            return str(exc)
        return None


def filter_here(raw, source, opts, rec, *, learn=None):
    """``(output, label)`` of ``raw`` through the one pipeline
    (:func:`spamnb.delivery.pipeline.filter_one`) under ``source``, with the ``filter``
    settings ``opts``; a message filtered but not learned is a warning on stderr. The
    click command filters through this too."""
    outcome = pipeline.filter_one(raw, source, via="filter", decision=Decision.of(opts),
                                  learn=opts["learn_"] if learn is None else learn,
                                  evidence=opts.get("evidence") or 0, recorder=rec,
                                  user=locate.local_user() if rec is not None else None)
    if outcome.not_learned:  # the verdict stands: delivered, unlearned
        sys.stderr.write(pipeline.not_learned(outcome.not_learned) + "\n")
    return outcome.message(), outcome.label


def cold(raw, path, is_default, opts):
    """Score with the compiled scorer beside the model and the model's journal
    (:class:`ColdSource`); ``(output, label)``, else NoScorer when only the scorer is
    wrong, Fallback otherwise."""
    from spamnb.storage.scorer import REBUILDABLE, ScorerError
    from spamnb.storage.store import ModelError

    try:
        return filter_here(raw, ColdSource(path, is_default, opts["allow_insecure_model"]), opts,
                           recorder_for(opts, history_now(opts, path)))
    except ScorerError as exc:
        if exc.kind in REBUILDABLE:
            raise NoScorer(str(exc), exc.kind) from None
        raise Fallback(str(exc)) from None  # the click command says what is wrong
    except (DecisionError, ModelError) as exc:
        raise Fallback(str(exc)) from None


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


def with_model(raw, path, is_default, opts, kind):
    """``(output, label)`` from the whole model at ``path``, for a model whose scorer is
    unusable (``kind``), rebuilding the scorer on the way when it can; None on any failure
    (the click command then runs, and reports it).

    Loads the model once, as the click command would, so this delivery costs
    what the full path costs; the note (rebuilt, or why not) goes to stderr,
    where procmail's log keeps it.
    """
    try:
        from spamnb.storage.modelfile import load_and_compile

        model, note = load_and_compile(path, kind, allow_insecure=opts["allow_insecure_model"])
        if note:
            sys.stderr.write(f"spamnb filter: {note}\n")
        return filter_here(raw, pipeline.ModelSource(model, model_name(path, is_default)), opts,
                           recorder_for(opts, history_now(opts, path)), learn=False)
    except Exception:  # noqa: BLE001 - the full path decides, and says what is wrong
        return None


def answer(raw, opts, env=os.environ):
    """``(output, label)`` from the server, the scorer or, when only the scorer is
    unusable, the loaded model; None when only the click command can answer."""
    start = time.perf_counter()
    path, is_default = locate.resolve_model(opts["model_path"], env)
    try:
        result = served(raw, path, is_default, opts, env, start) or cold(raw, path, is_default, opts)
    except NoScorer as exc:  # with -u the click command loads the model, learns, and saves its scorer
        result = None if opts["learn_"] else with_model(raw, path, is_default, opts, exc.kind)
    except Exception:  # noqa: BLE001 - Fallback or anything unexpected: the full path decides
        result = None
    if result is not None and is_default:  # the notice the click path prints
        sys.stderr.write(f"spamnb: {default_model_notice(path)}\n")
    return result


def served(raw, path, is_default, opts, env, start):
    """``(output, label)`` from the filter server, with the line when asked; None when
    there is no server, or it cannot answer."""
    sock = opts["socket_path"] or locate.default_socket_path(env)
    if not os.path.exists(sock):
        return None
    facts = {}
    try:
        result = via_server(sock, raw, path, is_default, opts, facts)
    except Fallback:
        return None
    if opts["log_messages"]:  # the server keeps the history; the line is ours
        try:
            line_recorder(opts).message("filter", result[1], facts["score"], facts["p"], None, len(raw),
                                        time.perf_counter() - start, raw=raw, user=locate.local_user(),
                                        learned=facts["learned"], why="filter-u")
        except Exception as exc:  # noqa: BLE001 - answered (and learned) already: not filtered again
            pipeline.note(f"warning: no log line: {exc}")
    return result


def via_store(raw, url, opts):
    """``(output, label)`` from the model in the store at ``url``: one round trip (and
    one to learn with ``-u``), no numpy or click. A store that fails (unreachable,
    or holding a malformed value) raises: :func:`main`'s boundary passes the message
    through, as the click command does."""
    from spamnb.storage.redisstore import RedisBackend

    source = pipeline.BackendSource(RedisBackend.from_url(url), warn=warn)
    return filter_here(raw, source, opts, recorder_for(opts, history_now(opts, None)))  # only a named history


# -- what a filter process records --------------------------------------------------------


def line_recorder(opts, history=None):
    """The recorder of ``filter --log-messages``' lines (:mod:`spamnb.delivery.events`),
    None without; ``history``: also record each verdict there."""
    if not (opts and opts.get("log_messages")):
        return None
    from spamnb.delivery import events

    return events.Recorder(fmt=opts.get("log_format") or "text", to=opts.get("log_to") or "stderr", history=history)


def history_now(opts, model_path):
    """The history a filter process records its verdict in (the file of
    :func:`spamnb.storage.locate.history_path` for ``model_path``, None for a store's
    model unless one is named), written at once; None for none."""
    where = locate.history_path(locate.history_setting(opts), model_path)
    if where is None:
        return None
    from spamnb.storage.history import Now

    return Now(where, warn, leave_open=True)  # leave_open: the process ends with os._exit, no checkpoint to wait for


def recorder_for(opts, history):
    """What a filter process records its verdict with: its line when asked, and
    ``history`` (a writer, or None); None when neither."""
    rec = line_recorder(opts, history)
    if rec is None and history is not None:
        return pipeline.HistoryOnly(history)
    return rec


def filter_boundary(got, note=None):
    """The ``filter`` command's failure boundary, both ways of answering (here and the
    click command): the message unchanged on stdout (read now if it was not yet), the
    reason on stderr, the error line when lines are asked (``got["opts"]``), and the exit
    status (:func:`spamnb.verdict.deliver_unchanged`) in the boundary's result. ``got``
    holds the message once read and the ``--exit-zero`` in force."""
    def message():
        if got["raw"] is None:  # failed before the message was read: read it now
            got["raw"] = _read_stdin() or b""
        return got["raw"]

    return pipeline.boundary("filter", lambda reason, exc: deliver_unchanged(message(), reason, got["exit_zero"]),
                             recorder=lambda: line_recorder(got.get("opts")),
                             facts=lambda: {"raw": message(), "user": locate.local_user()}, interrupts=True,
                             warn=note or warn)


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
    code = write_out(out, code)
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


def main(args, load_cli, env=os.environ):
    """``spamnb filter ARGS``: the fast way when it can, else the click command
    (see :func:`full_path` for ``load_cli``), all of it behind the filter's failure
    boundary (:func:`filter_boundary`): whatever fails -- the configuration, the model,
    the store, a bug -- the message goes out unchanged, one line on stderr, exit
    status 3 (0 with ``--exit-zero``)."""
    got = {"raw": None, "exit_zero": options.exit_zero_given(args)}  # what the boundary delivers, and how
    with filter_boundary(got) as boundary:
        result = _filter(args, env, got)
        if result is None:
            full_path(load_cli, args, got["raw"])
        else:
            _write_and_exit(*result)
    if boundary.result is not None:  # delivered unchanged: its exit status
        _write_and_exit(b"", boundary.result)


def _filter(args, env, got):
    """``(output, exit status)`` of :func:`main`'s message by a fast way, None when only
    the click command can answer; ``got`` receives the settings, the message and the
    ``--exit-zero`` in force (the settings are resolved here, once)."""
    opts = got["opts"] = settings_of(args, env)
    if opts is None:
        return None
    got["exit_zero"] = opts["exit_zero"]
    raw = got["raw"] = _read_stdin()
    if raw is None:
        return None
    if opts["store"]:  # the resolver's choice: --model and --store never both; a failing store is the boundary's
        out, label = via_store(raw, opts["store"], opts)
    else:
        result = answer(raw, opts, env)
        if result is None:
            return None
        out, label = result
    return out, filtered_status(label, opts["exit_zero"])
