"""Callbacks from Slurm (job starts and ends, node events), each recorded once: the
write batch stores a callback together with the change it caused (batch.py), so a
callback delivered again is recognised here and ignored. The runs of Slurm users'
jobs on power-saving pools are written by the batch too, and read back with the
rest of the open work (`load_active`, bags.py) and by reports (reports.py)."""

from __future__ import annotations

from controller.store.engine import Engine


class CallbackQueries(Engine):
    """Queries of the callbacks table."""

    async def callback_seen(self, key: str) -> bool:
        """Whether a callback with this key was handled already."""
        return await self.read(
            lambda conn: (
                conn.execute("SELECT 1 FROM callbacks WHERE key = ?", (key,)).fetchone() is not None
            )
        )
