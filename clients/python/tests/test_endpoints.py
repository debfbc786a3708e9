"""Several endpoints: a call that could not be sent to a dead endpoint goes to the next; a
release is sent to another endpoint only when it never reached the first."""

import grpc

import lockd_client
from lockd_client.errors import never_sent


def test_a_release_moves_on_from_an_endpoint_it_never_reached(testbed):
    live, dead = testbed.servers["lockd"]["endpoint"], testbed.servers["dead"]["endpoint"]
    holder = lockd_client.Client(live)
    lock = holder.acquire("conf/endpoints/release", ttl=30)
    lease = lock.detach()
    # A fresh client whose first call is the release, its first endpoint down.
    other = lockd_client.Client([dead, live])
    assert other.release(lease.resource, lease.lease_id) is True
    assert holder.describe(lease.resource).held is False


class _Failed(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def test_only_a_failed_connection_counts_as_never_sent():
    assert never_sent(_Failed(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: "
                                                           "UNKNOWN: ipv4:127.0.0.1:9: Connection refused"))
    assert not never_sent(_Failed(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
    assert not never_sent(_Failed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
