-- fence-proxy's fence check, installed in the protected database (schema `fencing`).
-- Idempotent: fence-proxy runs it at start-up; `fence-proxy pg print-schema` prints it for a DBA.
-- The owner of these objects must be able to end other sessions (a superuser, or a member of
-- pg_signal_backend when the application roles are not superusers): that is how an older-token
-- transaction that a newer token waits for is ended.
SELECT pg_advisory_xact_lock(1178946114);  -- one installer at a time (two proxies may start together)

CREATE SCHEMA IF NOT EXISTS fencing;

-- The highest accepted token per resource. A row only ever goes up.
CREATE TABLE IF NOT EXISTS fencing.tokens (
    resource   text        PRIMARY KEY CHECK (resource ~ '^[A-Za-z0-9._:/@-]+$' AND length(resource) <= 256),
    token      bigint      NOT NULL CHECK (token >= 1),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Ends the open transactions, other than the caller's, that presented a token lower than
-- `p_token` for `p_resource`. Each fenced transaction advertises its resource and token in
-- transaction-scoped advisory locks (class ids 1178946115 to 1178946117), visible in pg_locks.
CREATE OR REPLACE FUNCTION fencing.evict_older(p_resource text, p_token bigint)
RETURNS integer
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT count(*)::integer FROM (
        SELECT pg_terminate_backend(r.pid)
        FROM pg_locks r
        JOIN pg_locks lo ON lo.pid = r.pid AND lo.locktype = 'advisory' AND lo.objsubid = 2
                        AND lo.classid = 1178946116 AND lo.database = r.database
        LEFT JOIN pg_locks hi ON hi.pid = r.pid AND hi.locktype = 'advisory' AND hi.objsubid = 2
                        AND hi.classid = 1178946117 AND hi.database = r.database
        WHERE r.locktype = 'advisory' AND r.objsubid = 2 AND r.classid = 1178946115
          AND r.objid = (hashtext(p_resource)::bigint & 4294967295)::text::oid
          AND r.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND r.granted AND r.pid <> pg_backend_pid()
          AND (coalesce(hi.objid::text::bigint, 0) * 4294967296 + lo.objid::text::bigint) < p_token
    ) ended;
$fn$;

-- The fence check. fence-proxy runs it first in every transaction of a session that has
-- `fencing.resource` and `fencing.token` set, inside that transaction. It reads the two settings
-- itself, so they never travel as SQL text. Returns the resource and token it accepted, or no
-- row when the session has no token.
--   token = highest accepted: a shared lock on the resource's row (one holder's transactions run
--           together);
--   token > highest: raises the row, waiting for older-token transactions still open; after
--           p_wait_ms those are ended (evict_older) and the raise goes through;
--   token < highest: SQLSTATE FN001, the transaction fails.
-- Malformed settings: SQLSTATE FN002.
CREATE OR REPLACE FUNCTION fencing.check(p_wait_ms integer)
RETURNS TABLE (fenced_resource text, fenced_token bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r text := current_setting('fencing.resource', true);
    t_text text := current_setting('fencing.token', true);
    t bigint;
    cur bigint;
    old_timeout text;
    raised boolean;
    exists boolean;
BEGIN
    IF coalesce(r, '') = '' OR coalesce(t_text, '') = '' THEN
        RETURN;  -- no token: nothing to check
    END IF;
    IF r !~ '^[A-Za-z0-9._:/@-]+$' OR length(r) > 256 THEN
        RAISE EXCEPTION USING ERRCODE = 'FN002',
            MESSAGE = format('fencing.resource %s is not a valid resource name', quote_literal(left(r, 300))),
            HINT = '1 to 256 characters of A-Z a-z 0-9 - _ . : / @';
    END IF;
    IF t_text ~ '^[0-9]{1,19}$' THEN
        IF t_text::numeric BETWEEN 1 AND 9223372036854775807 THEN
            t := t_text::bigint;
        END IF;
    END IF;
    IF t IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'FN002',
            MESSAGE = format('fencing.token %s is not a valid fencing token', quote_literal(left(t_text, 40))),
            HINT = 'a whole number from 1 to 9223372036854775807';
    END IF;

    -- Advertise this transaction's resource and token (see evict_older).
    PERFORM pg_advisory_xact_lock_shared(1178946115, hashtext(r));
    PERFORM pg_advisory_xact_lock_shared(1178946116,
        ((t & 4294967295) - CASE WHEN (t & 4294967295) > 2147483647 THEN 4294967296 ELSE 0 END)::integer);
    IF t > 4294967295 THEN
        PERFORM pg_advisory_xact_lock_shared(1178946117, (t >> 32)::integer);
    END IF;

    LOOP
        SELECT k.token INTO cur FROM fencing.tokens k WHERE k.resource = r;
        exists := FOUND;
        IF exists AND cur >= t THEN
            -- Same or older token: share the row, then look again under the lock.
            SELECT k.token INTO cur FROM fencing.tokens k WHERE k.resource = r FOR SHARE;
            IF cur = t THEN
                fenced_resource := r; fenced_token := t; RETURN NEXT; RETURN;
            ELSIF cur > t THEN
                RAISE EXCEPTION USING ERRCODE = 'FN001',
                    MESSAGE = format('fencing token %s for resource %s is stale: the highest accepted token is %s',
                                     t, quote_literal(r), cur),
                    DETAIL = format('resource: %s, presented token: %s, highest accepted token: %s', r, t, cur),
                    HINT = 'this client no longer holds the lock; acquire it again for a new token';
            END IF;
            CONTINUE;
        END IF;
        -- Higher token (or a new resource): raise the row, waiting at most p_wait_ms for the
        -- transactions holding it, then ending the older-token ones among them.
        old_timeout := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
            IF exists THEN
                UPDATE fencing.tokens k SET token = t, updated_at = now()
                 WHERE k.resource = r AND k.token < t;
            ELSE
                INSERT INTO fencing.tokens AS k (resource, token) VALUES (r, t)
                    ON CONFLICT (resource) DO NOTHING;
            END IF;
            raised := FOUND;
            PERFORM set_config('lock_timeout', old_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
            PERFORM set_config('lock_timeout', old_timeout, true);
            IF fencing.evict_older(r, t) = 0 THEN
                -- Only transactions with the same or a higher token hold the row: wait for them as
                -- any statement would.
                PERFORM k.token FROM fencing.tokens k WHERE k.resource = r FOR SHARE;
            END IF;
            CONTINUE;
        END;
        IF raised THEN
            fenced_resource := r; fenced_token := t; RETURN NEXT; RETURN;
        END IF;
    END LOOP;
END;
$fn$;

REVOKE ALL ON TABLE fencing.tokens FROM PUBLIC;
GRANT SELECT ON TABLE fencing.tokens TO PUBLIC;
GRANT USAGE ON SCHEMA fencing TO PUBLIC;
REVOKE ALL ON FUNCTION fencing.evict_older(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.check(integer) TO PUBLIC;
