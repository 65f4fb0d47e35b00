"""``serve --metrics``: the real Prometheus scrapes a running ``spamnb serve`` and
its query API returns the counts sent; ``promtool check metrics`` accepts the page.

Debian's ``prometheus`` runs on a private port with a generated scrape
configuration and a temporary database; the test command installs it when
root, and these tests are skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request

import pytest

from spamnb.delivery import metrics
from test_config import free_port, run, until
from test_e2e import SPAMNB
from test_fastpath import compiled, messages  # noqa: F401 (compiled: a fixture)
from test_server import start_server
from test_spamd import request

prometheus_client = pytest.importorskip("prometheus_client", reason="the metrics extra is not installed "
                                                                   "(pip install 'spamnb[metrics]')")
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
needs = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                           reason="prometheus/promtool are not installed (apt-get install prometheus; the "
                                  "README's test command does it when run as root)")


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def spamd_check(port, raw):
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request("CHECK", raw, User="alice"))
        s.shutdown(socket.SHUT_WR)
        return s.recv(4096)


def _prometheus(tmp_path, mport, pport, config=None):
    """A real Prometheus scraping ``127.0.0.1:mport`` every second (or as the configuration
    ``config`` says): (its process, a function giving a PromQL query's results, None while it
    has none)."""
    conf = tmp_path / "prometheus.yml"
    conf.write_text(config or "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: spamnb\n"
                    f"    static_configs:\n      - targets: ['127.0.0.1:{mport}']\n")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{pport}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)

    def results(q):
        try:
            data = json.loads(get(f"http://127.0.0.1:{pport}/api/v1/query?" + urllib.parse.urlencode({"query": q})))
        except OSError:
            return None
        return data["data"]["result"] if data.get("status") == "success" else None

    return prom, results


def firing(pport) -> set[tuple[str, str]]:
    """``(alert, instance)`` of each alert the Prometheus on ``pport`` has firing now (its API's
    ``/api/v1/alerts``; pending ones are not)."""
    data = json.loads(get(f"http://127.0.0.1:{pport}/api/v1/alerts"))
    return {(a["labels"]["alertname"], a["labels"].get("instance", "")) for a in data["data"]["alerts"]
            if a["state"] == "firing"}


@needs
def test_prometheus_scrapes_the_counts_sent(compiled, tmp_path):
    port, mport, pport = free_port(), free_port(), free_port()
    sock = str(tmp_path / "run" / "socket")
    proc = start_server(sock, compiled, "--spamd", str(port), "--metrics", f"127.0.0.1:{mport}")
    prom = None
    try:
        sent = {}
        for raw in messages()[:12]:
            reply = spamd_check(port, raw)
            assert reply.startswith(b"SPAMD/1.1 0 EX_OK"), reply
        for raw in messages()[12:15]:
            res = run("filter", "--model", compiled, "--socket", sock, input=raw)
            assert res.returncode in (0, 1, 2)
        page = get(f"http://127.0.0.1:{mport}/metrics").decode()
        for line in page.splitlines():
            if line.startswith("spamnb_messages_total{"):
                labels, value = line.rsplit(" ", 1)
                sent[labels] = float(value)
        assert sum(v for k, v in sent.items() if 'via="spamd"' in k) == 12
        assert sum(v for k, v in sent.items() if 'via="socket"' in k) == 3
        assert "spamnb_scan_seconds_bucket" in page and "spamnb_model_tokens " in page
        assert 'spamnb_model_messages{class="spam"}' in page and "spamnb_journal_bytes " in page
        assert "spamnb_spamd_answer_seconds_count 12.0" in page  # every spamd request, none of the socket's
        assert 'spamnb_forgotten_total{class="ham",source="tell"} 0.0' in page
        assert "spamnb_store_up" not in page  # a model file has no store
        assert "spamnb_learning_up 1.0" in page and "spamnb_history_lost_total 0.0" in page
        assert 'spamnb_errors_total{kind="ex_ioerr"} 0.0' in page and "_created" not in page
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=page.encode(), capture_output=True, timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr

        prom, query = _prometheus(tmp_path, mport, pport)

        def counted():
            result = query('sum by (via) (spamnb_messages_total{job="spamnb"})')
            return {r["metric"]["via"]: float(r["value"][1]) for r in result or ()} or None

        assert until(lambda: (counted() or {}).get("spamd") == 12, 60), counted()
        assert counted()["socket"] == 3
        assert float(query("spamnb_scan_seconds_count")[0]["value"][1]) == 15
        from spamnb.delivery.events import ERROR_KINDS

        kinds = {r["metric"]["kind"]: float(r["value"][1]) for r in query("spamnb_errors_total") or ()}
        assert kinds == dict.fromkeys(ERROR_KINDS, 0.0)  # every kind, at 0, before any error
        assert float(query("spamnb_learning_up")[0]["value"][1]) == 1
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(30)
        proc.terminate()
        proc.wait(10)


def test_metrics_listen_on_loopback_unless_allowed(compiled):
    res = run("serve", "--model", compiled, "--metrics", "0.0.0.0:9999")
    assert res.returncode == 2 and "--metrics-allow" in res.stderr.decode()
    m = metrics.Metrics(f"127.0.0.1:{free_port()}", ["192.0.2.0/24"])
    listener = m.listener()
    try:
        assert listener.verify_request(None, ("127.0.0.1", 1))
        assert listener.verify_request(None, ("192.0.2.7", 1))
        assert not listener.verify_request(None, ("198.51.100.1", 1))
    finally:
        listener.close()


def test_counts_follow_the_recorder():
    from spamnb.delivery.events import Recorder

    m = metrics.Metrics(f"127.0.0.1:{free_port()}")
    rec = Recorder(lines=False, metrics=m)
    rec.message("spamd", "spam", 9.0, 0.99, (0.5, 0.95), 10, 0.002, learned="spam")
    rec.learned("ham", "tell")
    rec.error("ex_protocol")
    rec.error("ex_ioerr", unscanned=True)  # a message passed unscanned
    rec.error("ex_tempfail")  # a TELL refused: its mail was delivered already
    rec.forgotten("spam", "tell")
    rec.answered(0.003)
    page = m.page()[0].decode()
    assert 'spamnb_forgotten_total{class="spam",source="tell"} 1.0' in page
    assert "spamnb_spamd_answer_seconds_count 1.0" in page
    assert 'spamnb_messages_total{verdict="spam",via="spamd"} 1.0' in page
    assert 'spamnb_learned_total{class="spam",source="filter-u"} 1.0' in page
    assert 'spamnb_learned_total{class="ham",source="tell"} 1.0' in page
    assert 'spamnb_errors_total{kind="ex_protocol"} 1.0' in page
    for kind, errors, unscanned in (("ex_ioerr", 1, 1), ("ex_tempfail", 1, 0), ("ex_protocol", 1, 0)):
        assert f'spamnb_errors_total{{kind="{kind}"}} {errors:.1f}' in page
        assert f'spamnb_unscanned_total{{kind="{kind}"}} {unscanned:.1f}' in page


@pytest.mark.slow  # about 11 s: Prometheus scrapes across a store outage
@needs
def test_prometheus_reads_the_store_its_size_learns_forgets_and_outage(trained_model_file, tmp_path):
    """``serve --store --spamd --metrics`` with a real redis-server: the model's size is the
    store's (as pushed, and one more ham after a TELL), learns and forgets count by source,
    the spamd answer time is a histogram, and the store gauge reads 1, then 0 once Redis
    stops (Prometheus sees both); ``ex_ioerr`` is at 0 before its first error, so that
    ``increase()`` sees the unscanned message; ``spamnb_learning_up`` goes from 1 to 0 when
    a TELL is refused; promtool accepts the page."""
    from spamnb.storage.filestore import FileBackend
    from test_redis_store import REDIS_SERVER, RedisServer, pushed, redis, sample_messages

    if REDIS_SERVER is None or redis is None or shutil.which("spamc") is None:
        pytest.skip("redis-server, the redis package or spamc is missing")
    srv = RedisServer(tmp_path)
    url = srv.url(prefix="site:")
    pushed(url, trained_model_file)
    model = FileBackend(str(trained_model_file)).model()
    port, mport, pport = free_port(), free_port(), free_port()
    proc = subprocess.Popen(SPAMNB + ["serve", "--socket", str(tmp_path / "run" / "socket"), "--store", url,
                                      "--spamd", str(port), "--allow-tell-served", "--metrics", f"127.0.0.1:{mport}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prom = None

    def spamc(raw, *args):
        return subprocess.run([shutil.which("spamc"), "-d", "127.0.0.1", "-p", str(port), "-t", "30", *args],
                              input=raw, capture_output=True, timeout=60)

    def value(page, name):
        found = [float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name + " ")]
        return found[0] if found else None

    try:
        raws = sample_messages()[:5]
        for raw in raws:
            assert until(lambda: spamc(raw, "-c").stdout[:3] != b"0/0", 30)
        page = get(f"http://127.0.0.1:{mport}/metrics").decode()
        ham, spam = (int(x) for x in model.estimator.class_count_)  # what the decision reads
        assert value(page, "spamnb_model_tokens") == len(model.vocabulary)  # as pushed
        assert value(page, 'spamnb_model_messages{class="ham"}') == ham
        assert spamc(raws[0], "-L", "ham").returncode == 0
        assert spamc(raws[1], "-L", "spam").returncode == 0
        assert spamc(raws[1], "-L", "forget").returncode == 0
        page = get(f"http://127.0.0.1:{mport}/metrics").decode()
        assert value(page, "spamnb_store_up") == 1.0
        assert 0 <= value(page, "spamnb_store_success_age_seconds") < 30
        assert value(page, "spamnb_model_tokens") >= len(model.vocabulary)
        assert value(page, 'spamnb_model_messages{class="ham"}') == ham + 1
        assert value(page, 'spamnb_model_messages{class="spam"}') == spam
        assert value(page, 'spamnb_learned_total{class="ham",source="tell"}') == 1
        assert value(page, 'spamnb_learned_total{class="spam",source="tell"}') == 1
        assert value(page, 'spamnb_forgotten_total{class="spam",source="tell"}') == 1
        # each answer's time is observed once its last byte is sent, just after spamc has it
        assert until(lambda: value(get(f"http://127.0.0.1:{mport}/metrics").decode(),
                                   "spamnb_spamd_answer_seconds_count") >= 8, 10)
        assert "spamnb_journal_bytes" not in page  # a store has no journal
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=page.encode(), capture_output=True, timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr

        prom, results = _prometheus(tmp_path, mport, pport)

        def query(q):
            result = results(q)
            return float(result[0]["value"][1]) if result else None

        assert until(lambda: query('spamnb_store_up{job="spamnb"}') == 1, 60)
        assert query('spamnb_errors_total{kind="ex_ioerr"}') == 0  # there before its first error
        assert query("spamnb_learning_up") == 1 and query("spamnb_history_lost_total") == 0
        assert query('sum(spamnb_forgotten_total{source="tell"})') == 1
        assert query('spamnb_model_messages{class="ham"}') == ham + 1
        srv.stop()
        assert spamc(raws[2], "-c").stdout.startswith(b"0/0")  # passed unscanned
        assert until(lambda: query('spamnb_store_up{job="spamnb"}') == 0, 60)
        assert until(lambda: (query('spamnb_store_success_age_seconds{job="spamnb"}') or 0) >= 1, 60)
        assert query('spamnb_errors_total{kind="ex_ioerr"}') >= 1
        # what the documented alert reads: the kind's series rose from 0, so increase() sees it
        assert until(lambda: (query('increase(spamnb_unscanned_total{kind="ex_ioerr"}[1m])') or 0) > 0, 60)
        assert spamc(raws[3], "-L", "ham").returncode != 0  # learning refused: the store is down
        assert until(lambda: query("spamnb_learning_up") == 0, 60)
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(30)
        proc.terminate()
        proc.wait(10)
        if srv.proc.poll() is None:
            srv.stop()


def test_every_error_kind_the_code_emits_is_listed_and_documented():
    """``events.ERROR_KINDS`` (the ``spamnb_errors_total`` series present from the start) is
    every kind an error line can have, as the doors (spamnb/delivery, web, cli) write them:
    the literal kinds handed to ``.error(``, the refusals tallied, a boundary's ``kind=``,
    and spamd's error replies (their sysexits names in lower case); docs/admin.md's table
    of kinds names each."""
    import pathlib
    import re

    from spamnb.delivery.events import ERROR_KINDS

    root = pathlib.Path(__file__).resolve().parent.parent
    found = set()
    doors = ("delivery", "web", "cli")  # where error lines are written (numpy's kind= is elsewhere)
    for path in (p for d in doors for p in (root / "spamnb" / d).rglob("*.py")):
        text = path.read_text()
        found.update(re.findall(r'\.error\(\s*"([a-z_]+)"', text))
        found.update(re.findall(r'tally_unserved\(\s*"([a-z_]+)"', text))
        found.update(re.findall(r'\bkind="([a-z_]+)"', text))
        if path.parent.name == "delivery" and path.name.startswith("spamd"):
            found.update(n.lower() for n in re.findall(r'SpamdError\(\s*"(EX_[A-Z]+)"', text))
            found.update(n.lower() for n in re.findall(r'\bname, text = "(EX_[A-Z]+)"', text))
    assert found == set(ERROR_KINDS)
    assert len(ERROR_KINDS) == len(set(ERROR_KINDS))
    table = (root / "docs" / "admin.md").read_text().split("| `kind` | where | what |", 1)[1].split("\n\n", 1)[0]
    documented = {k for row in table.strip().splitlines()[1:] for k in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    assert documented == set(ERROR_KINDS)


def test_every_error_kind_is_at_zero_from_the_start_and_no_created_series():
    m = metrics.Metrics(f"127.0.0.1:{free_port()}")
    from spamnb.delivery.events import ERROR_KINDS

    page = m.page()[0].decode()
    for kind in ERROR_KINDS:
        assert f'spamnb_errors_total{{kind="{kind}"}} 0.0' in page
        assert f'spamnb_unscanned_total{{kind="{kind}"}} 0.0' in page
    assert "_created" not in page
    m.counts.error("ex_ioerr")
    page = m.page()[0].decode()
    assert 'spamnb_errors_total{kind="ex_ioerr"} 1.0' in page and "_created" not in page
    assert "_created" not in m.page("application/openmetrics-text; version=1.0.0")[0].decode()


def test_a_store_never_reached_has_its_gauges_from_the_start():
    """A store that never answered: ``spamnb_store_up`` 0 and the answer age counting from
    the start, so that ``spamnb_store_success_age_seconds > 60`` fires there too."""
    pytest.importorskip("redis")
    from spamnb.storage.redisstore import RedisBackend

    m = metrics.Metrics(f"127.0.0.1:{free_port()}")
    m.backend = RedisBackend.from_url(f"redis://127.0.0.1:{free_port()}/")  # nothing listens there
    m.started -= 90  # as if it had run for a minute and a half
    page = m.page()[0].decode()
    assert "spamnb_store_up 0.0" in page and "spamnb_model_tokens" not in page
    age = [float(line.split()[1]) for line in page.splitlines() if line.startswith("spamnb_store_success_age_seconds ")]
    assert age and 90 <= age[0] < 120


def _gauge(page, name):
    found = [float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name + " ")]
    return found[0] if found else None


def test_learning_gauge_of_a_model_file(model_file, tmp_path):
    """``spamnb_learning_up`` of a model file: 1 when its folder (and journal) can be written,
    by a probe of the modes when nothing was learned for a while; a learn that went through
    says 1 for the next 30 s without a probe."""
    from spamnb.storage.filestore import FileBackend

    m = metrics.Metrics(f"127.0.0.1:{free_port()}")
    m.backend = FileBackend(str(model_file)).resident()
    assert _gauge(m.page()[0].decode(), "spamnb_learning_up") == 1
    m.backend = FileBackend(str(tmp_path / "gone" / "model.joblib")).resident()  # its folder is gone
    assert _gauge(m.page()[0].decode(), "spamnb_learning_up") == 0
    m.backend = FileBackend(str(model_file)).resident()
    m.backend.writes.note(False)  # a learn that failed a moment ago: no probe overrides it yet
    assert _gauge(m.page()[0].decode(), "spamnb_learning_up") == 0
    m.backend.learn([(messages()[0], "ham", None)])
    assert m.backend.writes.ok is True
    assert _gauge(m.page()[0].decode(), "spamnb_learning_up") == 1


def test_a_learn_s_outcome_is_what_the_learning_gauge_reads():
    from spamnb.storage.backend import StoreUnavailable, Writes
    from spamnb.storage.store import LockTimeout

    def raising(exc):
        def learn():
            raise exc
        return learn

    w = Writes()
    assert w.learning(lambda: {"learned": 1}) == {"learned": 1} and w.ok is True
    for exc in (LockTimeout("busy"), ValueError("nothing to forget")):  # say nothing of learning itself
        with pytest.raises(type(exc)):
            w.learning(raising(exc))
        assert w.ok is True
    with pytest.raises(StoreUnavailable):
        w.learning(raising(StoreUnavailable("cannot learn: a read-only replica")))
    assert w.ok is False


def test_learning_gauge_of_a_store_demoted_to_a_replica(trained_model_file, tmp_path):
    """A store's primary made a replica (what a failover does to the old one): the reads
    answer (``spamnb_store_up`` 1) while learning is refused, and ``spamnb_learning_up``
    says so, from the learn refused or, without one, from its probe; back to 1 once the
    store takes writes again."""
    from test_redis_store import REDIS_SERVER, RedisServer, pushed, redis

    if REDIS_SERVER is None or redis is None:
        pytest.skip("redis-server or the redis package is missing")
    srv = RedisServer(tmp_path)
    try:
        backend = pushed(srv.url(prefix="site:"), trained_model_file).resident()
        m = metrics.Metrics(f"127.0.0.1:{free_port()}")
        m.backend = backend
        page = m.page()[0].decode()
        assert _gauge(page, "spamnb_learning_up") == 1 and _gauge(page, "spamnb_store_up") == 1
        srv.client().execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # no primary there
        raw = messages()[0]
        from spamnb.storage.backend import StoreUnavailable

        with pytest.raises(StoreUnavailable, match="read-only"):
            backend.learn([(raw, "spam", None)])
        page = m.page()[0].decode()
        assert _gauge(page, "spamnb_learning_up") == 0 and _gauge(page, "spamnb_store_up") == 1
        backend.writes.at -= 60  # no learn for a minute: the probe asks the store
        page = m.page()[0].decode()
        assert _gauge(page, "spamnb_learning_up") == 0 and _gauge(page, "spamnb_store_up") == 1
        srv.client().execute_command("REPLICAOF", "NO", "ONE")
        backend.writes.at -= 60
        assert _gauge(m.page()[0].decode(), "spamnb_learning_up") == 1
        assert srv.client().ttl(b"site:probe") > 0  # the probe's key goes by itself
        backend.learn([(raw, "spam", None)])
        assert backend.writes.ok is True
    finally:
        srv.stop()


def test_history_records_lost_are_counted_and_their_number_logged(trained_model_file, tmp_path):
    """The store's history while the store is down: each record lost counts in
    ``spamnb_history_lost_total`` (0 from the start), and the line when the store answers
    again says how many were lost meanwhile."""
    import time

    from spamnb.delivery.events import Recorder
    from spamnb.storage import redishistory
    from test_redis_store import REDIS_SERVER, RedisServer, pushed, redis

    if REDIS_SERVER is None or redis is None:
        pytest.skip("redis-server or the redis package is missing")
    srv = RedisServer(tmp_path)
    logged = []
    try:
        backend = pushed(srv.url(prefix="site:"), trained_model_file)
        m = metrics.Metrics(f"127.0.0.1:{free_port()}")
        assert "spamnb_history_lost_total 0.0" in m.page()[0].decode()  # no history yet: none lost
        hist = redishistory.Recorder(redishistory.RedisHistory(backend), logged.append)
        rec = Recorder(lines=False, metrics=m, history=hist)
        raws = messages()[:5]

        def verdict(raw):
            rec.message("spamd", "ham", -3.0, 0.01, (0.5, 0.95), len(raw), 0.001, raw=raw, user="alice")

        verdict(raws[0])
        assert until(lambda: hist.queue.empty() and not hist.failing, 10)
        assert "spamnb_history_lost_total 0.0" in m.page()[0].decode()
        srv.stop()
        for raw in raws[1:4]:
            verdict(raw)
            time.sleep(0.2)  # each its own write, each failing
        assert until(lambda: hist.lost == 3, 30), (hist.lost, logged)
        assert "spamnb_history_lost_total 3.0" in m.page()[0].decode()
        assert len([line for line in logged if "not written" in line]) == 1  # said once, not per record
        srv.start()
        verdict(raws[4])
        assert until(lambda: any("records again" in line for line in logged), 30), logged
        assert "3 record(s) lost while it did not" in logged[-1]
        assert hist.lost == 3 and "spamnb_history_lost_total 3.0" in m.page()[0].decode()
        rec.close()
    finally:
        if srv.proc.poll() is None:
            srv.stop()


def documented_rules():
    """The alerting rules of docs/admin.md (its YAML block of ``groups:``)."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "admin.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if b.startswith("groups:")]
    assert len(blocks) == 1, "docs/admin.md should have one block of alerting rules"
    return blocks[0]


