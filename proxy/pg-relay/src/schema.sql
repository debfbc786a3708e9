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

-- How transactions on one resource coordinate: through a transaction-scoped advisory lock on a
-- 64-bit hash of the resource name (`fencing.lock_key`). A transaction with the current token
-- holds it shared; a transaction that raises the mark holds it exclusively, so a raise waits for
-- the older-token transactions still open and every later transaction sees the raised mark.
-- Shared advisory locks live in memory only: the common path writes nothing.
-- (No SET clause and a schema-qualified body, so that PostgreSQL inlines it where it is used.)
CREATE OR REPLACE FUNCTION fencing.lock_key(p_resource text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT pg_catalog.hashtextextended(p_resource, 1178946115) $fn$;

-- Ends the open transactions, other than the caller's, that a raise to `p_token` on
-- `p_resource` waits for and that presented an older token: those holding the resource's lock
-- shared (their token is the mark, which is below `p_token`) and raisers that advertised a lower
-- token (class ids 1178946116 and 1178946117, in pg_locks). Returns how many it ended. Does
-- nothing if the mark has meanwhile reached `p_token` (the caller is then the older one).
CREATE OR REPLACE FUNCTION fencing.evict_older(p_resource text, p_token bigint)
RETURNS integer
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    WITH key AS (
        SELECT ((fencing.lock_key(p_resource) >> 32) & 4294967295)::text::oid AS hi,
               (fencing.lock_key(p_resource) & 4294967295)::text::oid AS lo,
               (SELECT oid FROM pg_database WHERE datname = current_database()) AS db
    ), holders AS (
        SELECT l.pid, l.mode FROM pg_locks l, key
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.classid = key.hi
          AND l.objid = key.lo AND l.database = key.db AND l.granted
          AND l.pid <> pg_backend_pid()
    ), advertised AS (
        SELECT lo.pid, coalesce(hi.objid::text::bigint, 0) * 4294967296 + lo.objid::text::bigint AS token
        FROM key CROSS JOIN pg_locks lo
        LEFT JOIN pg_locks hi ON hi.pid = lo.pid AND hi.locktype = 'advisory' AND hi.objsubid = 2
                             AND hi.classid = 1178946117 AND hi.database = lo.database
        WHERE lo.locktype = 'advisory' AND lo.objsubid = 2 AND lo.classid = 1178946116
          AND lo.database = key.db
    )
    SELECT count(*)::integer FROM (
        SELECT pg_terminate_backend(h.pid) FROM holders h
        WHERE NOT EXISTS (SELECT 1 FROM fencing.tokens k WHERE k.resource = p_resource AND k.token >= p_token)
          AND (h.mode = 'ShareLock'
               OR EXISTS (SELECT 1 FROM advertised a WHERE a.pid = h.pid AND a.token < p_token))
    ) ended;
$fn$;

-- The fence check. fence-proxy runs it first in every transaction of a session that has
-- `fencing.resource` and `fencing.token` set, inside that transaction. It reads the two settings
-- itself, so they never travel as SQL text. Returns the resource and token it accepted, or no
-- row when the session has no token.
--   token = mark: the resource's lock, shared (one holder's transactions run together);
--   token > mark: the resource's lock, exclusively, then the mark is raised; waiting for the
--                 older-token transactions still open, and after p_wait_ms ending them
--                 (evict_older; READ COMMITTED raisers, the default isolation);
--   token < mark: SQLSTATE FN001, the transaction fails.
-- Malformed settings: SQLSTATE FN002. Under REPEATABLE READ or SERIALIZABLE the mark is read
-- FOR SHARE, so that a raise committed after the transaction's snapshot fails it (40001)
-- rather than going unseen.
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
    k bigint;
    read_committed boolean;
    old_timeout text;
    found_row boolean;
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
    k := fencing.lock_key(r);
    read_committed := current_setting('transaction_isolation') = 'read committed';

    LOOP
        SELECT m.token INTO cur FROM fencing.tokens m WHERE m.resource = r;
        found_row := FOUND;
        IF found_row AND cur >= t THEN
            -- Same or older token: share the resource, then read the mark again under the lock
            -- (a raise may have committed while we waited for it).
            PERFORM pg_advisory_xact_lock_shared(k);
            IF read_committed THEN
                SELECT m.token INTO cur FROM fencing.tokens m WHERE m.resource = r;
            ELSE
                SELECT m.token INTO cur FROM fencing.tokens m WHERE m.resource = r FOR SHARE;
            END IF;
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
        -- Higher token (or a new resource): advertise the token, take the resource exclusively,
        -- waiting at most p_wait_ms before ending the older-token transactions in the way.
        PERFORM pg_advisory_xact_lock_shared(1178946116,
            ((t & 4294967295) - CASE WHEN (t & 4294967295) > 2147483647 THEN 4294967296 ELSE 0 END)::integer);
        IF t > 4294967295 THEN
            PERFORM pg_advisory_xact_lock_shared(1178946117, (t >> 32)::integer);
        END IF;
        old_timeout := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
            PERFORM pg_advisory_xact_lock(k);
            PERFORM set_config('lock_timeout', old_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
            PERFORM set_config('lock_timeout', old_timeout, true);
            IF NOT read_committed OR fencing.evict_older(r, t) = 0 THEN
                -- Only transactions with the same or a higher token are in the way (or this one
                -- may not judge): wait for them as any statement would.
                PERFORM pg_advisory_xact_lock(k);
            END IF;
            CONTINUE;
        END;
        IF found_row THEN
            UPDATE fencing.tokens m SET token = t, updated_at = now()
             WHERE m.resource = r AND m.token < t;
        ELSE
            INSERT INTO fencing.tokens AS m (resource, token) VALUES (r, t)
                ON CONFLICT (resource) DO NOTHING;
        END IF;
        IF FOUND THEN
            fenced_resource := r; fenced_token := t; RETURN NEXT; RETURN;
        END IF;
        -- Someone else raised it first: look again (this transaction keeps the lock).
    END LOOP;
END;
$fn$;

-- The check as the relay writes it into a Query's text, where the prepared statements of its
-- fast path (schema.rs) cannot go: `p_current` says that the proxy believes the session's
-- token is the resource's mark (a check with the same settings passed, and no higher mark has
-- been seen since). Then the common case costs one read: take the resource's lock shared and
-- read the mark once. If the belief was wrong (the settings were changed where the proxy could
-- not see it, or the marks were reset), the general check above decides; it then takes the lock
-- exclusively while this transaction holds it shared, which PostgreSQL allows (a transaction
-- does not conflict with itself; two such transactions at once would deadlock and one would be
-- ended with 40P01, which drivers retry).
CREATE OR REPLACE FUNCTION fencing.check(p_wait_ms integer, p_current boolean)
RETURNS TABLE (fenced_resource text, fenced_token bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r text;
    t_text text;
    t bigint;
    cur bigint;
BEGIN
    IF NOT p_current THEN
        RETURN QUERY SELECT * FROM fencing.check(p_wait_ms);
        RETURN;
    END IF;
    r := current_setting('fencing.resource', true);
    t_text := current_setting('fencing.token', true);
    IF coalesce(r, '') = '' OR coalesce(t_text, '') = '' OR t_text !~ '^[1-9][0-9]{0,17}$' THEN
        -- No token, or one the proxy did not see: the general check says what it is.
        RETURN QUERY SELECT * FROM fencing.check(p_wait_ms);
        RETURN;
    END IF;
    t := t_text::bigint;
    PERFORM pg_advisory_xact_lock_shared(fencing.lock_key(r));
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT m.token INTO cur FROM fencing.tokens m WHERE m.resource = r;
    ELSE
        -- This snapshot may predate a raise committed while we waited for the lock: a locking
        -- read of a row changed since fails with 40001 instead of reading it stale.
        SELECT m.token INTO cur FROM fencing.tokens m WHERE m.resource = r FOR SHARE;
    END IF;
    IF FOUND AND cur = t THEN
        fenced_resource := r; fenced_token := t; RETURN NEXT; RETURN;
    END IF;
    -- Stale (the full check refuses it, FN001) or above the mark (it raises it).
    RETURN QUERY SELECT * FROM fencing.check(p_wait_ms);
END;
$fn$;

-- The fallback of the relay's fast path (see CHECK_FAST in schema.rs): the general check, as
-- one value, the token it accepted (NULL when the session has no token).
CREATE OR REPLACE FUNCTION fencing.check_token(p_wait_ms integer)
RETURNS bigint
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$ SELECT c.fenced_token FROM fencing.check(p_wait_ms) c $fn$;

REVOKE ALL ON TABLE fencing.tokens FROM PUBLIC;
GRANT SELECT ON TABLE fencing.tokens TO PUBLIC;
GRANT USAGE ON SCHEMA fencing TO PUBLIC;
REVOKE ALL ON FUNCTION fencing.evict_older(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.lock_key(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.check(integer) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.check(integer, boolean) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.check_token(integer) TO PUBLIC;
