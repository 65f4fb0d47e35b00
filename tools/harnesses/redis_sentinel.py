"""A Redis Sentinel group on private 127.0.0.1 ports: Debian's ``redis-server`` as a
primary and its replicas, ``redis-sentinel`` watching them, every file in one folder
(no persistence). What tests/test_redis_sentinel.py and
tools/benchmarks/bench_store.py ``--sentinel`` run a store in."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project: spamnb, tools

from tools.harnesses.exim_spamd import free_port  # noqa: E402

SERVICE = "spamnb"


def wait(what, check, seconds=30):
    """Poll ``check()`` until it is true; RuntimeError after ``seconds``."""
    import redis

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.exceptions.RedisError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not happen in {seconds} s")


def distinct_ports(n):
    """``n`` free ports, all different: two calls of ``free_port`` can give the same one,
    and a server started on a taken port leaves the group talking to another process."""
    ports = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


class Group:
    """A primary, ``replicas`` replicas and ``sentinels`` Sentinels (quorum: a majority),
    each a process on a private port, started and ready (every Sentinel knows every
    replica and the other Sentinels). ``tls``: ``(certificate, key, CA)`` files, every
    server and Sentinel then speaks TLS only (replication too); ``password``: the servers'
    (``requirepass``, ``masterauth``, the Sentinels' ``auth-pass``); ``sentinel_password``:
    the Sentinels' own ``requirepass``."""

    def __init__(self, folder: Path, replicas=1, sentinels=1, down_ms=1000, failover_ms=3000, *, tls=None,
                 password=None, sentinel_password=None):
        self.folder = folder
        self.tls, self.password, self.sentinel_password = tls, password, sentinel_password
        self.procs: dict[int, subprocess.Popen] = {}
        ports = distinct_ports(1 + replicas + sentinels)
        self.ports, self.sentinel_ports = ports[:1 + replicas], ports[1 + replicas:]
        try:
            for i, port in enumerate(self.ports):
                self._redis(port, *([] if i == 0 else ["--replicaof", "127.0.0.1", str(self.ports[0])]))
            for port in self.ports[1:]:
                wait("replication", lambda p=port: self.connect(p).info("replication").get("master_link_status") == "up")
            for port in self.sentinel_ports:
                conf = folder / f"sentinel-{port}.conf"
                conf.write_text(f"{self._listen(port)}\nbind 127.0.0.1\ndir {folder}\n"
                                f"sentinel monitor {SERVICE} 127.0.0.1 {self.ports[0]} {sentinels // 2 + 1}\n"
                                f"sentinel down-after-milliseconds {SERVICE} {down_ms}\n"
                                f"sentinel failover-timeout {SERVICE} {failover_ms}\n"
                                + (f"sentinel auth-pass {SERVICE} {password}\n" if password else "")
                                + (f"requirepass {sentinel_password}\n" if sentinel_password else ""))
                self.procs[port] = subprocess.Popen(["redis-sentinel", str(conf)], stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL)
            for port in self.sentinel_ports:
                wait("the Sentinels' discovery",
                     lambda p=port: len(self.connect(p, True).sentinel_slaves(SERVICE)) == replicas
                     and len(self.connect(p, True).sentinel_sentinels(SERVICE)) == sentinels - 1)
        except BaseException:
            self.stop()
            raise

    def _listen(self, port):
        """A server's or Sentinel's configuration lines for its port (TLS only, with ``tls``)."""
        if not self.tls:
            return f"port {port}"
        cert, key, ca = self.tls
        return (f"port 0\ntls-port {port}\ntls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n"
                f"tls-auth-clients no\ntls-replication yes")

    def _redis(self, port, *extra):
        lines = self._listen(port).split("\n")
        if self.password:
            lines += [f"requirepass {self.password}", f"masterauth {self.password}"]
        options = [w for line in lines for w in ["--" + line.split(" ", 1)[0], line.split(" ", 1)[1]]]
        self.procs[port] = subprocess.Popen(
            ["redis-server", *options, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder), "--dbfilename", f"dump-{port}.rdb", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait("redis-server", lambda: self.connect(port).ping())

    @staticmethod
    def client(port):
        """A client of a group without TLS or passwords."""
        import redis

        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)

    def connect(self, port, sentinel=False):
        """A client of a server (or, ``sentinel``, a Sentinel) of this group, with its TLS and password."""
        import redis

        tls = {"ssl": True, "ssl_ca_certs": str(self.tls[2])} if self.tls else {}
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, **tls,
                           password=self.sentinel_password if sentinel else self.password)

    def url(self, prefix="t:", **params):
        """The store's ``redis+sentinel://`` URL (``rediss+sentinel://`` with TLS), with ``?prefix=``
        and ``params``."""
        query = "&".join([f"prefix={prefix}"] + [f"{k}={v}" for k, v in params.items()])
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"{'rediss' if self.tls else 'redis'}+sentinel://{hosts}/{SERVICE}/0?{query}"

    def primary(self) -> int:
        """The primary's port, as the first Sentinel names it now."""
        return int(self.connect(self.sentinel_ports[0], True).sentinel_get_master_addr_by_name(SERVICE)[1])

    def kill(self, port):
        self.procs[port].kill()
        self.procs[port].wait(20)

    def stop(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            proc.wait(20)


def main(argv=None):
    """Start a group, print the store URL that names it, and keep it until Ctrl-C."""
    ap = argparse.ArgumentParser(description="A Redis Sentinel group on private 127.0.0.1 ports, for trying "
                                             "`spamnb serve --store redis+sentinel://...` by hand.")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--sentinels", type=int, default=1)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="spamnb-sentinel-") as folder:
        group = Group(Path(folder), replicas=args.replicas, sentinels=args.sentinels)
        try:
            print(group.url(prefix="spamnb:"), flush=True)
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            group.stop()


if __name__ == "__main__":
    main()
