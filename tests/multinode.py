"""Multi-node Redis the suite starts itself: a Redis Cluster and a Sentinel group.

Everything listens on 127.0.0.1 on free ports, lives in a temp directory,
and is stopped by pid (``stop_process``), also when a test fails. Both
classes look like ``tests.support.RedisServer`` (``start``, ``stop``,
``url``, ``client``), so the session fixtures can run the API suite on
either (``JETWAY_TEST_TOPOLOGY=cluster|sentinel``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import redis
from redis.cluster import ClusterNode, RedisCluster

from cache.credentials.tokens import CHANGED_CHANNEL as TOKENS_CHANNEL
from tests.support import RedisServer, free_port, stop_process, wait_until

TOPOLOGY = os.environ.get("JETWAY_TEST_TOPOLOGY", "single")
SERVICE = "mymaster"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for servers that speak TLS only: a CA, and a certificate (for 127.0.0.1) it signed."""

    ca: Path
    certificate: Path
    key: Path

    def server_args(self) -> List[str]:
        return [
            *("--tls-cert-file", str(self.certificate), "--tls-key-file", str(self.key)),
            *("--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "no"),
        ]


class RedisProcess:
    """One redis-server (or sentinel) on a TCP port, its log beside its data; ``tls``: TLS only."""

    def __init__(self, directory: Path, port: int, args: List[str], tls: Optional[TlsFiles] = None) -> None:
        self.directory = directory
        self.port = port
        self.args = args
        self.tls = tls
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> RedisProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                ["redis-server", *self.args], cwd=self.directory, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while not self._answers():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after 30 s waiting for redis on port {self.port}")
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        # A server that exited (its port taken, a bad argument) fails at once, with its last words.
        assert self.process is not None
        if self.process.poll() is not None:
            log = (self.directory / "redis.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"redis-server on port {self.port} exited {self.process.returncode}: {log}")
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown (no goodbye to replicas or sentinels)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)

    def client(self) -> redis.Redis:
        if self.tls is not None:
            return redis.Redis("127.0.0.1", self.port, socket_timeout=5, ssl=True, ssl_ca_certs=str(self.tls.ca))
        return redis.Redis("127.0.0.1", self.port, socket_timeout=5)

    def subscribers(self) -> int:
        """How many of Jetway's token caches (one per worker) are subscribed here.

        Counted by their channel (``PUBSUB NUMSUB``: a node counts its own
        subscribers): the collection settings' caches, the hot caches'
        tracking connections and Sentinels subscribe here too, to others.
        """
        with self.client() as client:
            return int(dict(client.pubsub_numsub(TOKENS_CHANNEL))[TOKENS_CHANNEL])

    def trackers(self) -> int:
        """How many of Jetway's hot caches (one per worker) track this server's keys."""
        with self.client() as client:
            clients = client.client_list(_type="pubsub")
        return sum(1 for one in clients if one.get("name") == "jetway-hot-cache" and "t" in one.get("flags", ""))


def data_args(directory: Path, port: int) -> List[str]:
    return ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(directory)]


class ClusterServers:
    """A Redis Cluster of ``masters`` masters with ``replicas`` each, made with ``redis-cli --cluster create``.

    With ``tls``, clients and the cluster bus speak TLS only (``rediss-cluster://``).
    """

    def __init__(self, directory: Path, masters: int = 3, tls: Optional[TlsFiles] = None, replicas: int = 0) -> None:
        self.directory = directory
        self.tls = tls
        self.replicas = replicas
        self.nodes: List[RedisProcess] = []
        for _ in range(masters * (1 + replicas)):
            port = free_port()
            home = directory / f"node-{port}"
            args = data_args(home, port)
            if tls is not None:
                args = [*data_args(home, 0), "--tls-port", str(port), "--tls-cluster", "yes", *tls.server_args()]
            args += [
                "--cluster-enabled",
                "yes",
                # Redis 7: the bus port need not be port + 10000 (which may
                # be taken, or above 65535 for a high free port).
                "--cluster-port",
                str(free_port()),
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "3000",
            ]
            self.nodes.append(RedisProcess(home, port, args, tls))

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"rediss-cluster://{hosts}?ca={self.tls.ca}" if self.tls else f"redis-cluster://{hosts}"

    def start(self) -> ClusterServers:
        for node in self.nodes:
            node.start()
        replicas = ["--cluster-replicas", str(self.replicas)] if self.replicas else []
        self.cli("--cluster", "create", *(f"127.0.0.1:{node.port}" for node in self.nodes), *replicas, "--cluster-yes")
        wait_until(self.settled, 30, "every node to agree on the slot map")
        wait_until(self.replicas_in_sync, 30, "every replica to sync with its master")
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def cli(self, *args: str, timeout: float = 120) -> str:
        tls = ["--tls", "--cacert", str(self.tls.ca)] if self.tls else []
        result = subprocess.run(["redis-cli", *tls, *args], capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def settled(self) -> bool:
        """Every node says the cluster is ok and sees the same owners of all slots."""
        views = []
        for node in self.live_nodes():
            with node.client() as client:
                if b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                    return False
                slots = client.execute_command("CLUSTER SLOTS")
                views.append(sorted((start, end, owner[1]) for start, end, owner, *_ in slots))
        return all(view == views[0] for view in views)

    def live_nodes(self) -> List[RedisProcess]:
        return [node for node in self.nodes if node.process is not None and node.process.poll() is None]

    def role(self, node: RedisProcess) -> str:
        with node.client() as client:
            return client.execute_command("ROLE")[0].decode()

    def replicas_in_sync(self) -> bool:
        """Every live replica's link to its master is up."""
        for node in self.live_nodes():
            with node.client() as client:
                info = client.info("replication")
            if info["role"] == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def replica_of(self, master: RedisProcess) -> RedisProcess:
        """The node that replicates ``master``."""
        with master.client() as client:
            replica_port = int(client.info("replication")["slave0"]["port"])
        return next(node for node in self.nodes if node.port == replica_port)

    def node_ids(self) -> Dict[int, str]:
        """Node id by port."""
        with self.nodes[0].client() as client:
            lines = client.execute_command("CLUSTER", "NODES").decode().splitlines()
        return {int(line.split()[1].split("@")[0].rsplit(":", 1)[1]): line.split()[0] for line in lines}

    def client(self) -> RedisCluster:
        nodes = [ClusterNode("127.0.0.1", node.port) for node in self.nodes]
        if self.tls is not None:
            return RedisCluster(startup_nodes=nodes, ssl=True, ssl_ca_certs=str(self.tls.ca))
        return RedisCluster(startup_nodes=nodes)


class ReplicatedPair:
    """A master and one replica of it, nothing watching them.

    ``upstream``: the port the replica dials for its master, when something
    stands between them (``tests.lag_proxy``); the master's own by default.
    """

    def __init__(self, directory: Path, upstream: Optional[int] = None) -> None:
        self.directory = directory
        master_port, replica_port = free_port(), free_port()
        self.master = RedisProcess(directory / "master", master_port, data_args(directory / "master", master_port))
        self.replica = RedisProcess(
            directory / "replica",
            replica_port,
            [*data_args(directory / "replica", replica_port), "--replicaof", "127.0.0.1", str(upstream or master_port)],
        )

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.master.port}/0"

    def start(self) -> ReplicatedPair:
        self.master.start()
        self.replica.start()
        wait_until(self.replica_in_sync, 30, "the replica to sync")
        return self

    def stop(self) -> None:
        for process in (self.replica, self.master):
            process.stop()

    def replica_in_sync(self) -> bool:
        with self.replica.client() as client:
            return client.info("replication")["master_link_status"] == "up"


