/*
 * fence_hook: PostgreSQL judges every commit by fence-proxy's fence check.
 *
 * Loaded with shared_preload_libraries, it registers a transaction callback in every backend.
 * At each top-level commit (and PREPARE TRANSACTION) of a transaction that has written
 * (a transaction id is assigned) in a session with any fencing setting, it runs the general
 * check, fencing.check_token(fence_hook.wait_ms): a stale token, half a declaration or a bad
 * signature raises, and the commit fails. The common case, a READ COMMITTED transaction whose
 * token is its resource's mark, is passed in C by the fast check (below), without PL/pgSQL,
 * and a pass it made is used again while the fence's tables are unchanged ("Remembered
 * passes", below). PostgreSQL calls it after the transaction's deferred
 * triggers have fired and its held cursors have run, so the check judges everything the
 * transaction did, including commits inside procedures and what a FunctionCall wrote.
 *
 * A transaction that wrote only through another connection has no transaction id, and a
 * write that leaves that way commits on the far side when it is made (dblink_exec) or before
 * this callback runs (postgres_fdw commits its remote transaction in a commit callback of its
 * own, registered later, so called earlier). So such writes are judged where they are made:
 * every call of a function of dblink's library, in a session with any fencing setting, first
 * runs the same check (a stale token fails before the call) and takes a transaction id, so
 * that the commit is judged too; so is every TRUNCATE of a foreign table (or of a table with
 * a foreign partition), which no trigger can see. Other writes to foreign tables are judged
 * by the row triggers the check's schema puts on them (fencing.judge_foreign), with or
 * without this library.
 *
 * It reports `fence_hook.active = on` (a read-only setting, GUC_REPORT) in the start-up of
 * every session. fence-proxy takes that report, which only the server can send and only a
 * loaded library can define, as its sign that PostgreSQL judges the commits, and then sends no
 * check of its own at a transaction's commit point (the checks before statements, which keep
 * a newer token from waiting behind an older one's row locks, it still sends).
 */
/* dladdr (the library's own file, fence_hook.library); PGXS defines it, a bare cc does not. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "postgres.h"

#include <dlfcn.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/transam.h"
#include "access/twophase.h"
#include "access/xlog.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "port/atomics.h"
#include "postmaster/autovacuum.h"
#include "storage/ipc.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

PG_MODULE_MAGIC;

void _PG_init(void);

/* The reported sign: always on once the library is loaded; nobody can set it. */
static bool fence_hook_active = true;
/* How long a raise waits for older-token transactions before ending them (the check's p_wait_ms). */
static int fence_hook_wait_ms = 1000;
/* This library's file, reported so that the schema can create fencing.hook_check from it. */
static char *fence_hook_library = NULL;
/* The check, prepared once per backend; the plan cache re-plans it when the schema changes. */
static SPIPlanPtr check_plan = NULL;
static needs_fmgr_hook_type prev_needs_fmgr_hook = NULL;
static fmgr_hook_type prev_fmgr_hook = NULL;
static ProcessUtility_hook_type prev_utility_hook = NULL;
static ExecutorStart_hook_type prev_executor_start_hook = NULL;
/* Inside judge_write: the check's own statements are not judged again. */
static bool judging_write = false;

static bool
is_set(const char *value)
{
	return value != NULL && value[0] != '\0';
}

static void
check_error_context(void *arg)
{
	errcontext("fence_hook: the fence check at this transaction's commit (fencing.resource = %s)",
			   (const char *) arg);
}

static void
write_error_context(void *arg)
{
	errcontext("fence_hook: the fence check before this transaction's first write (fencing.resource = %s)",
			   (const char *) arg);
}

static void
remote_error_context(void *arg)
{
	errcontext("fence_hook: the fence check before a call that writes through another connection (fencing.resource = %s)",
			   (const char *) arg);
}

/*
 * The fast check: the common case of the general check, in C. A READ COMMITTED transaction
 * whose token is its resource's mark passes after what fencing.check does for it, and nothing
 * more: the resource's fence lock taken shared (without waiting), then the mark read with a
 * snapshot taken after the lock, so that every raise committed before is seen (a raise holds
 * the lock exclusively until its commit is visible). A plain token passes only for
 * a resource that needs no signature (fencing.signed_prefixes); a signed one only when its
 * key verifies (present in fencing.keys, not retired) and it hashes to the signed_hash its
 * raise stored (a raise stores one only for a signature it verified, and verifies it again
 * after its wait for the lock; a change of the keys clears every hash). Everything else (no
 * row, another token, a signature to verify, another isolation level, the lock held by another session, a schema not as installed) is
 * left to the general check, in PL/pgSQL: the fast check never refuses and never raises.
 */

/* The seed of fencing.lock_key. */
#define FENCE_LOCK_SEED INT64CONST(1178946115)

/* The tag of resource `r`'s fence lock: the advisory lock on fencing.lock_key(r). */
static void
fence_lock_tag(const char *r, LOCKTAG *tag)
{
	int64		key = DatumGetInt64(DirectFunctionCall2Coll(hashtextextended, DEFAULT_COLLATION_OID,
															CStringGetTextDatum(r),
															Int64GetDatum(FENCE_LOCK_SEED)));

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (((uint64) key) >> 32), (uint32) key, 1);
}

/* Whether this transaction holds the fence lock `tag`, shared or exclusively. */
static bool
holds_fence_lock(const LOCKTAG *tag)
{
	return LockHeldByMe(tag, ShareLock) || LockHeldByMe(tag, ExclusiveLock);
}

