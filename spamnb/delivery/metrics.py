"""``--metrics HOST:PORT``: Prometheus' text format at ``/metrics``.

The counts are what :class:`spamnb.delivery.events.Recorder` sees (the same
events as the log lines); the model's size is read from the served model when
Prometheus scrapes: a model file's from the model held in memory, a store's from
its totals (one ``HGET`` per scrape, which also tells the store gauges whether it
answers; a store that cannot answer leaves the size out of that scrape), and whether
it can learn from the last learn, else from a write probe at most every
:data:`spamnb.storage.backend.PROBE_SECONDS` (one ``HSET`` and ``EXPIRE`` on the primary). The exposition is
``prometheus_client``'s (the ``metrics`` extra): the text format's escaping, the histogram's cumulative buckets,
content negotiation and OpenMetrics are its job (without ``_created`` series: none is asked for), kept up to
date with Prometheus by the Prometheus project itself; the HTTP listener is
ours, so that it refuses clients outside loopback and ``--metrics-allow``
before reading a byte, as the spamd listener does.

Metrics::

    spamnb_messages_total{verdict,via}     messages answered (via: socket, spamd, imap, filter)
    spamnb_learned_total{class,source}     messages learned (source: filter-u, tell, imap, cli)
    spamnb_forgotten_total{class,source}   messages forgotten (source: tell)
    spamnb_errors_total{kind}              errors, every kind of events.ERROR_KINDS from the start
    spamnb_unscanned_total{kind}           messages that went on without a verdict, by their error's kind
    spamnb_history_lost_total              history records never written (the store or file failed, the queue full)
    spamnb_scan_seconds                    histogram of the time to score one message
    spamnb_spamd_answer_seconds            histogram of a spamd request's time, accepted to answered
    spamnb_model_tokens                    tokens the served model knows (a file: its snapshot)
    spamnb_model_messages{class}           messages as the decision counts them, by class (not what
                                           spamnb info prints: the help below says why)
    spamnb_journal_bytes                   size of the model's journal (a file: changes not yet compacted)
    spamnb_learning_up                     1 when the served model can learn (its last learn, else a probe)
    spamnb_store_up                        1 when the store answered its last request, else 0 (a store)
    spamnb_store_success_age_seconds       seconds since the store last answered, or since the start
                                           when it never has (a store)

``source`` of a learn: ``filter-u`` (``filter -u`` answered by the server's socket,
or by itself), ``tell`` (spamd ``TELL``, ``spamc -L``), ``imap`` (a move
``imap filter`` saw), ``cli`` (``spamnb learn``, which keeps no metrics).
"""

from __future__ import annotations

import socket
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from spamnb import checks
from spamnb.delivery import access
from spamnb.delivery.events import ERROR_KINDS, SOURCES, VIA, Counts
from spamnb.delivery.server import TIMEOUT, BoundedThreads
from spamnb.storage import upkeep
from spamnb.storage.backend import PROBE_SECONDS
from spamnb.verdict import ACTIONS, LABELS

#: Scan-time buckets (seconds): a scorer answers in about a millisecond, a cold full model in seconds.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Scrapes served at once: Prometheus scrapes one at a time; a connection beyond them is
#: answered 503 and closed at once, so idle ones cannot take the descriptors the mail needs.
MAX_CONNECTIONS = 16
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class MetricsError(Exception):
    """The metrics cannot be served (the library is missing, the port is taken)."""


def parse_listen(text):
    """``(host, port)`` of ``--metrics`` (:func:`spamnb.checks.tcp_address`)."""
    try:
        return checks.tcp_address(text)
    except ValueError as exc:
        raise ValueError(f"--metrics {exc}") from None


def networks(cidrs):
    try:
        return checks.networks(cidrs)
    except ValueError as exc:
        raise ValueError(f"--metrics-allow {exc}") from None


