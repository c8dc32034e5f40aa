"""What "stored" means before a write is answered: the primary, or N replicas too.

Redis replicates asynchronously: a primary that dies before a replica has a
write takes it along, and the promoted replica never had it. With
``replicas`` at 1 or more, every write is followed by ``WAIT replicas
timeout`` on the connection that sent it (``WAIT`` counts that connection's
own writes) and is answered only once that many replicas have it. ``WAIT``
blocks its connection until then, so these writes go over a pool of their
own, never in front of a read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class WriteConcern:
    replicas: int = 0  # 0: answered once the primary has it (Redis's own default)
    timeout: float = 1.0  # seconds WAIT may block before the write is answered not-replicated

    @property
    def waits(self) -> bool:
        return self.replicas > 0

    def wait_command(self) -> Tuple[bytes, int, int]:
        # WAIT's timeout is in milliseconds, and 0 would mean forever.
        return (b"WAIT", self.replicas, max(1, round(self.timeout * 1000)))


PRIMARY_ONLY = WriteConcern()