/* Whether `r` is a valid resource name (fencing.check's rule): 1 to 256 of A-Z a-z 0-9 . _ : / @ -. */
static bool
valid_resource(const char *r)
{
	size_t		n = 0;

	for (; r[n] != '\0'; n++)
	{
		char		c = r[n];

		if (n >= 256 ||
			!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
			  c == '.' || c == '_' || c == ':' || c == '/' || c == '@' || c == '-'))
			return false;
	}
	return n > 0;
}

/*
 * The number of a token as fencing.token_of reads it: 1 to 19 digits, 1 ..= 2^63-1, alone
 * (plain) or followed by .KEY_ID.MAC (1 to 32 of A-Z a-z 0-9 _ -, then 64 lowercase hex
 * digits: signed). False when it is neither.
 */
static bool
parse_token(const char *text, int64 *value, bool *is_signed, char *key_id)
{
	const char *p = text;
	const char *id;
	uint64		v = 0;
	int			n;

	for (n = 0; *p >= '0' && *p <= '9'; p++, n++)
	{
		if (n == 19)
			return false;
		v = v * 10 + (uint64) (*p - '0');
	}
	if (n == 0 || v < 1 || v > (uint64) PG_INT64_MAX)
		return false;
	*value = (int64) v;
	*is_signed = *p != '\0';
	if (!*is_signed)
		return true;
	if (*p++ != '.')
		return false;
	id = p;
	for (n = 0; (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
		 *p == '_' || *p == '-'; p++, n++)
		;
	if (n < 1 || n > 32 || *p++ != '.')
		return false;
	memcpy(key_id, id, n);
	key_id[n] = '\0';
	for (n = 0; (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'); p++, n++)
		;
	return n == 64 && *p == '\0';
}

/* SHA-256 of `text` into `out`; false if it could not be computed. */
static bool
sha256_of(const char *text, uint8 *out)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);
	bool		ok;

	if (ctx == NULL)
		return false;
	ok = pg_cryptohash_init(ctx) == 0 &&
		pg_cryptohash_update(ctx, (const uint8 *) text, strlen(text)) == 0 &&
		pg_cryptohash_final(ctx, out, PG_SHA256_DIGEST_LENGTH) == 0;
	pg_cryptohash_free(ctx);
	return ok;
}

/* Table `name` of schema fencing, opened AccessShareLock (kept to the transaction's end, as a query keeps it), or NULL when it is not an ordinary table. */
static Relation
open_fencing_table(const char *name)
{
	Oid			nsp = get_namespace_oid("fencing", true);
	Oid			relid;
	Relation	rel;

	if (!OidIsValid(nsp))
		return NULL;
	relid = get_relname_relid(name, nsp);
	if (!OidIsValid(relid))
		return NULL;
	rel = table_open(relid, AccessShareLock);
	if (rel->rd_rel->relkind != RELKIND_RELATION || rel->rd_rel->relrowsecurity)
	{
		table_close(rel, NoLock);
		return NULL;
	}
	return rel;
}

/* The number of column `name` of `rel` when it has type `type`, else InvalidAttrNumber. */
static AttrNumber
column(Relation rel, const char *name, Oid type)
{
	AttrNumber	att = get_attnum(RelationGetRelid(rel), name);

	if (att <= 0 || TupleDescAttr(RelationGetDescr(rel), att - 1)->atttypid != type)
		return InvalidAttrNumber;
	return att;
}

/*
 * The version of the signing configuration (fencing.keys_version) in `snapshot`; false when
 * it cannot be read (no such table, no row).
 */
static bool
keys_version(Snapshot snapshot, int64 *version)
{
	Relation	rel = open_fencing_table("keys_version");
	AttrNumber	att;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		found = false;

	if (rel == NULL)
		return false;
	att = column(rel, "v", INT8OID);
	if (att != InvalidAttrNumber)
	{
		scan = systable_beginscan(rel, InvalidOid, false, snapshot, 0, NULL);
		tuple = systable_getnext(scan);
		if (HeapTupleIsValid(tuple))
		{
			bool		isnull;
			Datum		d = heap_getattr(tuple, att, RelationGetDescr(rel), &isnull);

			found = !isnull;
			if (found)
				*version = DatumGetInt64(d);
		}
		systable_endscan(scan);
	}
	table_close(rel, NoLock);
	return found;
}

/*
 * A REPEATABLE READ or SERIALIZABLE transaction judges by the keys and signed prefixes of its
 * snapshot: when they have changed since (the version in its snapshot is not the latest
 * committed one), it is refused with 40001, to be retried under the keys now in force.
 */
static void
refuse_keys_changed_since_snapshot(void)
{
	int64		then, now;
	bool		have_then, have_now;
	Snapshot	snapshot;

	if (!IsolationUsesXactSnapshot())
		return;
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	have_then = keys_version(snapshot, &then);
	UnregisterSnapshot(snapshot);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	have_now = keys_version(snapshot, &now);
	UnregisterSnapshot(snapshot);
	if (have_then && have_now && then != now)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("fence_hook: the fence's signing keys or signed prefixes changed since this transaction's snapshot"),
				 errdetail("The check would judge the token by keys that are no longer the fence's (version %lld in the snapshot, %lld now).",
						   (long long) then, (long long) now),
				 errhint("Retry the transaction.")));
}

/*
 * Whether key `key_id` is a key of this fence that verifies (fencing.keys: present, not
 * retired, with its pads), read now. The hash a raise stored was of a text verified under the
 * keys of its time, and a change of keys clears the hashes; this is a second guard, against
 * keys changed by hand without that.
 */