class Metrics:
    """The counters, and :meth:`listener` to serve them beside a model."""

    def __init__(self, address, allow=()):
        try:
            import prometheus_client as pc
        except ImportError:
            raise MetricsError("--metrics needs the prometheus_client library: "
                               "pip install 'spamnb[metrics]'") from None
        self.host, self.port = parse_listen(address)
        self.rules = access.Rules(networks=access.LOOPBACK + networks(allow))
        try:
            checks.exposure(self.host, allow, "--metrics-allow CIDR (e.g. the Prometheus server's address)")
        except ValueError as exc:
            raise ValueError(f"--metrics {exc}") from None
        self.pc = pc
        self.started = time.time()  # the store's answer age counts from here until it first answers
        # a ``_created`` series per counter and histogram is one more series per label set for
        # Prometheus to keep, which no query here needs (the switch is the library's, process-wide)
        pc.disable_created_metrics()
        self.registry = pc.CollectorRegistry()
        # the counts are the recorder's (events.Counts), read at each scrape: one count of each
        # event, which the heartbeat in a store reads too
        self.counts = Counts()
        self.scan = pc.Histogram("spamnb_scan_seconds", "Seconds to score one message", buckets=BUCKETS,
                                 registry=self.registry)
        self.answer = pc.Histogram("spamnb_spamd_answer_seconds", "Seconds from accepting a spamd request to "
                                   "its answer", buckets=BUCKETS, registry=self.registry)
        self.backend = None
        self.history = None  # the server's history recorder (events.Recorder sets it), for its records lost
        self.registry.register(_CountsCollector(self.counts))
        self.registry.register(_ModelCollector(self))

    def scanned(self, seconds):
        self.scan.observe(seconds)

    def answered(self, seconds):
        self.answer.observe(seconds)

    def page(self, accept=None):
        """``(body, content type)`` of a scrape (OpenMetrics when the scraper asks for it)."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def listener(self, backend=None, *, timeout=TIMEOUT, log=None):
        """The HTTP listener (bound now), reporting the size of ``backend``'s model
        (a :class:`spamnb.storage.backend.Backend`). A connection is closed
        ``timeout`` seconds after it was accepted, whatever it sent; at most
        :data:`MAX_CONNECTIONS` at once, one more is answered 503 and closed."""
        self.backend = backend
        try:
            return _Listener(self, timeout, log or (lambda text: None))
        except OSError as exc:
            raise MetricsError(f"cannot listen on {self.host}:{self.port} for --metrics: "
                               f"{exc.strerror or exc}") from None


#: The counters: (name, help, labels, the counts' table, every label set at 0 from the start,
#: so that increase() and rate() see the first event of each).
COUNTERS = (
    ("spamnb_messages", "Messages answered, by verdict and by way in", ["verdict", "via"], "messages",
     [(v, way) for v in ACTIONS for way in VIA]),
    ("spamnb_learned", "Messages learned, by class and by who taught it", ["class", "source"], "learned",
     [(c, s) for c in LABELS for s in SOURCES]),
    ("spamnb_errors", "Errors, by kind", ["kind"], "errors", list(ERROR_KINDS)),
    # of those, the messages that went on without a verdict: not a TELL refused (its mail was
    # delivered already), so that an alert on unscanned mail is not one on learning
    ("spamnb_unscanned", "Messages that went on without a verdict (spamc passed them through, the filter "
     "delivered them unchanged), by the kind of their error", ["kind"], "unscanned", list(ERROR_KINDS)),
    ("spamnb_forgotten", "Messages forgotten, by class and by who took them back", ["class", "source"],
     "forgotten", [(c, s) for c in LABELS for s in SOURCES]),
)


class _CountsCollector:
    """The counters, read from :class:`spamnb.delivery.events.Counts` at each scrape."""

    def __init__(self, counts):
        self.counts = counts

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        now = self.counts.snapshot()
        for name, text, labels, table, start in COUNTERS:
            family = CounterMetricFamily(name, text, labels=labels)
            seen = now[table]
            for key in dict.fromkeys([*start, *seen]):  # the fixed ones first, then any other seen
                family.add_metric(list(key) if isinstance(key, tuple) else [key], seen.get(key, 0))
            yield family


class _ModelCollector:
    def __init__(self, metrics):
        self.metrics = metrics

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        history = self.metrics.history
        yield CounterMetricFamily("spamnb_history_lost", "History records never written: the history's store "
                                  "or file failed, or its queue was full",
                                  getattr(history, "lost", 0))  # no history: none lost
        backend = self.metrics.backend
        if backend is None:
            return
        health = upkeep.health(backend)
        if health.size is not None:
            tokens, messages = health.size
            yield GaugeMetricFamily("spamnb_model_tokens", "Tokens the served model knows", tokens)
            g = GaugeMetricFamily("spamnb_model_messages", "Messages the served model learned, by class, as the "
                                  "decision counts them: with the copies training's refine rounds added and, for a "
                                  "model file, as of its last compaction, where spamnb info prints the messages "
                                  "learned, without those copies and with the journal's learns", labels=["class"])
            for label, n in zip(LABELS, messages):
                g.add_metric([label], n)
            yield g
        if health.journal_bytes is not None:
            yield GaugeMetricFamily("spamnb_journal_bytes", "Bytes in the model's journal, not yet compacted",
                                    health.journal_bytes)
        if health.learning is not None:
            yield GaugeMetricFamily("spamnb_learning_up", "1 when the served model can learn: its last learn went "
                                    f"through, or a probe of a write when none for {PROBE_SECONDS:g} s, else 0",
                                    1 if health.learning else 0)
        if health.store:
            yield GaugeMetricFamily("spamnb_store_up", "1 when the store answered its last request, else 0",
                                    1 if health.up else 0)
            # never answered: the process's age, so that an alert on a long silence fires on a
            # host that never reached its store too, once it has waited as long as the rule says
            since = health.last_success if health.last_success is not None else self.metrics.started
            yield GaugeMetricFamily("spamnb_store_success_age_seconds", "Seconds since the store last answered "
                                    "(since the start, when it never has)", max(0.0, time.time() - since))


class _Handler(BaseHTTPRequestHandler):
    def setup(self):
        self.timeout = self.server.timeout_s  # each read; the listener ends the whole connection at it too
        super().setup()

    def do_GET(self):
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404, "only /metrics here")
            return
        body, content_type = self.server.metrics.page(self.headers.get("Accept"))
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # a scrape every few seconds is not news
        pass


class _Listener(BoundedThreads, HTTPServer):
    daemon_threads = True
    what = "Prometheus metrics"
    request_queue_size = 64  # a flood is refused from the backlog, not left to the kernel's SYN retries

    def __init__(self, metrics, timeout, log):
        self.metrics = metrics
        self.timeout_s = timeout
        self.log = lambda text: log(f"metrics: {text}")
        self.address_family = socket.AF_INET6 if ":" in metrics.host else socket.AF_INET
        self.bound_threads(MAX_CONNECTIONS, busy=BUSY, deadline=timeout)
        super().__init__((metrics.host, metrics.port), _Handler)

    def handle_error(self, request, client_address):
        """A client that went away or ran out of time: a line, never a traceback."""
        import sys

        exc = sys.exc_info()[1]
        self.log(f"connection from {client_address[0]} dropped: {exc.__class__.__name__}: {exc}")

    def verify_request(self, request, client_address):
        """Connections the access rules refuse (outside loopback and ``--metrics-allow``)
        are closed before a byte is read."""
        return self.metrics.rules.allows(access.Peer.tcp(access.METRICS, client_address), access.READ_METRICS)

    def where(self):
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/metrics"

    def close(self):
        self.server_close()

