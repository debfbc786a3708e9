"""What a client refuses before any call: bad endpoints, settings that do not go together, a
bearer token that would cross the network in plaintext, bad names and arguments."""

import pytest

import lockd_client
from lockd_client import fence


@pytest.mark.parametrize("endpoint", ["", "127.0.0.1:7420", "ftp://h:1", "http://", "http://h:1/path",
                                      "http://h:99999", "http://user@h:1"])
def test_bad_endpoints_are_refused(endpoint):
    with pytest.raises(lockd_client.EndpointError):
        lockd_client.Client(endpoint)


def test_schemes_are_not_mixed():
    with pytest.raises(lockd_client.EndpointError, match="mix"):
        lockd_client.Client(["http://127.0.0.1:1", "https://127.0.0.1:2"])


def test_tls_files_need_https():
    with pytest.raises(lockd_client.EndpointError, match="https"):
        lockd_client.Client("http://127.0.0.1:1", ca="/etc/hostname")


def test_a_certificate_needs_its_key():
    with pytest.raises(lockd_client.InvalidArgument, match="key"):
        lockd_client.Client("https://127.0.0.1:1", cert="/etc/hostname")


def test_unreadable_files_are_named():
    with pytest.raises(lockd_client.InvalidArgument, match="/nonexistent/ca.pem"):
        lockd_client.Client("https://127.0.0.1:1", ca="/nonexistent/ca.pem")


@pytest.mark.parametrize("endpoint", ["http://10.1.2.3:7420", "http://lockd.internal:7420",
                                      "http://[2001:db8::1]:7420"])
def test_no_bearer_token_over_plaintext_to_another_host(endpoint):
    with pytest.raises(lockd_client.InvalidArgument, match="plaintext"):
        lockd_client.Client(endpoint, token="secret")
    # Even when only one of several endpoints is remote.
    with pytest.raises(lockd_client.InvalidArgument, match="plaintext"):
        lockd_client.Client(["http://127.0.0.1:7420", endpoint], token="secret")


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:7420", "http://localhost:7420", "http://[::1]:7420"])
def test_a_bearer_token_over_loopback_is_taken(endpoint):
    lockd_client.Client(endpoint, token="secret").close()


@pytest.mark.parametrize("token", ["", "   ", "has space", "t\u00e9"])
def test_bad_bearer_tokens(token):
    with pytest.raises(lockd_client.InvalidArgument, match="bearer"):
        lockd_client.Client("http://127.0.0.1:7420", token=token)


def test_token_and_token_file_together_are_refused(tmp_path):
    f = tmp_path / "t"
    f.write_text("x\n")
    with pytest.raises(lockd_client.InvalidArgument, match="not both"):
        lockd_client.Client("http://127.0.0.1:7420", token="x", token_file=str(f))


@pytest.mark.parametrize("kwargs, match", [
    ({"ttl": 0}, "ttl"), ({"ttl": -1}, "ttl"), ({"wait": -1}, "wait"), ({"permits": 1001}, "permits"),
    ({"permits": 2, "owner": "o"}, "owner"), ({"permits": 2, "mode": lockd_client.Mode.READ}, "mode"),
    ({"mode": lockd_client.Mode.WRITE, "owner": "o"}, "owner"),
])
def test_bad_acquire_arguments_are_refused_before_any_call(kwargs, match):
    # Nothing listens on port 9: a call would fail as unavailable, not as invalid.
    c = lockd_client.Client("http://127.0.0.1:9")
    with pytest.raises(lockd_client.InvalidArgument, match=match):
        c.acquire("r", **kwargs)


@pytest.mark.parametrize("name", ["", "a b", "x" * 257, "caf\u00e9", "a\nb", "a#b"])
def test_bad_resource_names(name):
    c = lockd_client.Client("http://127.0.0.1:9")
    with pytest.raises(lockd_client.InvalidArgument, match="resource"):
        c.acquire(name)


def test_lease_ids_stay_out_of_reprs():
    lease = lockd_client.Lease("r", "0123456789abcdef0123456789abcdef", 7, None, 30.0, 0, False, 1, None)
    assert "0123456789abcdef" not in repr(lease)
    assert lease.fence_token == "7"


def test_fence_refuses_unknown_targets_and_autocommit_psycopg2(testbed):
    lease = lockd_client.Lease("r", "id", 7, None, 30.0, 0, False, 1, None)
    with pytest.raises(TypeError, match="does not know"):
        with fence.transaction(object(), lease):
            pass
    import psycopg2
    conn = psycopg2.connect(testbed.servers["pg"]["dsn"])
    conn.autocommit = True
    try:
        with pytest.raises(lockd_client.InvalidArgument, match="autocommit"):
            with fence.transaction(conn, lease):
                pass
    finally:
        conn.close()


@pytest.mark.parametrize("status, body, ctype, error", [
    (409, b'{"type": "urn:fencing:problem:stale-token", "resource": "r", "token": "3", "highest": 4}',
     "application/problem+json", lockd_client.StaleToken),
    (403, b'{"type": "urn:fencing:problem:forged-token"}', "application/problem+json", lockd_client.FenceRefused),
    (409, b'{"type": "about:blank"}', "application/problem+json", None),
    (409, b'conflict', "text/plain", None),
    (200, b'{}', "application/json", None),
])
def test_http_refusals(status, body, ctype, error):
    if error is None:
        fence.check_response(status, body, ctype)
    else:
        with pytest.raises(error) as e:
            fence.check_response(status, body, ctype)
        assert e.value.status == status