static bool
key_verifies(const char *key_id, Snapshot snapshot)
{
	Relation	rel = open_fencing_table("keys");
	AttrNumber	a_id, a_retired, a_ipad;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		verifies = false;

	if (rel == NULL)
		return false;
	a_id = column(rel, "key_id", TEXTOID);
	a_retired = column(rel, "retired", BOOLOID);
	a_ipad = column(rel, "ipad", BYTEAOID);
	if (a_id == InvalidAttrNumber || a_retired == InvalidAttrNumber || a_ipad == InvalidAttrNumber)
	{
		table_close(rel, NoLock);
		return false;
	}
	ScanKeyEntryInitialize(&key, 0, a_id, BTEqualStrategyNumber, InvalidOid,
						   TupleDescAttr(RelationGetDescr(rel), a_id - 1)->attcollation,
						   F_TEXTEQ, CStringGetTextDatum(key_id));
	scan = systable_beginscan(rel, InvalidOid, false, snapshot, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		retired_null, ipad_null;
		Datum		retired = heap_getattr(tuple, a_retired, RelationGetDescr(rel), &retired_null);

		(void) heap_getattr(tuple, a_ipad, RelationGetDescr(rel), &ipad_null);
		verifies = !retired_null && !DatumGetBool(retired) && !ipad_null;
	}
	systable_endscan(scan);
	table_close(rel, NoLock);
	return verifies;
}

typedef enum
{
	NEEDS_NONE,
	NEEDS_SIGNATURE,
	NEEDS_UNKNOWN
} SignatureNeed;

/* Whether resource `r` needs a signed token (fencing.signature_required), read now. */
static SignatureNeed
signature_need(const char *r, Snapshot snapshot)
{
	Relation	rel = open_fencing_table("signed_prefixes");
	AttrNumber	att;
	SysScanDesc scan;
	HeapTuple	tuple;
	SignatureNeed need = NEEDS_NONE;

	if (rel == NULL)
		return NEEDS_UNKNOWN;
	att = column(rel, "prefix", TEXTOID);
	if (att == InvalidAttrNumber)
	{
		table_close(rel, NoLock);
		return NEEDS_UNKNOWN;
	}
	scan = systable_beginscan(rel, InvalidOid, false, snapshot, 0, NULL);
	while (need == NEEDS_NONE && HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, att, RelationGetDescr(rel), &isnull);
		text	   *prefix;

		if (isnull)
			continue;
		prefix = DatumGetTextPP(d);
		if (strlen(r) >= VARSIZE_ANY_EXHDR(prefix) &&
			memcmp(r, VARDATA_ANY(prefix), VARSIZE_ANY_EXHDR(prefix)) == 0)
			need = NEEDS_SIGNATURE;
	}
	systable_endscan(scan);
	table_close(rel, NoLock);
	return need;
}

/*
 * Whether resource `r`'s mark, read in `snapshot`, is `t` (and, for a signed token, its
 * signed_hash is `hash`, verified under the keys of version `version`). False also when the
 * table is not as the schema makes it.
 */
static bool
mark_is(const char *r, int64 t, const uint8 *hash, int64 version, Snapshot snapshot)
{
	Relation	rel = open_fencing_table("tokens");
	AttrNumber	a_resource, a_token, a_hash, a_version;
	Oid			pk;
	HeapTuple	index;
	bool		by_index;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		is = false;

	if (rel == NULL)
		return false;
	a_resource = column(rel, "resource", TEXTOID);
	a_token = column(rel, "token", INT8OID);
	a_hash = column(rel, "signed_hash", BYTEAOID);
	a_version = column(rel, "keys_version", INT8OID);
	if (a_resource == InvalidAttrNumber || a_token == InvalidAttrNumber || a_hash == InvalidAttrNumber ||
		a_version == InvalidAttrNumber)
	{
		table_close(rel, NoLock);
		return false;
	}
	/* The primary key on resource alone, as installed; a table without it is read whole. */
	pk = RelationGetPrimaryKeyIndex(rel);
	by_index = false;
	if (OidIsValid(pk) && HeapTupleIsValid(index = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(pk))))
	{
		Form_pg_index form = (Form_pg_index) GETSTRUCT(index);

		by_index = form->indnatts == 1 && form->indkey.values[0] == a_resource && form->indisvalid;
		ReleaseSysCache(index);
	}
	/* Compared in the column's collation: the index is ordered by it. */
	ScanKeyEntryInitialize(&key, 0, a_resource, BTEqualStrategyNumber, InvalidOid,
						   TupleDescAttr(RelationGetDescr(rel), a_resource - 1)->attcollation,
						   F_TEXTEQ, CStringGetTextDatum(r));
	scan = systable_beginscan(rel, by_index ? pk : InvalidOid, by_index, snapshot, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, a_token, RelationGetDescr(rel), &isnull);

		is = !isnull && DatumGetInt64(d) == t;
		if (is && hash != NULL)
		{
			bytea	   *stored;

			d = heap_getattr(tuple, a_hash, RelationGetDescr(rel), &isnull);
			stored = isnull ? NULL : DatumGetByteaPP(d);
			is = stored != NULL && VARSIZE_ANY_EXHDR(stored) == PG_SHA256_DIGEST_LENGTH &&
				memcmp(VARDATA_ANY(stored), hash, PG_SHA256_DIGEST_LENGTH) == 0;
			/* Verified under the keys still in force. */
			d = heap_getattr(tuple, a_version, RelationGetDescr(rel), &isnull);
			is = is && !isnull && DatumGetInt64(d) == version;
		}
	}
	systable_endscan(scan);
	table_close(rel, NoLock);
	return is;
}

