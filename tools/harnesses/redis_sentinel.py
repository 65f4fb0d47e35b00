"""A Redis Sentinel group: Debian's ``redis-server`` as a primary and its replicas,
``redis-sentinel`` watching them, each a process of its own. Either made here, on private
127.0.0.1 ports with every file in one folder (no persistence): what
tests/test_redis_sentinel.py and tools/benchmarks/bench_store.py ``--sentinel`` run a
store in; or started from configuration files as given (:meth:`Group.from_files`):
what tests/test_many_hosts.py runs docs/many-hosts.md's files in."""

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
LOOPBACK = "127.0.0.1"


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


def _address(where):
    """``(host, port)`` of a server or Sentinel: an address, or a port of 127.0.0.1."""
    return (LOOPBACK, where) if isinstance(where, int) else tuple(where)


class Group:
    """A primary, ``replicas`` replicas and ``sentinels`` Sentinels (quorum: a majority),
    each a process on a private port of 127.0.0.1, started and ready (every Sentinel knows
    every replica and the other Sentinels). ``tls``: ``(certificate, key, CA)`` files, every
    server and Sentinel then speaks TLS only (replication too); ``password``: the servers'
    (``requirepass``, ``masterauth``, the Sentinels' ``auth-pass``); ``sentinel_password``:
    the Sentinels' own ``requirepass``. Servers and Sentinels are named by ``(host, port)``
    (or, here, by their port alone)."""

    def __init__(self, folder: Path, replicas=1, sentinels=1, down_ms=1000, failover_ms=3000, *, tls=None,
                 password=None, sentinel_password=None):
        ports = distinct_ports(1 + replicas + sentinels)
        servers, watchers = [], []
        for i, port in enumerate(ports[:1 + replicas]):
            lines = [*self._listen(port, tls), f"bind {LOOPBACK}", 'save ""', "appendonly no", f"dir {folder}",
                     f"dbfilename dump-{port}.rdb"]
            if password:
                lines += [f"requirepass {password}", f"masterauth {password}"]
            if i:
                lines.append(f"replicaof {LOOPBACK} {ports[0]}")
            servers.append(((LOOPBACK, port), self._write(folder / f"redis-{port}.conf", lines)))
        for port in ports[1 + replicas:]:
            lines = [*self._listen(port, tls), f"bind {LOOPBACK}", f"dir {folder}",
                     f"sentinel monitor {SERVICE} {LOOPBACK} {ports[0]} {sentinels // 2 + 1}",
                     f"sentinel down-after-milliseconds {SERVICE} {down_ms}",
                     f"sentinel failover-timeout {SERVICE} {failover_ms}"]
            if password:
                lines.append(f"sentinel auth-pass {SERVICE} {password}")
            if sentinel_password:
                lines.append(f"requirepass {sentinel_password}")
            watchers.append(((LOOPBACK, port), self._write(folder / f"sentinel-{port}.conf", lines)))
        self._start(folder, servers, watchers, password=password, sentinel_password=sentinel_password,
                    ca=tls[2] if tls else None)

    @classmethod
    def from_files(cls, folder: Path, servers, sentinels, *, user=None, password=None, sentinel_password=None,
                   ca=None, service=SERVICE, args=()):
        """A group started from its configuration files as they are: ``servers``
        ``[((host, port), redis.conf)]``, the first the primary and the others its replicas
        by their own files, ``sentinels`` ``[((host, port), sentinel.conf)]`` watching
        ``service``; each run as ``redis-server FILE ARGS`` (``redis-sentinel``), its output
        in ``folder``. This harness logs in to the servers as ``user`` with ``password``
        (an ACL user that may run INFO), to the Sentinels with ``sentinel_password``, over
        TLS checked against ``ca`` when given. Ready as the other kind of group is."""
        group = cls.__new__(cls)
        group._start(folder, servers, sentinels, user=user, password=password, sentinel_password=sentinel_password,
                     ca=ca, service=service, args=args)
        return group

    def _start(self, folder, servers, sentinels, *, user=None, password=None, sentinel_password=None, ca=None,
               service=SERVICE, args=()):
        self.folder, self.service, self.args = folder, service, list(args)
        self.user, self.password, self.sentinel_password, self.ca = user, password, sentinel_password, ca
        self.servers = [_address(a) for a, _ in servers]
        self.sentinels = [_address(a) for a, _ in sentinels]
        self.files = {_address(a): Path(conf) for a, conf in [*servers, *sentinels]}
        self.procs: dict[tuple, subprocess.Popen] = {}
        try:
            for address in self.servers:
                self.start(address)
            for address in self.servers[1:]:
                wait(f"replication to {address[0]}:{address[1]}",
                     lambda a=address: self.connect(a).info("replication").get("master_link_status") == "up")
            for address in self.sentinels:
                self.start(address)
            replicas, others = len(self.servers) - 1, len(self.sentinels) - 1
            for address in self.sentinels:
                wait("the Sentinels' discovery",
                     lambda a=address: len(self.connect(a, True).sentinel_slaves(service)) == replicas
                     and len(self.connect(a, True).sentinel_sentinels(service)) == others)
        except BaseException:
            self.stop()
            raise

    @property
    def ports(self):
        """The servers' ports (a group made here: all on 127.0.0.1), the primary's first."""
        return [port for _, port in self.servers]

    @property
    def sentinel_ports(self):
        return [port for _, port in self.sentinels]

    @staticmethod
    def _write(path, lines):
        path.write_text("\n".join(lines) + "\n")
        return path

    @staticmethod
    def _listen(port, tls):
        """A server's or Sentinel's configuration lines for its port (TLS only, with ``tls``)."""
        if not tls:
            return [f"port {port}"]
        cert, key, ca = tls
        return ["port 0", f"tls-port {port}", f"tls-cert-file {cert}", f"tls-key-file {key}", f"tls-ca-cert-file {ca}",
                "tls-auth-clients no", "tls-replication yes"]

    def start(self, where):
        """Start the server or Sentinel at ``where`` from its file (again, after :meth:`kill`),
        and wait until it answers."""
        address = _address(where)
        sentinel = address in self.sentinels
        host, port = address
        log = self.folder / f"{'sentinel' if sentinel else 'redis'}-{host}-{port}.log"
        with open(log, "ab") as out:
            self.procs[address] = subprocess.Popen(["redis-sentinel" if sentinel else "redis-server",
                                                    str(self.files[address]), *self.args],
                                                   stdout=out, stderr=subprocess.STDOUT)

        def up():
            if self.procs[address].poll() is not None:  # it refused its file: say why
                raise RuntimeError(f"{log}: {log.read_text(errors='replace')[-800:]}")
            return self.connect(address, sentinel).ping()
        wait(f"{'redis-sentinel' if sentinel else 'redis-server'} on {host}:{port}", up)

    @staticmethod
    def client(port):
        """A client of a server on 127.0.0.1 of a group without TLS or passwords."""
        import redis

        return redis.Redis(host=LOOPBACK, port=port, socket_timeout=2)

    def connect(self, where, sentinel=False):
        """A client of a server (or, ``sentinel``, a Sentinel) of this group, with its TLS and login."""
        import redis

        host, port = _address(where)
        tls = {"ssl": True, "ssl_ca_certs": str(self.ca)} if self.ca else {}
        login = {"password": self.sentinel_password} if sentinel else {"username": self.user, "password": self.password}
        return redis.Redis(host=host, port=port, socket_timeout=2, **tls, **login)

    def url(self, prefix="t:", **params):
        """The store's ``redis+sentinel://`` URL (``rediss+sentinel://`` with TLS), with ``?prefix=``
        and ``params``."""
        query = "&".join([f"prefix={prefix}"] + [f"{k}={v}" for k, v in params.items()])
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return f"{'rediss' if self.ca else 'redis'}+sentinel://{hosts}/{self.service}/0?{query}"

    def primary(self) -> tuple[str, int]:
        """The primary's ``(host, port)``, as the first Sentinel names it now."""
        host, port = self.connect(self.sentinels[0], True).sentinel_get_master_addr_by_name(self.service)
        return host.decode() if isinstance(host, bytes) else host, int(port)

    def kill(self, where):
        """``kill -9`` the server or Sentinel at ``where``."""
        proc = self.procs[_address(where)]
        proc.kill()
        proc.wait(20)

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
