-- fence-proxy's fence check, installed in the protected database (schema `fencing`).
-- Idempotent: fence-proxy runs it at start-up; `fence-proxy pg print-schema` prints it for a DBA.
-- The owner of these objects must be able to end other sessions (a superuser, or a member of
-- pg_signal_backend when the application roles are not superusers): that is how an older-token
-- transaction that a newer token waits for is ended.
-- No statement here waits for a lock for long: a session that holds one of these tables (any
-- role may read fencing.tokens) would otherwise keep the installation waiting, and with it every
-- session that needs the table after it. It fails instead (55P03), and says what it waited for.
SET LOCAL lock_timeout = '10s';
-- One installer at a time (two proxies may start together): once the schema exists, by a lock
-- on a table no application role may lock (an advisory lock any role could hold, to keep every
-- proxy from starting); the first installation, by an advisory lock.
DO $do$
BEGIN
    IF to_regclass('fencing.secret') IS NOT NULL THEN
        LOCK TABLE fencing.secret IN EXCLUSIVE MODE;
    ELSE
        PERFORM pg_advisory_xact_lock(1178946114);
    END IF;
END
$do$;

CREATE SCHEMA IF NOT EXISTS fencing;

-- The highest accepted token per resource. A row only ever goes up.
CREATE TABLE IF NOT EXISTS fencing.tokens (
    resource   text        PRIMARY KEY CHECK (resource ~ '^[A-Za-z0-9._:/@-]+$' AND length(resource) <= 256),
    token      bigint      NOT NULL CHECK (token >= 1),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The signed form that raised the mark, hashed (NULL: a plain token, or changed since): the
-- relay's fast read lets a session whose token hashes to it pass without the full check, and
-- a hash tells a reader nothing it could present (the preimage is the signed token).
-- (Added by a catalog look first: ALTER TABLE takes the table exclusively even when it changes
-- nothing, and queued, that lock would hold up every session that reads the marks.)
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'fencing.tokens'::regclass AND attname = 'signed_hash' AND NOT attisdropped) THEN
        ALTER TABLE fencing.tokens ADD COLUMN signed_hash bytea;
    END IF;
    -- The version of the signing configuration (fencing.keys_version) that signed_hash was
    -- verified under: the fast reads pass the hash only while that version is current.
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'fencing.tokens'::regclass AND attname = 'keys_version' AND NOT attisdropped) THEN
        ALTER TABLE fencing.tokens ADD COLUMN keys_version bigint;
    END IF;
END
$do$;

-- Signed tokens (docs/security.md). The keys that verify them: HMAC-SHA256 pads of each key
-- (RFC 2104: the secret padded to 64 bytes, XOR 0x36 and 0x5c), so that the check computes
-- the MAC with the built-in sha256 alone. fence-proxy writes these from its key file at
-- start-up. Nobody but the owner of schema `fencing` may read them: a role that can read a
-- key can sign any token (so the application's roles must not be superusers or that owner).
CREATE TABLE IF NOT EXISTS fencing.keys (
    key_id  text    PRIMARY KEY CHECK (key_id ~ '^[A-Za-z0-9_-]{1,32}$'),
    ipad    bytea   CHECK (length(ipad) = 64),
    opad    bytea   CHECK (length(opad) = 64),
    retired boolean NOT NULL DEFAULT false,
    CHECK (retired OR (ipad IS NOT NULL AND opad IS NOT NULL))
);

-- The key of the proofs with which transactions announce their tokens (fencing.advertise):
-- 256 random bits made once, at the first installation. Nobody but the owner of schema
-- `fencing` may read it: a role that could would forge announcements, and so keep a newer
-- token waiting for it.
CREATE TABLE IF NOT EXISTS fencing.secret (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    k        bytea   NOT NULL CHECK (length(k) = 32)
);
INSERT INTO fencing.secret (k)
    VALUES (sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text || clock_timestamp()::text, 'UTF8')))
    ON CONFLICT DO NOTHING;

-- The resources that need signed tokens: those whose name starts with one of these ('' for
-- every resource). Readable by all, so that the relay's fast read can see it.
CREATE TABLE IF NOT EXISTS fencing.signed_prefixes (
    prefix text PRIMARY KEY CHECK (prefix ~ '^[A-Za-z0-9._:/@-]*$' AND length(prefix) <= 256)
);

-- The version of the signing configuration: every statement that changes fencing.keys or
-- fencing.signed_prefixes (fence-proxy's installation, or a hand) raises it, in its own
-- transaction. A raise stores, beside the hash of the signed token it verified, the version it
-- verified under, read in the same snapshot as the keys; the fast reads (the relay's and the
-- commit hook's) pass that hash only while the version they read is the same, so a change of
-- keys that commits at any moment after the verification ends it, without a lock. The commit
-- hook also refuses (40001) a REPEATABLE READ or SERIALIZABLE transaction whose snapshot shows
-- an older version than the latest: its check would judge by keys that are no longer the
-- fence's. Readable by all (the relay's fast read).
CREATE TABLE IF NOT EXISTS fencing.keys_version (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    v        bigint  NOT NULL
);
-- Above every version a mark was stored under (were the row ever deleted, an old hash must
-- not match again). Only when missing, and without waiting for a change in progress.
INSERT INTO fencing.keys_version (v)
    SELECT coalesce((SELECT max(m.keys_version) FROM fencing.tokens m), 0) + 1
    WHERE NOT EXISTS (SELECT 1 FROM fencing.keys_version);

CREATE OR REPLACE FUNCTION fencing.keys_changed()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    UPDATE fencing.keys_version SET v = v + 1;
    RETURN NULL;
END;
$fn$;

-- Row triggers, so that a statement that changes nothing (an installation with the same key
-- file) raises nothing: every open REPEATABLE READ transaction would otherwise be refused at
-- each proxy's start. Fired ALWAYS: also with session_replication_role = replica (a restore
-- with triggers disabled, logical replication's apply).
DO $do$
DECLARE
    tab text;
BEGIN
    FOREACH tab IN ARRAY ARRAY['keys', 'signed_prefixes'] LOOP
        IF (SELECT count(*) FROM pg_trigger t WHERE t.tgrelid = format('fencing.%I', tab)::regclass
            AND t.tgname IN ('fencing_keys_added', 'fencing_keys_updated', 'fencing_keys_truncated')
            AND t.tgfoid = 'fencing.keys_changed()'::regprocedure) < 3 THEN
            EXECUTE format('CREATE OR REPLACE TRIGGER fencing_keys_added AFTER INSERT OR DELETE ON fencing.%I '
                           'FOR EACH ROW EXECUTE FUNCTION fencing.keys_changed()', tab);
            EXECUTE format('CREATE OR REPLACE TRIGGER fencing_keys_updated AFTER UPDATE ON fencing.%I '
                           'FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION fencing.keys_changed()', tab);
            EXECUTE format('CREATE OR REPLACE TRIGGER fencing_keys_truncated AFTER TRUNCATE ON fencing.%I '
                           'FOR EACH STATEMENT EXECUTE FUNCTION fencing.keys_changed()', tab);
        END IF;
        IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = format('fencing.%I', tab)::regclass
                   AND t.tgname IN ('fencing_keys_added', 'fencing_keys_updated', 'fencing_keys_truncated')
                   AND t.tgenabled <> 'A') THEN
            EXECUTE format('ALTER TABLE fencing.%I ENABLE ALWAYS TRIGGER fencing_keys_added', tab);
            EXECUTE format('ALTER TABLE fencing.%I ENABLE ALWAYS TRIGGER fencing_keys_updated', tab);
            EXECUTE format('ALTER TABLE fencing.%I ENABLE ALWAYS TRIGGER fencing_keys_truncated', tab);
        END IF;
    END LOOP;