/*
 * Remembered passes. A backend remembers the last few (resource, token) pairs its fast check
 * passed, each with the fence epoch read before the snapshot that passed it. The epoch is a
 * counter in shared memory that every transaction which changed the tables the fast check
 * reads (fencing.tokens, signed_prefixes, keys, keys_version) raises when it ends, committed,
 * rolled back or prepared. Such a transaction is known by
 * fencing.hook_changed, fired ALWAYS (so also under session_replication_role = replica and by
 * logical replication's apply, which fires row triggers only) by a row trigger for INSERT,
 * UPDATE and DELETE (which also fires for rows written through an inheritance or partition
 * parent, as a statement trigger would not) and a statement trigger for TRUNCATE. A pass is
 * used again, instead of reading the tables, only while the epoch is still the one it was read
 * at: no change to those tables has committed since its snapshot. A change that commits after
 * the snapshot raises the epoch after it is visible; a raise does so before it gives back the
 * fence lock, which the fast check holds before it looks. Every check still takes the fence
 * lock, and takes in the invalidations sent so far (DDL on the tables that committed since)
 * before it uses a pass; only the reads are saved.
 *
 * Nothing is remembered, and nothing used, when the tables are not so guarded (each must have
 * the triggers, enabled ALWAYS, without a WHEN or column list, calling this library's
 * function), during recovery (a standby's tables change by WAL replay, which fires nothing),
 * or in a transaction that changed those tables itself (a rolled-back savepoint undoes a change
 * without a trigger). Nothing is remembered while any prepared transaction exists: it ends
 * (COMMIT PREPARED, or logical replication's apply of one) without its session's callbacks,
 * and it may have been prepared before the library was loaded; the passes remembered before a
 * transaction that changed the tables was prepared are forgotten at its PREPARE. Whatever
 * could change the tables or their triggers
 * without a row change (DDL on them, a trigger disabled or dropped, the function replaced, the
 * schema renamed) sends an invalidation, on which everything remembered is forgotten. The
 * tables stay the truth: the memory is a backend's own, and a crash restart starts afresh.
 */
#define REMEMBERED 8
#define TOKEN_TEXT_MAX 128		/* 19 digits, '.', a key id of 32, '.', 64 hex digits */

typedef struct Remembered
{
	uint64		epoch;			/* 0: empty */
	char		resource[257];
	char		token[TOKEN_TEXT_MAX];
} Remembered;

typedef struct FenceShared
{
	pg_atomic_uint64 epoch;
} FenceShared;

/* The fence epoch, in shared memory: NULL when the library was not preloaded. */
static FenceShared *fence_shared = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static Remembered remembered[REMEMBERED];
static int	remembered_next = 0;
/* The tables read, to forget on their invalidation; InvalidOid when unknown. */
#define GUARDED_TABLES 4
static const char *const guarded_names[GUARDED_TABLES] = {"tokens", "signed_prefixes", "keys", "keys_version"};
static Oid	guarded_tables[GUARDED_TABLES];
/* Whether the tables are guarded: 0 not known yet, 1 guarded, -1 not. */
static int	guard_state = 0;
/* fencing.hook_changed's OID, once seen to be this library's function. */
static Oid	trigger_fn = InvalidOid;
/* This transaction changed a guarded table (fencing.hook_changed fired). */
static bool wrote_fence_tables = false;

static void
forget_all(void)
{
	int			i;

	for (i = 0; i < REMEMBERED; i++)
		remembered[i].epoch = 0;
	guard_state = 0;
}

static void
forget_on_relcache(Datum arg, Oid relid)
{
	int			i;

	if (!OidIsValid(relid))
	{
		forget_all();
		return;
	}
	for (i = 0; i < GUARDED_TABLES; i++)
		if (guarded_tables[i] == relid)
			forget_all();
}

static void
forget_on_syscache(Datum arg, int cacheid, uint32 hashvalue)
{
	forget_all();
	trigger_fn = InvalidOid;
}


/* The epoch now, read after everything before it (the fence lock, or the caller's last read). */
static uint64
current_epoch(void)
{
	pg_memory_barrier();
	return pg_atomic_read_u64(&fence_shared->epoch);
}

/* Whether passes may be remembered and used in this transaction, now. */
static bool
may_remember(void)
{
	return fence_shared != NULL && !wrote_fence_tables && !RecoveryInProgress();
}

/* Whether `fn` is this library's fence_hook_changed. */
static bool
is_trigger_fn(Oid fn)
{
	HeapTuple	tuple;
	bool		is = false;

	if (OidIsValid(trigger_fn) && fn == trigger_fn)
		return true;
	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	if (!HeapTupleIsValid(tuple))
		return false;
	if (((Form_pg_proc) GETSTRUCT(tuple))->prolang == ClanguageId && fence_hook_library != NULL &&
		fence_hook_library[0] != '\0')
	{
		bool		bin_null;
		bool		src_null;
		Datum		bin = SysCacheGetAttr(PROCOID, tuple, Anum_pg_proc_probin, &bin_null);
		Datum		src = SysCacheGetAttr(PROCOID, tuple, Anum_pg_proc_prosrc, &src_null);

		if (!bin_null && !src_null)
		{
			char	   *b = TextDatumGetCString(bin);
			char	   *c = TextDatumGetCString(src);

			is = strcmp(b, fence_hook_library) == 0 && strcmp(c, "fence_hook_changed") == 0;
			pfree(b);
			pfree(c);
		}
	}
	ReleaseSysCache(tuple);
	if (is)
		trigger_fn = fn;
	return is;
}

