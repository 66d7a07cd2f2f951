"""Python client for the traincoord training coordinator.

    import traincoord
    run = traincoord.Run("http://127.0.0.1:8470", "digits")      # or traincoord.Run.from_env()
    for job in run.jobs():
        loss = train_on(job.batches)
        job.complete(loss=loss, samples=len(job.batches) * batch_size)

Every call has a timeout; a coordinator that is down or restarting is
retried with exponential backoff and jitter until ``give_up_after`` seconds (a coordinator never
reached: ``first_contact_timeout``), then :class:`Unreachable` is raised, each retry logged as
a warning on the ``traincoord`` logger; leases are kept alive by a background heartbeat thread.
The Python standard library only, except ``traincoord.torch`` (PyTorch).
"""

from .client import (
    BAD_REPLY,
    CUT_INCOMPLETE,
    CUT_MISMATCH,
    CUT_NOT_FOUND,
    GROUP_MISMATCH,
    LEASE_NOT_HELD,
    LEASE_NOT_YOURS,
    LEASE_UNKNOWN,
    RESTORE_CONFLICT,
    RESTORE_REQUIRED,
    RUN_NOT_FOUND,
    STALE_GENERATION,
    WORKER_NOT_REGISTERED,
    BadReply,
    CoordinatorError,
    Finished,
    Job,
    JobFeed,
    Run,
    Unreachable,
)

__all__ = ["BadReply", "CoordinatorError", "Finished", "Job", "JobFeed", "Run", "Unreachable",
           "BAD_REPLY", "LEASE_NOT_YOURS", "LEASE_UNKNOWN", "RUN_NOT_FOUND",
           "WORKER_NOT_REGISTERED", "STALE_GENERATION", "RESTORE_REQUIRED", "RESTORE_CONFLICT", "CUT_NOT_FOUND",
           "CUT_INCOMPLETE", "CUT_MISMATCH", "LEASE_NOT_HELD", "GROUP_MISMATCH"]
__version__ = "0.1.0"
