"""One service, not N workers: a reload asked of one worker reaches them all. Each worker process keeps, in the
prediction store's database (shared by the workers, and by replicas on PostgreSQL), a row with the reload
generation it has applied, the versions it serves and a heartbeat; an admin reload adds a generation, and every
worker follows it within CHECK_S. The worker that was asked answers once every live worker (heard from in the last
STALE_S) has applied it, or after WAIT_S with those that have not.

Tables (created on first use, beside the prediction store's):
- `service_reloads`: one row per reload asked (id: the generation, asked_at).
- `service_workers`: worker ("host:pid:tag"), seen_at, generation, versions (JSON: family -> version).
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket

from sqlalchemy import JSON, Column, DateTime, Integer, MetaData, String, Table, delete, func, insert, select, update
from sqlalchemy.engine import Engine

from contract.prediction_store import create_despite_others, utc_now

CHECK_S = 0.25  # how often a worker looks for a new generation
HEARTBEAT_S = 1.0  # how often it says it is alive
STALE_S = 5.0  # a worker not heard from for this long is taken for gone
WAIT_S = 30.0  # how long an admin reload waits for the other workers

metadata = MetaData()
reloads = Table("service_reloads", metadata, Column("id", Integer, primary_key=True, autoincrement=True),
                Column("asked_at", DateTime(timezone=True), nullable=False))
workers = Table("service_workers", metadata, Column("worker", String(128), primary_key=True),
                Column("seen_at", DateTime(timezone=True), nullable=False),
                Column("generation", Integer, nullable=False), Column("versions", JSON, nullable=False))


class Workers:
    """This worker's view of the others, on `engine`'s database (blocking calls: run them off the event loop)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.name = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"  # two apps in one process differ
        self.applied = 0  # the generation this worker has applied

    def start(self) -> int:
        """Create the tables; a worker starting now loads the latest versions, so it has applied every reload (the
        generation it starts at)."""
        create_despite_others(lambda: metadata.create_all(self.engine))
        self.applied = self.generation()
        return self.applied

    def generation(self) -> int:
        """The latest reload's generation (0: none yet)."""
        with self.engine.connect() as connection:
            return connection.execute(select(func.max(reloads.c.id))).scalar() or 0

    def ask(self) -> int:
        """Ask every worker to reload; the new generation."""
        with self.engine.begin() as connection:
            return connection.execute(insert(reloads).values(asked_at=utc_now())).inserted_primary_key[0]

    def report(self, versions: dict[str, str]) -> None:
        """This worker is alive, has applied `self.applied` and serves `versions`."""
        row = {"seen_at": utc_now(), "generation": self.applied, "versions": versions}
        with self.engine.begin() as connection:
            if not connection.execute(update(workers).where(workers.c.worker == self.name).values(**row)).rowcount:
                connection.execute(insert(workers).values(worker=self.name, **row))

    def lagging(self, generation: int) -> list[str]:
        """The live workers that have not applied `generation` yet."""
        since = utc_now() - datetime.timedelta(seconds=STALE_S)
        query = select(workers.c.worker).where(workers.c.seen_at >= since, workers.c.generation < generation)
        with self.engine.connect() as connection:
            return sorted(connection.execute(query).scalars())

    def live(self) -> int:
        since = utc_now() - datetime.timedelta(seconds=STALE_S)
        with self.engine.connect() as connection:
            return connection.execute(select(func.count()).select_from(workers).where(workers.c.seen_at >= since)
                                      ).scalar()

    def leave(self) -> None:
        with self.engine.begin() as connection:
            connection.execute(delete(workers).where(workers.c.worker == self.name))