END
$do$;

-- Records of marks changed by hand (`fence-proxy marks lower|reset`): who, why, from what.
CREATE TABLE IF NOT EXISTS fencing.mark_changes (
    at        timestamptz NOT NULL DEFAULT now(),
    resource  text        NOT NULL,
    action    text        NOT NULL CHECK (action IN ('lower', 'reset')),
    old_token bigint,
    new_token bigint,
    actor     text        NOT NULL,
    reason    text        NOT NULL
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

-- The proof of an announcement (fencing.advertise): 64 bits of SHA-256 over the secret, the
-- resource's lock key, the token and the announcing backend's pid. Only the schema's owner may
-- compute it (SECURITY DEFINER, EXECUTE revoked from PUBLIC); the pid in it keeps one session
-- from showing another's proof as its own.
CREATE OR REPLACE FUNCTION fencing.proof(p_key bigint, p_token bigint, p_pid integer)
RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT ('x' || encode(substr(sha256(s.k || int8send(p_key) || int8send(p_token) || int4send(p_pid)), 1, 8), 'hex'))::bit(64)::bigint
    FROM fencing.secret s
$fn$;

-- The sessions, other than the caller's, that hold `p_resource`'s fence lock (shared or
-- exclusively) or wait for it exclusively, each with the highest token it proved it announced for this resource (NULL
-- when it proved none). A transaction announces a token through fencing.advertise, which only
-- fencing.check and `fence-proxy marks` call: two-key advisory locks whose first key is a
-- half of the resource's lock key and whose second is a half of the token (anyone can take
-- those), and a lock on its proof, which no application role can compute. Every token the
-- two-key locks of a holder could spell (a low half, with each high half or none) is tried
-- against its proof locks; locks taken by hand, or copied from another session, prove nothing.
CREATE OR REPLACE FUNCTION fencing.holders(p_resource text)
RETURNS TABLE (pid integer, token bigint, exclusive boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    WITH key AS (
        SELECT fencing.lock_key(p_resource) AS k,
               ((fencing.lock_key(p_resource) >> 32) & 4294967295)::text::oid AS hi,
               (fencing.lock_key(p_resource) & 4294967295)::text::oid AS lo,
               (SELECT oid FROM pg_database WHERE datname = current_database()) AS db
    ), holding AS (
        -- Waiting exclusive requests too: PostgreSQL queues every later shared request behind
        -- them, so a session that keeps one waiting keeps the resource as a holder would.
        SELECT l.pid, bool_or(l.mode = 'ExclusiveLock') AS exclusive FROM pg_locks l, key
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.classid = key.hi
          AND l.objid = key.lo AND l.database = key.db
          AND (l.granted OR l.mode = 'ExclusiveLock')
          AND l.pid <> pg_backend_pid()
        GROUP BY l.pid
    ), shaped AS (
        -- A transaction announces one token per resource (two, if it raised it and then read
        -- with a newer one): a holder with more announcement-shaped locks under this key than
        -- any check takes proves nothing, and its pairs are not tried (a session could take
        -- thousands, and the pairs grow with their square).
        SELECT l.pid FROM pg_locks l, key
        WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.database = key.db
          AND (l.classid = key.hi OR l.classid = key.lo)
          AND l.pid IN (SELECT pid FROM holding)
        GROUP BY l.pid
        HAVING count(*) <= 8
    ), claims AS (
        SELECT lo.pid, h.high * 4294967296 + lo.objid::text::bigint AS token
        FROM key CROSS JOIN pg_locks lo
        CROSS JOIN LATERAL (
            SELECT hi.objid::text::bigint AS high FROM pg_locks hi
            WHERE hi.pid = lo.pid AND hi.locktype = 'advisory' AND hi.objsubid = 2
              AND hi.classid = key.lo AND hi.database = key.db
            UNION ALL SELECT 0
        ) h
        WHERE lo.locktype = 'advisory' AND lo.objsubid = 2 AND lo.classid = key.hi
          AND lo.database = key.db AND lo.pid IN (SELECT pid FROM shaped)
    ), proved AS (
        SELECT c.pid, max(c.token) AS token FROM claims c, key
        WHERE EXISTS (
            SELECT 1 FROM pg_locks p
            WHERE p.pid = c.pid AND p.locktype = 'advisory' AND p.objsubid = 1 AND p.database = key.db
              AND p.classid = ((fencing.proof(key.k, c.token, c.pid) >> 32) & 4294967295)::text::oid
              AND p.objid = (fencing.proof(key.k, c.token, c.pid) & 4294967295)::text::oid)
        GROUP BY c.pid
    )
    SELECT h.pid, p.token, h.exclusive FROM holding h LEFT JOIN proved p ON p.pid = h.pid
$fn$;

-- Takes resource `r`'s lock shared, for the transaction, when a first try could not: an
-- exclusive holder is a raise in progress (a newer token: it is waited for) or a session that
-- took the lock by hand and proves no token, which would keep every transaction with the
-- current token waiting for ever; after `p_wait_ms` (1000 when NULL) such holders are ended.
-- Returns true. The callers try `pg_try_advisory_xact_lock_shared` first: the common case
-- costs no call of this.
CREATE OR REPLACE FUNCTION fencing.share(r text, p_wait_ms integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    k bigint := fencing.lock_key(r);
    old_timeout text := current_setting('lock_timeout');
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', coalesce(p_wait_ms, 1000) || 'ms', true);
            PERFORM pg_advisory_xact_lock_shared(k);
            PERFORM set_config('lock_timeout', old_timeout, true);
            RETURN true;
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- (the subtransaction's end restored lock_timeout)
        END;
        -- Those in the way that prove no token, holding or waiting (each round ends those
        -- that queued ahead meanwhile; later ones queue behind this request). A raise in
        -- progress is waited for, round after round.
        PERFORM pg_terminate_backend(h.pid) FROM fencing.holders(r) h WHERE h.token IS NULL AND h.exclusive;
    END LOOP;
END;
$fn$;

-- Ends the open transactions, other than the caller's, that a raise to `p_token` on
-- `p_resource` waits for and that are not provably a newer token's: those holding the
-- resource's lock (shared: their token is the mark, below `p_token`; or exclusively) that
-- proved no announcement for this resource, or the announcement of a lower token (see
-- fencing.holders). Returns how many it ended. Does nothing if the mark has meanwhile reached
-- `p_token` (the caller is then the older one). A holder that announced nothing is ended
-- whether it holds the lock shared or exclusively: every raiser announces before it takes the
-- lock, so an exclusive holder without a proof is a session that took the lock by hand (or
-- forged an announcement), and would otherwise keep the resource from its new holder.
CREATE OR REPLACE FUNCTION fencing.evict_older(p_resource text, p_token bigint)
RETURNS integer
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT count(*)::integer FROM (
        SELECT pg_terminate_backend(h.pid) FROM fencing.holders(p_resource) h
        WHERE NOT EXISTS (SELECT 1 FROM fencing.tokens k WHERE k.resource = p_resource AND k.token >= p_token)
          AND coalesce(h.token < p_token, true)
    ) ended;
$fn$;

-- `fence-proxy marks lower|reset`: takes `p_resource`'s fence lock exclusively, announcing the
-- largest token, within the caller's lock_timeout; if it is still held then, ends the holders
-- (and exclusive waiters) that proved no announcement (sessions holding it by hand, forged
-- announcements, transactions with the current token) and tries again, for a few rounds of
-- that timeout. A transaction with a
-- proved token keeps it: the command then fails with 55P03 and says so.
CREATE OR REPLACE FUNCTION fencing.take_for_change(p_resource text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    k bigint := fencing.lock_key(p_resource);
BEGIN
    PERFORM fencing.advertise(k, 9223372036854775807);
    FOR i IN 1..5 LOOP
        BEGIN
            PERFORM pg_advisory_xact_lock(k);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_terminate_backend(h.pid) FROM fencing.holders(p_resource) h WHERE h.token IS NULL;
        END;
    END LOOP;
    PERFORM pg_advisory_xact_lock(k);  -- 55P03 again: a proved token holds it
END;
$fn$;

-- The low 32 bits of `v` as a signed integer (what a two-key advisory lock takes; pg_locks
-- shows it back as an unsigned oid).
CREATE OR REPLACE FUNCTION fencing.signed32(v bigint)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT ((v & 4294967295) - CASE WHEN (v & 4294967295) > 2147483647 THEN 4294967296 ELSE 0 END)::integer $fn$;

-- Takes the two-key announcement lock (a, b) shared, for the transaction. Announcements take
-- these keys, always shared: a session that holds one exclusively, or waits for it so, is
-- keeping announcements out by hand (any role can compute the keys of the next tokens), and is
-- ended first.
CREATE OR REPLACE FUNCTION fencing.announce_key(a integer, b integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF pg_try_advisory_xact_lock_shared(a, b) THEN
        RETURN;
    END IF;
    PERFORM pg_terminate_backend(l.pid) FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.mode = 'ExclusiveLock'
      AND l.classid = (a::bigint & 4294967295)::text::oid
      AND l.objid = (b::bigint & 4294967295)::text::oid
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.pid <> pg_backend_pid();
    PERFORM pg_advisory_xact_lock_shared(a, b);
END;
$fn$;

-- Takes the lock on an announcement's proof `p` shared. Nobody but an announcement takes it, and
-- never exclusively: a session that holds it so (it can read a proof's key in pg_locks while an
-- announcement holds it) is ended first.
CREATE OR REPLACE FUNCTION fencing.announce_proof(p bigint)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF pg_try_advisory_xact_lock_shared(p) THEN
        RETURN;
    END IF;
    PERFORM pg_terminate_backend(l.pid) FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.mode = 'ExclusiveLock'
      AND l.classid = ((p >> 32) & 4294967295)::text::oid
      AND l.objid = (p & 4294967295)::text::oid
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.pid <> pg_backend_pid();
    PERFORM pg_advisory_xact_lock_shared(p);
END;
$fn$;

-- Advertises token `t` for the resource whose lock key is `k` until the transaction ends:
-- two-key advisory locks, the first key a half of `k`, the second a half of `t` (the high half
-- only for tokens above 2^32), and a lock on the announcement's proof, which evict_older reads
-- (fencing.holders).
CREATE OR REPLACE FUNCTION fencing.advertise(k bigint, t bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    PERFORM fencing.announce_key(fencing.signed32(k >> 32), fencing.signed32(t & 4294967295));
    IF t > 4294967295 THEN
        PERFORM fencing.announce_key(fencing.signed32(k & 4294967295), (t >> 32)::integer);
    END IF;
    -- The proof that this announcement is the check's (fencing.holders).
    PERFORM fencing.announce_proof(fencing.proof(k, t, pg_catalog.pg_backend_pid()));
END;
$fn$;

-- What is shown of a presented token: never a whole MAC. A signed one (two dots or more) cut
-- to its number, key id and the first 8 characters of what follows, as fence-proxy's logs
-- show it; a plain number whole; anything else (a malformed form, which may hold a valid MAC
-- with a character added or changed) cut to 16 characters.
CREATE OR REPLACE FUNCTION fencing.shown_token(t_text text)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT CASE WHEN t_text ~ '^[0-9]{1,19}$' THEN t_text
                WHEN m IS NOT NULL THEN
                    left(m[1], 60) || left(m[2], 8) || CASE WHEN length(m[2]) > 8 THEN '…' ELSE '' END
                WHEN length(t_text) > 16 THEN left(t_text, 16) || '…'
                ELSE t_text
           END
    FROM (SELECT regexp_match(t_text, '^([^.]*\.[^.]*\.)(.*)$') AS m) AS parts
$fn$;

-- FN007: the token is not lockd's for resource `r`.
CREATE OR REPLACE FUNCTION fencing.refuse_signature(r text, t_text text, why text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'FN007',
        MESSAGE = format('fencing token %s for resource %s is refused: %s',
                         quote_literal(fencing.shown_token(t_text)), quote_literal(r), why),
        DETAIL = format('resource: %s, presented token: %s', r, fencing.shown_token(t_text)),
        HINT = 'present the signed token lockd gave with the grant (TOKEN.KEY_ID.MAC), for this resource';
END;
$fn$;

-- Whether resource `r` needs a signed token.
CREATE OR REPLACE FUNCTION fencing.signature_required(r text)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$ SELECT EXISTS (SELECT 1 FROM fencing.signed_prefixes p WHERE left(r, length(p.prefix)) = p.prefix) $fn$;

-- The token that the setting `t_text` stands for, for resource `r` (a valid name): a plain
-- number (1 ..= 2^63-1), refused with FN007 where the resource needs a signed token; or the
-- signed form TOKEN.KEY_ID.MAC, whose MAC must be HMAC-SHA256 under that key of
-- 'fence-v1' LF resource LF token (canonical decimal), else FN007. Without any key here, a
-- signed form's number is taken as a plain token's would be. Malformed: FN002.
CREATE OR REPLACE FUNCTION fencing.token_of(r text, t_text text)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    parts text[];
    t bigint;
    k record;
    mac bytea;
BEGIN
    IF t_text ~ '^[0-9]{1,19}$' THEN
        parts := ARRAY[t_text];
    ELSE
        parts := regexp_match(t_text, '^([0-9]{1,19})\.([A-Za-z0-9_-]{1,32})\.([0-9a-f]{64})$');
    END IF;
    IF parts IS NOT NULL AND parts[1]::numeric BETWEEN 1 AND 9223372036854775807 THEN
        t := parts[1]::bigint;
    END IF;
    IF t IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'FN002',
            MESSAGE = format('fencing.token %s is not a valid fencing token', quote_literal(fencing.shown_token(t_text))),
            HINT = 'a whole number from 1 to 9223372036854775807, or the signed form TOKEN.KEY_ID.MAC lockd gives';
    END IF;
    IF array_length(parts, 1) = 1 THEN
        IF fencing.signature_required(r) THEN
            PERFORM fencing.refuse_signature(r, t_text, 'the resource needs a token signed by lockd');
        END IF;
        RETURN t;
    END IF;
    SELECT * INTO k FROM fencing.keys WHERE key_id = parts[2];
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT 1 FROM fencing.keys) AND NOT fencing.signature_required(r) THEN
            RETURN t;
        END IF;
        PERFORM fencing.refuse_signature(r, t_text, format('key %s is not a key of this fence', quote_literal(parts[2])));
    END IF;
    IF k.retired THEN
        PERFORM fencing.refuse_signature(r, t_text, format('key %s has been retired', quote_literal(parts[2])));
    END IF;
    mac := sha256(k.opad || sha256(k.ipad || convert_to('fence-v1' || chr(10) || r || chr(10) || t::text, 'UTF8')));
    -- Compared through a hash, so that the time the comparison takes says nothing about the MAC.
    IF sha256(mac) <> sha256(decode(parts[3], 'hex')) THEN
        PERFORM fencing.refuse_signature(r, t_text,
            'its signature is not lockd''s for this resource and token (forged, altered, or signed for another resource)');
    END IF;
    RETURN t;
END;
$fn$;

-- FN001: token `t` for resource `r` is below the mark `cur`. The relay reads DETAIL back
-- (sqlstate.rs) and words its own FN001 the same way.
CREATE OR REPLACE FUNCTION fencing.refuse_stale(r text, t bigint, cur bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'FN001',
        MESSAGE = format('fencing token %s for resource %s is stale: the highest accepted token is %s',
                         t, quote_literal(r), cur),
        DETAIL = format('resource: %s, presented token: %s, highest accepted token: %s', r, t, cur),
        HINT = 'this client no longer holds the lock; acquire it again for a new token';
END;
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
-- Malformed settings, or only one of the two: SQLSTATE FN002. Under REPEATABLE READ or SERIALIZABLE the mark is read
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
    sh bytea;
    ver bigint;
BEGIN
    IF coalesce(r, '') = '' AND coalesce(t_text, '') = '' THEN
        RETURN;  -- no token: nothing to check
    END IF;
    -- Half a declaration never passes (invariant 9): it is a client's mistake, not "no token".
    IF coalesce(r, '') = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'FN002',
            MESSAGE = 'fencing.token is set but fencing.resource is not',
            HINT = 'set both fencing.resource and fencing.token, or neither';
    END IF;
    IF coalesce(t_text, '') = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'FN002',
            MESSAGE = format('fencing.resource %s is set but fencing.token is not (or is empty)', quote_literal(left(r, 300))),
            HINT = 'set both fencing.resource and fencing.token, or neither';
    END IF;
    IF r !~ '^[A-Za-z0-9._:/@-]+$' OR length(r) > 256 THEN
        RAISE EXCEPTION USING ERRCODE = 'FN002',
            MESSAGE = format('fencing.resource %s is not a valid resource name', quote_literal(left(r, 300))),
            HINT = '1 to 256 characters of A-Z a-z 0-9 - _ . : / @';
    END IF;
    -- The number, after its signature (FN007) where there is or must be one.
    -- The token and the version of the keys it was judged by, in one snapshot.
    SELECT fencing.token_of(r, t_text), (SELECT kv.v FROM fencing.keys_version kv) INTO t, ver;
    -- The hash a raise stores, for the fast reads (the relay's and the commit hook's): only of
    -- a signed form whose signature was verified, under a key of this fence (without any key,
    -- token_of takes a signed form's number unverified).
    IF position('.' in t_text) > 0
       AND EXISTS (SELECT 1 FROM fencing.keys kk WHERE kk.key_id = split_part(t_text, '.', 2)) THEN
        sh := sha256(convert_to(t_text, 'UTF8'));
    END IF;
    k := fencing.lock_key(r);
    read_committed := current_setting('transaction_isolation') = 'read committed';
    IF current_setting('transaction_read_only') = 'on' AND pg_current_xact_id_if_assigned() IS NULL THEN
        -- A read-only transaction writes nothing, so it needs no raise and no locking read
        -- (which it may not do): a token not below the mark passes, holding the lock shared.
        -- Only one that has not written yet: SET TRANSACTION READ ONLY is allowed after writes,
        -- and such a transaction takes the path below (whose raise PostgreSQL then refuses,
        -- 25006), so that a write under a newer token never commits without raising the mark.
        -- It advertises its token, so that a raise to an older one does not end it.
        PERFORM fencing.advertise(k, t);
        IF NOT pg_try_advisory_xact_lock_shared(k) THEN
            PERFORM fencing.share(r, p_wait_ms);
        END IF;
        SELECT m.token INTO cur FROM fencing.tokens m WHERE m.resource = r;
        IF FOUND AND cur > t THEN
            PERFORM fencing.refuse_stale(r, t, cur);
        END IF;
        fenced_resource := r; fenced_token := t; RETURN NEXT; RETURN;
    END IF;

    LOOP
        SELECT m.token INTO cur FROM fencing.tokens m WHERE m.resource = r;
        found_row := FOUND;
        IF found_row AND cur >= t THEN
            -- Same or older token: share the resource, then read the mark again under the lock
            -- (a raise may have committed while we waited for it).
            IF NOT pg_try_advisory_xact_lock_shared(k) THEN
                PERFORM fencing.share(r, p_wait_ms);
            END IF;
            IF read_committed THEN
                SELECT m.token INTO cur FROM fencing.tokens m WHERE m.resource = r;
            ELSE
                SELECT m.token INTO cur FROM fencing.tokens m WHERE m.resource = r FOR SHARE;
            END IF;
            IF cur = t THEN
                fenced_resource := r; fenced_token := t; RETURN NEXT; RETURN;
            ELSIF cur > t THEN
                PERFORM fencing.refuse_stale(r, t, cur);
            END IF;
            CONTINUE;
        END IF;
        -- Higher token (or a new resource): advertise the token for this resource, take the
        -- resource exclusively, waiting at most p_wait_ms before ending the older-token
        -- transactions in the way. The advertisement is a two-key advisory lock, the first key
        -- a half of the resource's lock key, the second a half of the token (evict_older reads
        -- them): a transaction that raises several resources is judged, for each, by the token
        -- it presented for that one.
        PERFORM fencing.advertise(k, t);
        old_timeout := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
            PERFORM pg_advisory_xact_lock(k);
            PERFORM set_config('lock_timeout', old_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
            PERFORM set_config('lock_timeout', old_timeout, true);
            -- Under REPEATABLE READ or SERIALIZABLE too: the snapshot may not show a mark
            -- raised since, and a transaction sharing that newer mark may then be ended; that
            -- costs it a retry, where waiting would let any session that shares the lock by
            -- hand keep this one out for ever. (This one then fails its raise, 40001.)
            IF fencing.evict_older(r, t) = 0 THEN
                -- Only transactions with the same or a higher token are in the way (or this one
                -- may not judge): wait for them as any statement would.
                PERFORM pg_advisory_xact_lock(k);
            END IF;
            CONTINUE;
        END;
        IF sh IS NOT NULL THEN
            -- The signature again, against the keys as they are now: a change of keys that
            -- committed while this raise waited for the lock is verified against here (no row
            -- of fencing.keys is locked: a raise left open would hold up every installation).
            SELECT fencing.token_of(r, t_text), (SELECT kv.v FROM fencing.keys_version kv) INTO t, ver;
            IF NOT EXISTS (SELECT 1 FROM fencing.keys kk WHERE kk.key_id = split_part(t_text, '.', 2)) THEN
                sh := NULL;
            END IF;
        END IF;
        IF found_row THEN
            UPDATE fencing.tokens m SET token = t, updated_at = now(), signed_hash = sh,
                   keys_version = CASE WHEN sh IS NOT NULL THEN ver END
             WHERE m.resource = r AND m.token < t;
        ELSE
            INSERT INTO fencing.tokens AS m (resource, token, signed_hash, keys_version)
                VALUES (r, t, sh, CASE WHEN sh IS NOT NULL THEN ver END)
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
    IF coalesce(r, '') = '' OR coalesce(t_text, '') = '' OR t_text !~ '^[1-9][0-9]{0,17}$'
       OR current_setting('transaction_read_only') = 'on' OR fencing.signature_required(r) THEN
        -- No token, half of one, or one the proxy did not see, or a read-only transaction
        -- (which may not read FOR SHARE), or a signed (or a needed) signature: the general
        -- check says what.
        RETURN QUERY SELECT * FROM fencing.check(p_wait_ms);
        RETURN;
    END IF;
    t := t_text::bigint;
    IF NOT pg_try_advisory_xact_lock_shared(fencing.lock_key(r)) THEN
        PERFORM fencing.share(r, p_wait_ms);
    END IF;
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

-- Fires the transaction's deferred triggers now instead of at COMMIT, so that the check that
-- follows at the transaction's end judges what they wrote and declared (fence-proxy calls it
-- there and nowhere else: in mid-transaction it would make the client's deferred constraints
-- immediate). No SET clause, so that the triggers run with the session's settings, as at
-- COMMIT; the body names nothing a search_path could redirect.
CREATE OR REPLACE FUNCTION fencing.fire_deferred()
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    SET CONSTRAINTS ALL IMMEDIATE;
    RETURN true;
END;
$fn$;

-- The refusal of a commit point where the session has a WITH HOLD cursor (see schema.rs): the
-- cursor's query runs when the transaction commits, after every check the proxy can run, so it
-- could write with a stale token, or declare one and write, unseen.
CREATE OR REPLACE FUNCTION fencing.held_cursor()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'FN006',
        MESSAGE = 'fence-proxy: a transaction that declares a WITH HOLD cursor cannot be fenced',
        DETAIL = 'PostgreSQL runs a held cursor''s query when its transaction commits, after the fence''s last check; this transaction was rolled back. A held cursor that an earlier transaction left open (one committed where the fence cannot check: inside a procedure, or by a FunctionCall) refuses every commit until it is closed',
        HINT = 'declare the cursor without WITH HOLD and read it inside its transaction, or CLOSE it before COMMIT, or read through a connection that does not pass fence-proxy';
END;
$fn$;

-- The fallback of the relay's fast path (see CHECK_FAST in schema.rs): the general check, as
-- one value, the token it accepted (NULL when the session has no token).
CREATE OR REPLACE FUNCTION fencing.check_token(p_wait_ms integer)
RETURNS bigint
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$ SELECT c.fenced_token FROM fencing.check(p_wait_ms) c $fn$;

-- The commit hook's fast check in C, as fence-proxy's check before a transaction's statements
-- where PostgreSQL judges the commits (schema.rs, CHECK_HOOKED): created from the hook's own
-- file (fence_hook.library, which only the loaded library reports) by a superuser's
-- installation, and only then; without it the relay sends its lock and its fast read.
DO $do$
BEGIN
    IF coalesce(current_setting('fence_hook.library', true), '') <> ''
       AND (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('CREATE OR REPLACE FUNCTION fencing.hook_check(p_wait_ms integer) RETURNS bigint '
                       'LANGUAGE c VOLATILE AS %L, %L',
                       current_setting('fence_hook.library'), 'fence_hook_check');
        GRANT EXECUTE ON FUNCTION fencing.hook_check(integer) TO PUBLIC;
    END IF;
END
$do$;

-- The guard of the commit hook's remembered passes (proxy/pg-hook, "Remembered passes"): on
-- each table its fast check reads, a row trigger for INSERT, UPDATE and DELETE (logical
-- replication's apply fires no statement trigger; rows written through an inheritance or
-- partition parent fire their own table's row triggers) and a statement trigger for
-- TRUNCATE, fired ALWAYS, that make the writing transaction raise the fence epoch in shared
-- memory when it ends, so that a backend reads the mark again after any change. Created where
-- the library is loaded, by a superuser's installation, and only then; without these the hook
-- reads the tables at every check. Created only when missing: CREATE TRIGGER takes the table
-- in SHARE ROW EXCLUSIVE mode, which would wait for (and hold up) every writer. Nobody else
-- may call the function (or put it on a table of theirs, where it does nothing anyway).
DO $do$
DECLARE
    tab text;
BEGIN
    IF coalesce(current_setting('fence_hook.library', true), '') <> ''
       AND (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        IF NOT EXISTS (SELECT 1 FROM pg_proc p
                       WHERE p.oid = to_regprocedure('fencing.hook_changed()')
                         AND p.probin = current_setting('fence_hook.library')
                         AND p.prosrc = 'fence_hook_changed') THEN
            EXECUTE format('CREATE OR REPLACE FUNCTION fencing.hook_changed() RETURNS trigger '
                           'LANGUAGE c VOLATILE AS %L, %L',
                           current_setting('fence_hook.library'), 'fence_hook_changed');
        END IF;
        REVOKE ALL ON FUNCTION fencing.hook_changed() FROM PUBLIC;
        FOREACH tab IN ARRAY ARRAY['tokens', 'signed_prefixes', 'keys', 'keys_version'] LOOP
            IF (SELECT count(*) FROM pg_trigger t WHERE t.tgrelid = format('fencing.%I', tab)::regclass
                AND ((t.tgname = 'fencing_hook_changed' AND (t.tgtype & 29) = 29)      -- ROW, INSERT, DELETE, UPDATE
                     OR (t.tgname = 'fencing_hook_truncated' AND (t.tgtype & 32) = 32)) -- TRUNCATE
                AND t.tgfoid = 'fencing.hook_changed()'::regprocedure
                AND t.tgenabled = 'A' AND t.tgqual IS NULL AND t.tgattr::text = '') < 2 THEN
                EXECUTE format('CREATE OR REPLACE TRIGGER fencing_hook_changed '
                               'AFTER INSERT OR UPDATE OR DELETE ON fencing.%I '
                               'FOR EACH ROW EXECUTE FUNCTION fencing.hook_changed()', tab);
                EXECUTE format('CREATE OR REPLACE TRIGGER fencing_hook_truncated AFTER TRUNCATE ON fencing.%I '
                               'FOR EACH STATEMENT EXECUTE FUNCTION fencing.hook_changed()', tab);
                EXECUTE format('ALTER TABLE fencing.%I ENABLE ALWAYS TRIGGER fencing_hook_changed', tab);
                EXECUTE format('ALTER TABLE fencing.%I ENABLE ALWAYS TRIGGER fencing_hook_truncated', tab);
            END IF;
        END LOOP;
    END IF;
END
$do$;

-- Protected tables: PostgreSQL itself refuses a write (INSERT, UPDATE, DELETE, MERGE, TRUNCATE,
-- COPY FROM) to the table unless the writing session presents a current token for a resource
-- whose name starts with the table's prefix, on any connection, through fence-proxy or not.
-- A statement trigger runs the general check above, with the settings in force at that
-- statement: a current token shares the resource's lock, a newer one raises the mark, a stale
-- one fails (FN001), half a declaration fails (FN002), none or one for another resource fails
-- (FN005). Once per statement, not per row.
CREATE OR REPLACE FUNCTION fencing.guard()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    prefix text := TG_ARGV[0];
    wait_ms integer := TG_ARGV[1]::integer;
    r text := coalesce(current_setting('fencing.resource', true), '');
    t text := coalesce(current_setting('fencing.token', true), '');
    accepted text;
BEGIN
    IF r = '' AND t = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'FN005',
            MESSAGE = format('table %s is protected: a write needs a current fencing token for a resource under %s',
                             quote_ident(TG_TABLE_SCHEMA) || '.' || quote_ident(TG_TABLE_NAME), quote_literal(prefix)),
            HINT = 'set fencing.resource and fencing.token to the lock this client holds';
    END IF;
    SELECT c.fenced_resource INTO accepted FROM fencing.check(wait_ms) c;
    IF accepted IS NULL OR left(accepted, length(prefix)) <> prefix THEN
        RAISE EXCEPTION USING ERRCODE = 'FN005',
            MESSAGE = format('table %s is protected: fencing.resource %s is not under %s',
                             quote_ident(TG_TABLE_SCHEMA) || '.' || quote_ident(TG_TABLE_NAME),
                             quote_literal(left(r, 300)), quote_literal(prefix)),
            HINT = 'set fencing.resource to the lock this client holds for this table';
    END IF;
    RETURN NULL;
END;
$fn$;

-- Drops the guard trigger from `p_table` and its partitions or inheritance children; returns
-- those of them that are tables (what protect guards). Needs the right to drop their triggers.
CREATE OR REPLACE FUNCTION fencing.drop_guards(p_table regclass)
RETURNS SETOF regclass
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    rel regclass;
BEGIN
    FOR rel IN
        WITH RECURSIVE tree(oid) AS (
            SELECT p_table::oid
            UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid
        )
        SELECT c.oid::regclass FROM tree JOIN pg_class c ON c.oid = tree.oid
        WHERE c.relkind IN ('r', 'p', 'f')
    LOOP
        IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = rel AND tgname = 'fencing_guard') THEN
            EXECUTE format('DROP TRIGGER fencing_guard ON %s', rel);
        END IF;
        RETURN NEXT rel;
    END LOOP;
END;
$fn$;

-- Protects `p_table` (and its partitions or inheritance children; later ones as they come
-- where the event trigger below is installed, otherwise by protect again) for resources
-- starting with `p_prefix` ('' for any);
-- `p_wait_ms` is the fence wait of the check the trigger runs. Again on a protected table:
-- replaces its prefix and wait. Needs the right to create triggers on the table (its owner).
CREATE OR REPLACE FUNCTION fencing.protect(p_table regclass, p_prefix text, p_wait_ms integer DEFAULT 1000)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    rel regclass;
BEGIN
    IF p_prefix IS NULL OR p_prefix !~ '^[A-Za-z0-9._:/@-]*$' OR length(p_prefix) > 256 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('fencing.protect: prefix %s is not the start of a resource name', quote_literal(left(coalesce(p_prefix, 'NULL'), 300))),
            HINT = 'at most 256 characters of A-Z a-z 0-9 - _ . : / @';
    END IF;
    IF p_wait_ms IS NULL OR p_wait_ms NOT BETWEEN 1 AND 3600000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('fencing.protect: wait %s ms is out of range', coalesce(p_wait_ms::text, 'NULL')),
            HINT = '1 to 3600000 milliseconds';
    END IF;
    FOR rel IN SELECT * FROM fencing.drop_guards(p_table) LOOP
        EXECUTE format('CREATE TRIGGER fencing_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION fencing.guard(%L, %L)', rel, p_prefix, p_wait_ms);
    END LOOP;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '42809',
            MESSAGE = format('fencing.protect: %s is not a table', p_table);
    END IF;
END;
$fn$;

-- Removes the protection from `p_table` and its partitions or children.
CREATE OR REPLACE FUNCTION fencing.unprotect(p_table regclass)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT count(*) FROM fencing.drop_guards(p_table);
$fn$;

-- Partitions and inheritance children that appear after protect (CREATE TABLE ... PARTITION OF,
-- ATTACH PARTITION, INHERIT) are protected as they come, with their ancestor's prefix and wait.
CREATE OR REPLACE FUNCTION fencing.protect_new_children()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    cmd record;
    child record;
BEGIN
    FOR cmd IN SELECT * FROM pg_event_trigger_ddl_commands() WHERE classid = 'pg_class'::regclass LOOP
        FOR child IN
            WITH RECURSIVE down(oid) AS (
                SELECT cmd.objid
                UNION SELECT i.inhrelid FROM pg_inherits i JOIN down ON i.inhparent = down.oid
            ), up(child, anc) AS (
                SELECT d.oid, d.oid FROM down d
                UNION SELECT up.child, i.inhparent FROM up JOIN pg_inherits i ON i.inhrelid = up.anc
            )
            SELECT DISTINCT ON (up.child) up.child::regclass AS rel,
                   split_part(encode(t.tgargs, 'escape'), '\000', 1) AS prefix,
                   split_part(encode(t.tgargs, 'escape'), '\000', 2) AS wait_ms
            FROM up
            JOIN pg_trigger t ON t.tgrelid = up.anc AND t.tgname = 'fencing_guard'
            JOIN pg_class c ON c.oid = up.child AND c.relkind IN ('r', 'p', 'f')
            WHERE NOT EXISTS (SELECT 1 FROM pg_trigger t2 WHERE t2.tgrelid = up.child AND t2.tgname = 'fencing_guard')
        LOOP
            EXECUTE format('CREATE TRIGGER fencing_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s '
                           'FOR EACH STATEMENT EXECUTE FUNCTION fencing.guard(%L, %L)',
                           child.rel, child.prefix, child.wait_ms);
        END LOOP;
    END LOOP;
END;
$fn$;

-- Event triggers need a superuser: without one, the installation says so and goes on
-- (partitions attached later then need fencing.protect again).
DO $do$
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        DROP EVENT TRIGGER IF EXISTS fencing_protect_new_children;
        CREATE EVENT TRIGGER fencing_protect_new_children ON ddl_command_end
            WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'CREATE FOREIGN TABLE')
            EXECUTE FUNCTION fencing.protect_new_children();
    ELSE
        RAISE NOTICE 'fence-proxy: not a superuser: partitions created or attached after fencing.protect need fencing.protect again';
    END IF;
END
$do$;

-- Writes that leave through another connection: a foreign table's rows (postgres_fdw or any
-- other wrapper, a partition that is one included) go to another server, where no check of
-- this database runs, and the local transaction gets no transaction id, so "wrote nothing"
-- cannot be told from it. Every foreign table gets a row trigger that judges each write
-- before it leaves, in a session with any fencing setting: the general check, with the
-- settings in force at that row (a stale token fails, FN001, before the row is sent; a newer
-- one raises the mark), and then a transaction id, so that the check at the commit point
-- judges the transaction too. A row trigger also keeps postgres_fdw from sending an UPDATE or
-- DELETE as one remote statement, so every row is judged. Sessions without a token write
-- unchanged. (PostgreSQL allows no TRUNCATE trigger on a foreign table: the commit hook
-- judges a TRUNCATE of one.)
CREATE OR REPLACE FUNCTION fencing.judge_foreign()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF coalesce(current_setting('fencing.resource', true), '') <> ''
       OR coalesce(current_setting('fencing.token', true), '') <> '' THEN
        PERFORM fencing.check(TG_ARGV[0]::integer);
        PERFORM pg_current_xact_id();
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$fn$;

-- A TRUNCATE of a foreign table fires no trigger and takes no transaction id: only the commit
-- hook judges it (before it runs). Where the hook is not loaded, every postgres_fdw foreign
-- table that does not say otherwise is made not truncatable (the table option `truncatable`
-- 'false': postgres_fdw then refuses TRUNCATE of it), by the installation and by the event
-- trigger below as tables come. A table whose owner set `truncatable` itself keeps it.
CREATE OR REPLACE FUNCTION fencing.refuse_unjudged_truncate()
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    rel regclass;
    n integer := 0;
BEGIN
    IF current_setting('fence_hook.active', true) = 'on' THEN
        RETURN 0;
    END IF;
    FOR rel IN
        SELECT f.ftrelid::regclass FROM pg_foreign_table f
        JOIN pg_foreign_server s ON s.oid = f.ftserver
        JOIN pg_foreign_data_wrapper w ON w.oid = s.srvfdw
        WHERE w.fdwname = 'postgres_fdw'
          AND NOT EXISTS (SELECT 1 FROM unnest(coalesce(f.ftoptions, '{}')) o WHERE o LIKE 'truncatable=%')
    LOOP
        BEGIN
            EXECUTE format('ALTER FOREIGN TABLE %s OPTIONS (ADD truncatable %L)', rel, 'false');
            n := n + 1;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'fence-proxy: a TRUNCATE of foreign table % is not judged: % may not alter it', rel, current_user
                USING HINT = 'load fence_hook, or run SELECT fencing.refuse_unjudged_truncate() as its owner';
        END;
    END LOOP;
    RETURN n;
END;
$fn$;

SELECT fencing.refuse_unjudged_truncate();

-- Gives every foreign table of the database whose trigger is missing, disabled (or enabled for
-- replicas only), conditional or replaced the trigger above, with fence wait `p_wait_ms`;
-- returns how many it gave it to. One it may not create triggers on (it needs to own the
-- table, or be a superuser) is named in a WARNING and left unjudged. The event trigger below
-- runs it after every command that could have changed one, so that what the table's owner
-- undoes is done again at once.
CREATE OR REPLACE FUNCTION fencing.judge_foreign_tables(p_wait_ms integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    rel regclass;
    n integer := 0;
BEGIN
    FOR rel IN
        SELECT c.oid::regclass FROM pg_class c
        WHERE c.relkind = 'f'
          AND NOT EXISTS (
              SELECT 1 FROM pg_trigger t
              WHERE t.tgrelid = c.oid AND t.tgname = 'fencing_judge_rows'
                AND t.tgfoid = 'fencing.judge_foreign()'::regprocedure
                AND t.tgtype = 31  -- BEFORE, FOR EACH ROW, INSERT OR UPDATE OR DELETE
                AND t.tgqual IS NULL AND t.tgattr = ''::int2vector AND t.tgenabled IN ('O', 'A'))
    LOOP
        BEGIN
            -- Each command here runs this again (the event trigger), which finds it done or
            -- does it first: hence the looks before each step.
            IF EXISTS (SELECT 1 FROM pg_trigger t
                       WHERE t.tgrelid = rel AND t.tgname = 'fencing_judge_rows'
                         AND NOT (t.tgfoid = 'fencing.judge_foreign()'::regprocedure
                                  AND t.tgtype = 31 AND t.tgqual IS NULL AND t.tgattr = ''::int2vector)) THEN
                EXECUTE format('DROP TRIGGER fencing_judge_rows ON %s', rel);
            END IF;
            IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = rel AND t.tgname = 'fencing_judge_rows') THEN
                IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = rel AND t.tgname = 'fencing_judge_rows'
                           AND t.tgenabled NOT IN ('O', 'A')) THEN
                    EXECUTE format('ALTER FOREIGN TABLE %s ENABLE TRIGGER fencing_judge_rows', rel);
                END IF;
            ELSE
                EXECUTE format('CREATE TRIGGER fencing_judge_rows BEFORE INSERT OR UPDATE OR DELETE ON %s '
                               'FOR EACH ROW EXECUTE FUNCTION fencing.judge_foreign(%L)', rel, p_wait_ms);
            END IF;
            n := n + 1;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'fence-proxy: writes to foreign table % are not judged: % may not create triggers on it', rel, current_user
                USING HINT = 'run SELECT fencing.judge_foreign_tables() as its owner or a superuser';
        END;
    END LOOP;
    RETURN n;
END;
$fn$;

SELECT fencing.judge_foreign_tables();

-- Foreign tables that appear later (CREATE FOREIGN TABLE, IMPORT FOREIGN SCHEMA, a foreign
-- partition) are judged as they come, and a trigger their owner disables, drops, renames or
-- replaces is made again at the end of that command, where the event trigger is installed (a
-- superuser's installation; altering it needs a superuser).
CREATE OR REPLACE FUNCTION fencing.judge_new_foreign_tables()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM fencing.judge_foreign_tables();
    PERFORM fencing.refuse_unjudged_truncate();
END;
$fn$;

DO $do$
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        DROP EVENT TRIGGER IF EXISTS fencing_judge_new_foreign_tables;
        CREATE EVENT TRIGGER fencing_judge_new_foreign_tables ON ddl_command_end
            WHEN TAG IN ('CREATE FOREIGN TABLE', 'IMPORT FOREIGN SCHEMA', 'ALTER FOREIGN TABLE',
                         'ALTER TABLE', 'CREATE TRIGGER', 'ALTER TRIGGER', 'DROP TRIGGER')
            EXECUTE FUNCTION fencing.judge_new_foreign_tables();
    ELSE
        RAISE NOTICE 'fence-proxy: not a superuser: foreign tables created after the installation need SELECT fencing.judge_foreign_tables()';
    END IF;
END
$do$;


-- What only the commit hook can fence. dblink commits on the far side as each of its calls
-- runs, before any commit point: only the
-- commit hook, which judges each call before it is made, can fence it. Where the hook is not
-- loaded, a database with dblink cannot be fenced: the installation says so and stops, and
-- (with a superuser's installation) so does a later CREATE EXTENSION dblink, unless the
-- database says that it accepts unjudged dblink calls (ALTER DATABASE ... SET
-- fencing.allow_unjudged_dblink = on).
-- Whether this database itself (ALTER DATABASE ... SET, for every role) sets `p_name` to on:
-- a session's or a role's own setting is not the database's acceptance.
CREATE OR REPLACE FUNCTION fencing.database_accepts(p_name text)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT EXISTS (
        SELECT 1 FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
        WHERE d.datname = current_database() AND s.setrole = 0
          AND (p_name || '=on') = ANY (s.setconfig))
$fn$;

CREATE OR REPLACE FUNCTION fencing.refuse_unjudged()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    -- A prepared transaction keeps its locks after its session, and nothing can end it: one
    -- that holds a resource's fence lock (any role can prepare one) keeps every newer token
    -- waiting. The hook refuses to prepare such a transaction; without it, a server that
    -- allows prepared transactions cannot be fenced, unless the database accepts that.
    IF current_setting('max_prepared_transactions')::integer > 0
       AND current_setting('fence_hook.active', true) IS DISTINCT FROM 'on'
       AND NOT fencing.database_accepts('fencing.allow_prepared_transactions') THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = format('fence-proxy: the server allows prepared transactions (max_prepared_transactions = %s), which no newer token can end, and fence_hook is not loaded to refuse them a fence lock', current_setting('max_prepared_transactions')),
            HINT = 'load fence_hook (shared_preload_libraries), or set max_prepared_transactions = 0, or accept it for this database: ALTER DATABASE ... SET fencing.allow_prepared_transactions = on';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'dblink')
       AND current_setting('fence_hook.active', true) IS DISTINCT FROM 'on'
       AND NOT fencing.database_accepts('fencing.allow_unjudged_dblink') THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = format('fence-proxy: database %s has dblink, whose calls write on the far side before any commit point, and fence_hook is not loaded to judge them', quote_ident(current_database())),
            HINT = 'load fence_hook (shared_preload_libraries), or DROP EXTENSION dblink, or accept that dblink calls are not fenced: ALTER DATABASE ... SET fencing.allow_unjudged_dblink = on';
    END IF;
END;
$fn$;

SELECT fencing.refuse_unjudged();

CREATE OR REPLACE FUNCTION fencing.refuse_unjudged_dblink_event()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM fencing.refuse_unjudged();
END;
$fn$;

DO $do$
BEGIN
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        DROP EVENT TRIGGER IF EXISTS fencing_refuse_unjudged_dblink;
        CREATE EVENT TRIGGER fencing_refuse_unjudged_dblink ON ddl_command_end
            WHEN TAG IN ('CREATE EXTENSION', 'ALTER EXTENSION')
            EXECUTE FUNCTION fencing.refuse_unjudged_dblink_event();
    END IF;
END
$do$;

-- The protected tables, their prefixes and waits.
-- (Created when missing only: replacing a view takes it exclusively even when nothing changes,
-- and any role may hold it, reading it.)
DO $do$
BEGIN
    IF to_regclass('fencing.protected_tables') IS NULL THEN
        CREATE VIEW fencing.protected_tables AS
            SELECT t.tgrelid::regclass AS table_name,
                   split_part(encode(t.tgargs, 'escape'), '\000', 1) AS prefix,
                   split_part(encode(t.tgargs, 'escape'), '\000', 2)::integer AS wait_ms
            FROM pg_catalog.pg_trigger t
            WHERE t.tgname = 'fencing_guard' AND NOT t.tgisinternal
              AND t.tgfoid = 'fencing.guard()'::regprocedure;
    END IF;
END
$do$;

REVOKE ALL ON TABLE fencing.tokens FROM PUBLIC;
GRANT SELECT ON TABLE fencing.tokens TO PUBLIC;
GRANT USAGE ON SCHEMA fencing TO PUBLIC;
REVOKE ALL ON FUNCTION fencing.evict_older(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencing.proof(bigint, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencing.announce_key(integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencing.announce_proof(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencing.holders(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencing.take_for_change(text) FROM PUBLIC;
REVOKE ALL ON TABLE fencing.secret FROM PUBLIC;
REVOKE ALL ON FUNCTION fencing.advertise(bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencing.refuse_stale(text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencing.refuse_signature(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencing.token_of(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.signature_required(text) TO PUBLIC;
REVOKE ALL ON TABLE fencing.keys FROM PUBLIC;
REVOKE ALL ON TABLE fencing.signed_prefixes FROM PUBLIC;
GRANT SELECT ON TABLE fencing.signed_prefixes TO PUBLIC;
REVOKE ALL ON TABLE fencing.keys_version FROM PUBLIC;
GRANT SELECT ON TABLE fencing.keys_version TO PUBLIC;
REVOKE ALL ON FUNCTION fencing.keys_changed() FROM PUBLIC;
REVOKE ALL ON TABLE fencing.mark_changes FROM PUBLIC;
GRANT SELECT ON TABLE fencing.mark_changes TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.lock_key(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.share(text, integer) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.check(integer) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.check(integer, boolean) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.check_token(integer) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.held_cursor() TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.fire_deferred() TO PUBLIC;
REVOKE ALL ON FUNCTION fencing.guard() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.judge_foreign() TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.judge_foreign_tables(integer) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.protect(regclass, text, integer) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.unprotect(regclass) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencing.drop_guards(regclass) TO PUBLIC;
GRANT SELECT ON fencing.protected_tables TO PUBLIC;