/* Whether every change to `rel`'s rows fires this library's triggers (see above). */
static bool
table_guarded(Relation rel)
{
	TriggerDesc *desc = rel->trigdesc;
	bool		insert = false,
				update = false,
				delete = false,
				truncate = false;
	int			i;

	if (desc == NULL)
		return false;
	for (i = 0; i < desc->numtriggers; i++)
	{
		Trigger    *t = &desc->triggers[i];

		if (t->tgenabled != TRIGGER_FIRES_ALWAYS || t->tgqual != NULL || t->tgnattr != 0 ||
			!is_trigger_fn(t->tgfoid))
			continue;
		/* Row triggers: logical replication's apply fires no statement trigger. */
		if (TRIGGER_FOR_ROW(t->tgtype))
		{
			insert |= TRIGGER_FOR_INSERT(t->tgtype) != 0;
			update |= TRIGGER_FOR_UPDATE(t->tgtype) != 0;
			delete |= TRIGGER_FOR_DELETE(t->tgtype) != 0;
		}
		truncate |= TRIGGER_FOR_TRUNCATE(t->tgtype) != 0;
	}
	return insert && update && delete && truncate;
}

/* Whether all the tables the fast check reads are guarded; the answer is kept until an invalidation. */
static bool
tables_guarded(void)
{
	int			i;
	bool		guarded = true;

	if (guard_state != 0)
		return guard_state > 0;
	for (i = 0; i < GUARDED_TABLES; i++)
	{
		Relation	rel = open_fencing_table(guarded_names[i]);

		guarded_tables[i] = InvalidOid;
		if (rel == NULL)
		{
			guarded = false;
			continue;
		}
		guarded_tables[i] = RelationGetRelid(rel);
		guarded = guarded && table_guarded(rel);
		table_close(rel, NoLock);
	}
	guard_state = guarded ? 1 : -1;
	return guarded;
}

/*
 * Whether no prepared transaction exists in the cluster (see above): read through SPI, and
 * only when passes are about to be remembered and the server allows prepared transactions.
 */
static bool
no_prepared_transaction(void)
{
	bool		none;

	if (max_prepared_xacts == 0)
		return true;
	if (SPI_connect() != SPI_OK_CONNECT)
		return false;
	PushActiveSnapshot(GetTransactionSnapshot());
	none = SPI_execute("SELECT FROM pg_catalog.pg_prepared_xact() LIMIT 1", true, 1) == SPI_OK_SELECT &&
		SPI_processed == 0;
	PopActiveSnapshot();
	SPI_finish();
	return none;
}

/* Whether (resource, token) passed at epoch `epoch`. */
static bool
remembered_at(const char *resource, const char *token, uint64 epoch)
{
	int			i;

	for (i = 0; i < REMEMBERED; i++)
		if (remembered[i].epoch == epoch && strcmp(remembered[i].resource, resource) == 0 &&
			strcmp(remembered[i].token, token) == 0)
			return true;
	return false;
}

static void
remember(const char *resource, const char *token, uint64 epoch)
{
	Remembered *r;
	int			i;

	if (strlen(resource) >= sizeof(r->resource) || strlen(token) >= sizeof(r->token))
		return;
	for (i = 0; i < REMEMBERED; i++)
		if (remembered[i].epoch != 0 && strcmp(remembered[i].resource, resource) == 0 &&
			strcmp(remembered[i].token, token) == 0)
		{
			remembered[i].epoch = epoch;
			return;
		}
	r = &remembered[remembered_next];
	remembered_next = (remembered_next + 1) % REMEMBERED;
	strcpy(r->resource, resource);
	strcpy(r->token, token);
	r->epoch = epoch;
}

/*
 * Whether the session's token `token` for resource `resource` passes the fast check (see
 * above). On true the transaction holds the resource's fence lock shared, as the general
 * check leaves it.
 */