#: ``promtool test rules`` of the documented rules: each alert fires on the series it is for,
#: an unscanned counter that appears with its first message (no 0 before it) would not fire,
#: and TELLs refused (errors, no mail unscanned: a failover) do not raise SpamnbMailUnscanned.
RULE_TESTS = """\
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'spamnb_unscanned_total{kind="ex_ioerr",instance="mx1"}'
        values: '0 0 0 1 1 1 1 1'
      - series: 'spamnb_unscanned_total{kind="too_big",instance="mx3"}'
        values: '_ _ _ 1 1 1 1 1'
      - series: 'spamnb_errors_total{kind="ex_tempfail",instance="mx2"}'
        values: '0 0 0 7 7 7 7 7'
      - series: 'spamnb_unscanned_total{kind="ex_tempfail",instance="mx2"}'
        values: '0x8'
      - series: 'spamnb_store_up{instance="mx2"}'
        values: '0x8'
      - series: 'spamnb_store_success_age_seconds{instance="mx2"}'
        values: '0+60x8'
      - series: 'spamnb_store_up{instance="mx1"}'
        values: '1x8'
      - series: 'spamnb_store_success_age_seconds{instance="mx1"}'
        values: '1x8'
      - series: 'spamnb_learning_up{instance="mx1"}'
        values: '1 1 0 0 0 0 0 0'
      - series: 'spamnb_history_lost_total{instance="mx1"}'
        values: '0 0 0 3 3 3 3 3'
    alert_rule_test:
      - eval_time: 4m
        alertname: SpamnbMailUnscanned
        exp_alerts:
          - exp_labels: {severity: warning, kind: ex_ioerr, instance: mx1}
            exp_annotations: {summary: "mx1: mail passed unscanned (ex_ioerr)"}
      - eval_time: 4m
        alertname: SpamnbStoreDown
        exp_alerts:
          - exp_labels: {severity: critical, instance: mx2}
            exp_annotations: {summary: "mx2: the model's store does not answer"}
      - eval_time: 2m
        alertname: SpamnbLearningDown
        exp_alerts: []
      - eval_time: 4m
        alertname: SpamnbLearningDown
        exp_alerts:
          - exp_labels: {severity: warning, instance: mx1}
            exp_annotations: {summary: "mx1: the model cannot learn"}
      - eval_time: 5m
        alertname: SpamnbHistoryLost
        exp_alerts:
          - exp_labels: {severity: info, instance: mx1}
            exp_annotations: {summary: "mx1: history records lost"}
"""


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)")
def test_the_documented_alerting_rules_check_and_fire(tmp_path):
    (tmp_path / "rules.yml").write_text(documented_rules())
    check = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    (tmp_path / "tests.yml").write_text(RULE_TESTS)
    test = subprocess.run([PROMTOOL, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, timeout=60)
    assert test.returncode == 0, test.stdout + test.stderr
    for name in ("spamnb_unscanned_total", "spamnb_store_up", "spamnb_store_success_age_seconds",
                 "spamnb_learning_up", "spamnb_history_lost_total"):
        assert name in documented_rules()
