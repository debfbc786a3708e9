/*
 * fence_hook: PostgreSQL judges every commit by fence-proxy's fence check.
 *
 * Loaded with shared_preload_libraries, it registers a transaction callback in every backend.
 * At each top-level commit (and PREPARE TRANSACTION) of a transaction that has written
 * (a transaction id is assigned) in a session with any fencing setting, it runs the general
 * check, fencing.check_token(fence_hook.wait_ms): a stale token, half a declaration or a bad
 * signature raises, and the commit fails. PostgreSQL calls it after the transaction's deferred
 * triggers have fired and its held cursors have run, so the check judges everything the
 * transaction did, including commits inside procedures and what a FunctionCall wrote.
 *
 * It reports `fence_hook.active = on` (a read-only setting, GUC_REPORT) in the start-up of
 * every session. fence-proxy takes that report, which only the server can send and only a
 * loaded library can define, as its sign that PostgreSQL judges the commits, and then sends no
 * check of its own at a transaction's commit point (the checks before statements, which keep
 * a newer token from waiting behind an older one's row locks, it still sends).
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/autovacuum.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"

PG_MODULE_MAGIC;

void _PG_init(void);

/* The reported sign: always on once the library is loaded; nobody can set it. */
static bool fence_hook_active = true;
/* How long a raise waits for older-token transactions before ending them (the check's p_wait_ms). */
static int fence_hook_wait_ms = 1000;
/* The check, prepared once per backend; the plan cache re-plans it when the schema changes. */
static SPIPlanPtr check_plan = NULL;

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
judge_commit(void)
{
	const char *resource;
	const char *token;
	Datum		args[1];
	int			rc;
	ErrorContextCallback context;

	/* Nothing written, nothing to fence (as the relay's own check at a commit point). */
	if (!TransactionIdIsValid(GetTopTransactionIdIfAny()))
		return;
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

	context.callback = check_error_context;
	context.arg = (void *) (is_set(resource) ? resource : "''");
	context.previous = error_context_stack;
	error_context_stack = &context;

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
	args[0] = Int32GetDatum(fence_hook_wait_ms);
	/* No portal is left at a commit to lend a snapshot; each statement of the check takes its own. */
	PushActiveSnapshot(GetTransactionSnapshot());
	rc = SPI_execute_plan(check_plan, args, NULL, false, 0);
	PopActiveSnapshot();
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "fence_hook: the fence check answered %s", SPI_result_code_string(rc));
	SPI_finish();

	error_context_stack = context.previous;
}

static void
fence_hook_xact(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_PRE_PREPARE)
		judge_commit();
}

void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("fence_hook must be loaded with shared_preload_libraries"),
				 errhint("add fence_hook to shared_preload_libraries in postgresql.conf and restart PostgreSQL")));
	DefineCustomBoolVariable("fence_hook.active",
							 "Whether PostgreSQL judges every commit by the fence check (fence_hook is loaded).",
							 NULL, &fence_hook_active, true, PGC_INTERNAL,
							 GUC_REPORT | GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE,
							 NULL, NULL, NULL);
	DefineCustomIntVariable("fence_hook.wait_ms",
							"How long a raise of the mark at a commit waits for older-token transactions before ending them.",
							NULL, &fence_hook_wait_ms, 1000, 0, 3600 * 1000, PGC_SUSET,
							GUC_UNIT_MS, NULL, NULL, NULL);
	MarkGUCPrefixReserved("fence_hook");
	RegisterXactCallback(fence_hook_xact, NULL);
}