static bool
fast_check(const char *resource, const char *token, int64 *accepted)
{
	int64		t;
	bool		is_signed;
	char		key_id[33];
	int64		version = 0;
	uint8		hash[PG_SHA256_DIGEST_LENGTH];
	LOCKTAG		tag;
	Snapshot	snapshot;
	bool		took = false;
	bool		remembering;
	uint64		epoch = 0;
	bool		is;

	if (XactIsoLevel != XACT_READ_COMMITTED || !valid_resource(resource) ||
		!parse_token(token, &t, &is_signed, key_id))
		return false;
	fence_lock_tag(resource, &tag);
	if (!holds_fence_lock(&tag))
	{
		/*
		 * Not yet holding the lock: taken here without waiting (the general check waits, and
		 * ends a session that holds it by hand), and given back when the token is not the
		 * mark: the general check may then need it exclusively, and two transactions that
		 * held it shared would deadlock on that.
		 */
		if (LockAcquire(&tag, ShareLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
			return false;
		took = true;
	}

	/*
	 * A pass remembered at the epoch now, read after the lock: no change since (see above).
	 * The invalidations of DDL committed since are taken in first (a read would take them
	 * when it locks a table; a transaction that holds the tables already takes them no more).
	 */
	remembering = may_remember();
	if (remembering)
	{
		AcceptInvalidationMessages();
		epoch = current_epoch();
		if (remembered_at(resource, token, epoch))
		{
			elog(DEBUG1, "fence_hook: token %lld is the mark of resource %s (the fast check), as read before",
				 (long long) t, resource);
			*accepted = t;
			return true;
		}
	}

	/*
	 * Everything read in one snapshot, taken after the lock (and after the epoch): a raise
	 * committed before it is seen, and the keys, the prefixes and the mark are of one moment
	 * (a change of keys that committed between two reads would otherwise be missed). What
	 * this transaction's last statement wrote is seen too, as SPI's statements see it.
	 */
	is = !is_signed || sha256_of(token, hash);
	if (is)
	{
		CommandCounterIncrement();
		snapshot = RegisterSnapshot(GetTransactionSnapshot());
		if (is_signed)
			is = key_verifies(key_id, snapshot) && keys_version(snapshot, &version) &&
				mark_is(resource, t, hash, version, snapshot);
		else
			is = signature_need(resource, snapshot) == NEEDS_NONE &&
				mark_is(resource, t, NULL, 0, snapshot);
		UnregisterSnapshot(snapshot);
	}
	if (!is)
	{
		if (took)
			LockRelease(&tag, ShareLock, false);
		return false;
	}
	if (remembering && tables_guarded() && no_prepared_transaction())
		remember(resource, token, epoch);
	elog(DEBUG1, "fence_hook: token %lld is the mark of resource %s (the fast check)",
		 (long long) t, resource);
	*accepted = t;
	return true;
}

/*
 * The general check, fencing.check_token(wait_ms), through SPI: it raises when the token is
 * stale, half declared or forged, and raises the mark for a newer one. True, with the token it
 * accepted, when the session has one.
 */
static bool
general_check(int wait_ms, int64 *accepted)
{
	Datum		args[1];
	Datum		value;
	bool		isnull;
	int			rc;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "fence_hook: SPI_connect failed");
	if (check_plan == NULL)
	{
		Oid			types[1] = {INT4OID};
		/* Schema-qualified: parsed under the session's search_path. */
		SPIPlanPtr	plan = SPI_prepare("SELECT fencing.check_token($1::pg_catalog.int4)", 1, types);

		if (plan == NULL)
			elog(ERROR, "fence_hook: preparing the fence check failed: %s",
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "fence_hook: keeping the fence check's plan failed");
		check_plan = plan;
	}
	args[0] = Int32GetDatum(wait_ms);
	/* No portal is left at a commit to lend a snapshot; each statement of the check takes its own. */
	PushActiveSnapshot(GetTransactionSnapshot());
	rc = SPI_execute_plan(check_plan, args, NULL, false, 0);
	PopActiveSnapshot();
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "fence_hook: the fence check answered %s", SPI_result_code_string(rc));
	value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		*accepted = DatumGetInt64(value);
	SPI_finish();
	return !isnull;
}

/*
 * Runs the check with the session's settings, if it has any: the fast check, else the general
 * one, which raises when the token is stale, half declared or forged. `where` names the moment
 * in errors.
 */
static void
run_check(void (*where) (void *))
{
	const char *resource;
	const char *token;
	int64		accepted;
	ErrorContextCallback context;

	/*
	 * Autovacuum carries no client's token: fencing settings in postgresql.conf would
	 * otherwise fail its ANALYZE commits (statistics) forever under a stale token.
	 */
	if (IsAutoVacuumWorkerProcess())
		return;
	resource = GetConfigOption("fencing.resource", true, false);
	token = GetConfigOption("fencing.token", true, false);
	if (!is_set(resource) && !is_set(token))
		return;

	if (is_set(resource) && is_set(token) && fast_check(resource, token, &accepted))
		return;
	refuse_keys_changed_since_snapshot();

	context.callback = where;
	context.arg = (void *) (is_set(resource) ? resource : "''");
	context.previous = error_context_stack;
	error_context_stack = &context;
	(void) general_check(fence_hook_wait_ms, &accepted);
	error_context_stack = context.previous;
}

PG_FUNCTION_INFO_V1(fence_hook_check);

/*
 * fencing.hook_check(p_wait_ms): fence-proxy's check before a transaction's statements where
 * PostgreSQL judges the commits (the hook is loaded): the fast check, else the general check
 * with fence wait `p_wait_ms` (1000 when NULL). One statement where the relay sends two (the
 * fence lock, then the mark read under it). Returns the token accepted; NULL when the session
 * has no token. The schema creates it where this library is loaded (fence_hook.library).
 */
Datum
fence_hook_check(PG_FUNCTION_ARGS)
{
	const char *resource = GetConfigOption("fencing.resource", true, false);
	const char *token = GetConfigOption("fencing.token", true, false);
	int			wait_ms = PG_ARGISNULL(0) ? 1000 : PG_GETARG_INT32(0);
	int64		accepted;

	if (fence_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("fence_hook must be loaded with shared_preload_libraries"),
				 errhint("add fence_hook to shared_preload_libraries in postgresql.conf and restart PostgreSQL")));
	if (!is_set(resource) && !is_set(token))
		PG_RETURN_NULL();
	if (is_set(resource) && is_set(token) && fast_check(resource, token, &accepted))
		PG_RETURN_INT64(accepted);
	refuse_keys_changed_since_snapshot();
	if (general_check(wait_ms, &accepted))
		PG_RETURN_INT64(accepted);
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(fence_hook_changed);

/* Whether `rel` is one of the tables the fast check reads (schema fencing, by name). */
static bool
is_guarded_table(Relation rel)
{
	int			i;

	if (rel->rd_rel->relnamespace != get_namespace_oid("fencing", true))
		return false;
	for (i = 0; i < GUARDED_TABLES; i++)
		if (strcmp(NameStr(rel->rd_rel->relname), guarded_names[i]) == 0)
			return true;
	return false;
}

/*
 * fencing.hook_changed(): the triggers on the tables the fast check reads (see "Remembered
 * passes"): marks the transaction, whose end raises the fence epoch. Does nothing on any other
 * table, nor where the library is not preloaded (it was taken out of shared_preload_libraries
 * after the schema was installed): nothing is remembered there.
 */
