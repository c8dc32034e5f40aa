"""Jetway's Redis driver: the wire protocol, links, Sentinel, Cluster, TLS.

What a store needs of Redis and nothing of documents: ``topology.connect``
turns ``REDIS_URL`` (``address``) into a ``link.Link`` for one server, a
Sentinel group (``sentinel``) or a Redis Cluster (``cluster``, routed by
``slots``); links send commands, pipelines and Lua scripts (``script``)
over the RESP protocol (``resp``, ``reply_buffer``), dialled with TLS where
asked (``tls``), and report failures as ``errors``. The stores built on it
are in ``cache/``.
"""
