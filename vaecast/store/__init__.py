"""The durable store: job records in SQLite and one MP4 file per job, on disk.

`Store` (`vaecast.store.store`) is what the server holds; `database` is the SQLite
file (schema versions, WAL, moving a corrupt one aside), `writer` the one thread
that writes it, `owners` which process owns a running job, `recovery` what a start
finds. Nothing here imports the server: the server's job journal
(`vaecast.server.stream.job_journal`) tells the store what happens to a job.
"""

from vaecast.store.recovery import Recovered, StoredJob, StoredSegment
from vaecast.store.store import Store, default_store_dir

__all__ = ["Recovered", "Store", "StoredJob", "StoredSegment", "default_store_dir"]
