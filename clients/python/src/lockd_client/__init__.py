"""The Python SDK of lockd, the lock service whose fencing tokens are checked at the storage.

    import lockd_client
    from lockd_client import fence

    client = lockd_client.Client("http://127.0.0.1:7420")
    with client.lock("inventory:sku-1", ttl=30, wait=10) as lock:
        with fence.transaction(conn, lock) as tx:          # through fence-proxy
            tx.execute("UPDATE stock SET n = n - 1 WHERE sku = 'sku-1'")

`lockd_client.aio` is the same for asyncio. docs/clients/python.md is the guide.
"""

from ._core import (DEFAULT_ENDPOINT, Description, Lease, Mode, new_owner_id, new_request_id,
                    safety_margin)
from .client import Client, Lock, LockSet, LostReason
from .errors import (Busy, Cancelled, EndpointError, FenceRefused, InvalidArgument, LeaseNotCurrent,
                     LockdError, LockLost, NotGranted, PermissionDenied, QuotaExceeded, Rejected,
                     StaleToken, TlsError, Unauthenticated, Unavailable, WaitTimedOut)

__version__ = "0.1.0"

__all__ = [
    "Busy", "Cancelled", "Client", "DEFAULT_ENDPOINT", "Description", "EndpointError", "FenceRefused",
    "InvalidArgument", "Lease", "LeaseNotCurrent", "Lock", "LockLost", "LockSet", "LockdError",
    "LostReason", "Mode", "NotGranted", "PermissionDenied", "QuotaExceeded", "Rejected", "StaleToken",
    "TlsError", "Unauthenticated", "Unavailable", "WaitTimedOut", "new_owner_id", "new_request_id",
    "safety_margin",
]