Datum
fence_hook_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigger = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("fencing.hook_changed() may only be called as a trigger")));
	if (fence_shared != NULL && is_guarded_table(trigger->tg_relation))
		wrote_fence_tables = true;
	if (TRIGGER_FIRED_FOR_ROW(trigger->tg_event))
		return PointerGetDatum(TRIGGER_FIRED_BY_UPDATE(trigger->tg_event) ? trigger->tg_newtuple : trigger->tg_trigtuple);
	return PointerGetDatum(NULL);
}

static void
judge_commit(void)
{
	/*
	 * Nothing written, nothing to fence (as the relay's own check at a commit point): a write
	 * through another connection took a transaction id when it was judged (fence_fmgr, and
	 * the foreign tables' triggers).
	 */
	if (!TransactionIdIsValid(GetTopTransactionIdIfAny()))
		return;
	run_check(check_error_context);
}

/*
 * A prepared transaction keeps its locks after its session is gone, and no session can end
 * it: one that held a resource's fence lock (or an announcement) would keep every newer token
 * waiting until an administrator rolled it back. In a database with the fence check, a
 * transaction that holds any advisory lock is not prepared.
 */
static void
refuse_prepare_with_fence_locks(void)
{
	int			rc;
	bool		isnull;
	bool		holds;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "fence_hook: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	rc = SPI_execute("SELECT pg_catalog.to_regnamespace('fencing') IS NOT NULL AND EXISTS ("
					 "SELECT FROM pg_catalog.pg_locks l WHERE l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() "
					 "AND l.locktype OPERATOR(pg_catalog.=) 'advisory')",
					 true, 1);
	PopActiveSnapshot();
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "fence_hook: looking for advisory locks answered %s", SPI_result_code_string(rc));
	holds = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	if (!isnull && holds)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("fence_hook: a transaction that holds advisory locks cannot be prepared in a database with the fence check"),
				 errdetail("A prepared transaction keeps its locks after its session ends and no session can end it: holding a resource's fence lock, it would keep every newer token waiting."),
				 errhint("Release the advisory locks before PREPARE TRANSACTION, or commit the transaction instead.")));
}

static void
fence_hook_xact(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_PRE_PREPARE)
		judge_commit();
	/* After the check, which takes the fence lock: a fenced transaction is never prepared. */
	if (event == XACT_EVENT_PRE_PREPARE)
		refuse_prepare_with_fence_locks();
	/* A change to the tables the fast check reads, now visible, undone or prepared. */
	if ((event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_ABORT ||
		 event == XACT_EVENT_PARALLEL_ABORT || event == XACT_EVENT_PREPARE) && wrote_fence_tables)
	{
		pg_atomic_fetch_add_u64(&fence_shared->epoch, 1);
		wrote_fence_tables = false;
	}
}

/*
 * Whether function `fn_oid` is one that writes through a connection of its own: a C function
 * of dblink's library. Built-in functions are never (checked without a catalog lookup).
 */
static bool
reaches_out(Oid fn_oid)
{
	HeapTuple	tuple;
	bool		result = false;

	if (fn_oid < FirstNormalObjectId)
		return false;
	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn_oid));
	if (!HeapTupleIsValid(tuple))
		return false;
	if (((Form_pg_proc) GETSTRUCT(tuple))->prolang == ClanguageId)
	{
		bool		isnull;
		Datum		bin = SysCacheGetAttr(PROCOID, tuple, Anum_pg_proc_probin, &isnull);

		if (!isnull)
		{
			char	   *path = TextDatumGetCString(bin);
			const char *base = strrchr(path, '/');

			base = base ? base + 1 : path;
			result = strncmp(base, "dblink", 6) == 0;
			pfree(path);
		}
	}
	ReleaseSysCache(tuple);
	return result;
}

static bool
fence_needs_fmgr(Oid fn_oid)
{
	if (prev_needs_fmgr_hook && (*prev_needs_fmgr_hook) (fn_oid))
		return true;
	return reaches_out(fn_oid);
}

/*
 * Judges a transaction's first write on its resource, before it takes a row lock: the check
 * takes the resource's fence lock (shared for the mark, exclusively for a newer token, which
 * raises it and ends older transactions after the fence wait) or refuses a stale token. A
 * transaction that writes holds the fence lock from then on, however its client sends its
 * statements (a COPY whose data never comes, an extended-protocol batch never synced, a
 * result it stops reading): paused there with its row locks, it is ended by a newer token's
 * raise instead of keeping the newer holder waiting behind those locks. Liveness only: the
 * check at the commit judges what the transaction did.
 */
static void
judge_write(void)
{
	const char *resource;
	const char *token;
	LOCKTAG		tag;

	if (judging_write || IsAutoVacuumWorkerProcess())
		return;
	resource = GetConfigOption("fencing.resource", true, false);
	token = GetConfigOption("fencing.token", true, false);
	/* Half a declaration, or a name the check refuses: the commit's check says so. */
	if (!is_set(resource) || !is_set(token) || !valid_resource(resource))
		return;
	fence_lock_tag(resource, &tag);
	if (holds_fence_lock(&tag))
		return;
	judging_write = true;
	PG_TRY();
	{
		run_check(write_error_context);
	}
	PG_FINALLY();
	{
		judging_write = false;
	}
	PG_END_TRY();
}

/* Whether the statement about to run writes or locks rows. */
static bool
writes_rows(QueryDesc *queryDesc)
{
	PlannedStmt *stmt = queryDesc->plannedstmt;

	return stmt->commandType != CMD_SELECT || stmt->hasModifyingCTE || stmt->rowMarks != NIL;
}