class SentinelServers:
    """One master, one replica, three sentinels watching them as ``mymaster``."""

    def __init__(
        self,
        directory: Path,
        down_after_ms: int = 1000,
        upstream: Optional[int] = None,
        failover_timeout_ms: int = 10000,
    ) -> None:
        """``upstream``: as for ``ReplicatedPair``.

        ``failover_timeout_ms`` is also how long a sentinel leaves a replica
        that replicates from another address than the master's before it
        points it at the master (``+fix-slave-config``): a replica behind a
        proxy needs it longer than the test runs.
        """
        self.directory = directory
        self.pair = ReplicatedPair(directory, upstream)
        self.master, self.replica = self.pair.master, self.pair.replica
        master_port = self.master.port
        self.sentinels: List[RedisProcess] = []
        self._seen: Dict[int, str] = {}  # what each sentinel last said of the group, for a timeout's message
        for index in range(3):
            port = free_port()
            home = directory / f"sentinel-{index}"
            home.mkdir(parents=True, exist_ok=True)
            config = home / "sentinel.conf"  # sentinels rewrite their config: one each
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {home}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self.sentinels.append(RedisProcess(home, port, [str(config), "--sentinel"]))

    @property
    def url(self) -> str:
        return "redis-sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{SERVICE}"

    def start(self) -> SentinelServers:
        self.pair.start()
        for sentinel in self.sentinels:
            sentinel.start()
        try:
            wait_until(self._sentinels_ready, 30, "the sentinels to know the replica and each other")
        except TimeoutError as error:  # once in CI-like runs: say which sentinel knew what
            raise TimeoutError(f"{error}; last seen: {self._seen}") from None
        return self

    def stop(self) -> None:
        for process in self.sentinels:
            process.stop()
        self.pair.stop()

    def master_address(self) -> Tuple[str, int]:
        with self.sentinels[0].client() as client:
            host, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return host.decode(), int(port)

    def client(self) -> redis.Redis:
        """A client of whichever server is master now."""
        host, port = self.master_address()
        return redis.Redis(host, port, socket_timeout=5)

    def current_master(self) -> RedisProcess:
        port = self.master_address()[1]
        return next(process for process in (self.master, self.replica) if process.port == port)

    def _sentinels_ready(self) -> bool:
        self._seen = {}
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                state = client.execute_command("SENTINEL", "MASTER", SERVICE)
                fields = dict(zip(state[::2], state[1::2]))
                self._seen[sentinel.port] = " ".join(
                    f"{name}={fields.get(name.encode(), b'?').decode()}"
                    for name in ("flags", "num-slaves", "num-other-sentinels")
                )
                if int(fields[b"num-slaves"]) < 1 or int(fields[b"num-other-sentinels"]) < 2:
                    return False
        return True


def servers_for(directory: Path) -> object:
    """The session's Redis for ``JETWAY_TEST_TOPOLOGY`` (single, cluster or sentinel)."""
    if TOPOLOGY == "cluster":
        return ClusterServers(directory)
    if TOPOLOGY == "sentinel":
        return SentinelServers(directory)
    return RedisServer(directory)
