"""The ledger's errors: :class:`LedgerError`, and :class:`Fenced` for a writer whose
scheduler epoch is stale."""

from __future__ import annotations


class LedgerError(RuntimeError):
    """The ledger cannot do what was asked (a bad URL, a newer schema, an unknown job)."""


class Fenced(LedgerError):
    """A newer scheduler took over this ledger: the writer's epoch is stale. ``message``
    replaces the default text (the jobs service names the newer epoch's holder)."""

    def __init__(self, epoch: int, current: int, message: str | None = None) -> None:
        self.epoch = epoch
        self.current = current
        super().__init__(
            message
            or f"the ledger's scheduler epoch is {current}, this writer holds {epoch}: "
            "a newer scheduler took over, so this one may no longer write"
        )

    def __reduce__(self) -> tuple[object, ...]:  # the jobs service sends it to a client
        return (type(self), (self.epoch, self.current, str(self)))