static void
fence_executor_start(QueryDesc *queryDesc, int eflags)
{
	if ((eflags & EXEC_FLAG_EXPLAIN_ONLY) == 0 && writes_rows(queryDesc))
		judge_write();
	if (prev_executor_start_hook)
		(*prev_executor_start_hook) (queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

/* Judges a write that leaves through another connection, before it leaves. */
static void
judge_remote(void)
{
	run_check(remote_error_context);
	/* A transaction id: the commit is judged too, with the settings it ends with. */
	if (is_set(GetConfigOption("fencing.resource", true, false)) ||
		is_set(GetConfigOption("fencing.token", true, false)))
		(void) GetTopTransactionId();
}

static void
fence_fmgr(FmgrHookEventType event, FmgrInfo *flinfo, Datum *private)
{
	if (prev_fmgr_hook)
		(*prev_fmgr_hook) (event, flinfo, private);
	if (event == FHET_START && reaches_out(flinfo->fn_oid))
		judge_remote();
}

/* Whether TRUNCATE `stmt` reaches a foreign table (named, or a partition or child of one named). */
static bool
truncates_foreign(TruncateStmt *stmt)
{
	ListCell   *cell;

	foreach(cell, stmt->relations)
	{
		Oid			relid = RangeVarGetRelid((RangeVar *) lfirst(cell), NoLock, true);
		ListCell   *member;

		if (!OidIsValid(relid))
			continue;
		foreach(member, find_all_inheritors(relid, NoLock, NULL))
		{
			if (get_rel_relkind(lfirst_oid(member)) == RELKIND_FOREIGN_TABLE)
				return true;
		}
	}
	return false;
}

/*
 * Whether a utility statement writes rows or takes a table lock that a writer would wait
 * behind: judged before it runs, as a write is (an outside breaker froze a resource with a
 * LOCK TABLE, and with a REFRESH MATERIALIZED VIEW, taken without the fence lock).
 */
static bool
locks_or_writes(Node *parsetree)
{
	switch (nodeTag(parsetree))
	{
		case T_CopyStmt:
			return ((CopyStmt *) parsetree)->is_from;
		case T_TruncateStmt:
		case T_LockStmt:
		case T_RefreshMatViewStmt:
		case T_AlterTableStmt:
		case T_IndexStmt:
		case T_ClusterStmt:
		case T_ReindexStmt:
		case T_VacuumStmt:
		case T_DropStmt:
		case T_RenameStmt:
		case T_AlterObjectSchemaStmt:
		case T_CreateTrigStmt:
		case T_RuleStmt:
			return true;
		default:
			return false;
	}
}

static void
fence_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
			  ProcessUtilityContext context, ParamListInfo params,
			  QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;

	if (IsA(parsetree, TruncateStmt) && truncates_foreign((TruncateStmt *) parsetree))
		judge_remote();
	else if (locks_or_writes(parsetree))
		judge_write();
	if (prev_utility_hook)
		(*prev_utility_hook) (pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
}

static void
fence_shmem_request(void)
{
	if (prev_shmem_request_hook)
		(*prev_shmem_request_hook) ();
	RequestAddinShmemSpace(MAXALIGN(sizeof(FenceShared)));
}

static void
fence_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		(*prev_shmem_startup_hook) ();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	fence_shared = ShmemInitStruct("fence_hook", sizeof(FenceShared), &found);
	if (!found)
		pg_atomic_init_u64(&fence_shared->epoch, 1);
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Loaded any other way than with shared_preload_libraries (a LOAD, or a call of one of its
 * functions after it was taken out of that list), the library installs nothing: its trigger
 * function does nothing and fencing.hook_check refuses.
 */
void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomBoolVariable("fence_hook.active",
							 "Whether PostgreSQL judges every commit by the fence check (fence_hook is loaded).",
							 NULL, &fence_hook_active, true, PGC_INTERNAL,
							 GUC_REPORT | GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE,
							 NULL, NULL, NULL);
	DefineCustomIntVariable("fence_hook.wait_ms",
							"How long a raise of the mark at a commit waits for older-token transactions before ending them.",
							NULL, &fence_hook_wait_ms, 1000, 0, 3600 * 1000, PGC_SUSET,
							GUC_UNIT_MS, NULL, NULL, NULL);
	{
		Dl_info		info;
		const char *path = "";

		if (dladdr((void *) _PG_init, &info) != 0 && info.dli_fname != NULL)
			path = MemoryContextStrdup(TopMemoryContext, info.dli_fname);
		DefineCustomStringVariable("fence_hook.library",
								   "The file fence_hook was loaded from (the schema creates fencing.hook_check from it).",
								   NULL, &fence_hook_library, path, PGC_INTERNAL,
								   GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE,
								   NULL, NULL, NULL);
	}
	MarkGUCPrefixReserved("fence_hook");
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = fence_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = fence_shmem_startup;
	CacheRegisterRelcacheCallback(forget_on_relcache, (Datum) 0);
	CacheRegisterSyscacheCallback(PROCOID, forget_on_syscache, (Datum) 0);
	CacheRegisterSyscacheCallback(NAMESPACEOID, forget_on_syscache, (Datum) 0);
	RegisterXactCallback(fence_hook_xact, NULL);
	prev_needs_fmgr_hook = needs_fmgr_hook;
	needs_fmgr_hook = fence_needs_fmgr;
	prev_fmgr_hook = fmgr_hook;
	fmgr_hook = fence_fmgr;
	prev_executor_start_hook = ExecutorStart_hook;
	ExecutorStart_hook = fence_executor_start;
	prev_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = fence_utility;
}
