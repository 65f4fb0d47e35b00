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
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=page.encode(), capture_output=True, timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr

        conf = tmp_path / "prometheus.yml"
        conf.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: spamnb\n"
                        f"    static_configs:\n      - targets: ['127.0.0.1:{mport}']\n")
        prom = subprocess.Popen([PROMETHEUS, f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{pport}"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

        def query(q):
            try:
                data = json.loads(get(f"http://127.0.0.1:{pport}/api/v1/query?" + urllib.parse.urlencode({"query": q})))
            except OSError:
                return None
            return data["data"]["result"] if data.get("status") == "success" else None

        def counted():
            result = query('sum by (via) (spamnb_messages_total{job="spamnb"})')
            return {r["metric"]["via"]: float(r["value"][1]) for r in result or ()} or None

        assert until(lambda: (counted() or {}).get("spamd") == 12, 60), counted()
        assert counted()["socket"] == 3
        assert float(query("spamnb_scan_seconds_count")[0]["value"][1]) == 15
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
    page = m.page()[0].decode()
    assert 'spamnb_messages_total{verdict="spam",via="spamd"} 1.0' in page
    assert 'spamnb_learned_total{class="spam",source="filter-u"} 1.0' in page
    assert 'spamnb_learned_total{class="ham",source="tell"} 1.0' in page
    assert 'spamnb_errors_total{kind="ex_protocol"} 1.0' in page
