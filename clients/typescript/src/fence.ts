/**
 * Fencing in one line: a lock's token on every write, and a refused write as `StaleToken`.
 *
 * PostgreSQL through fence-proxy (node-postgres `Client` or `Pool`): the token is declared for
 * one transaction with `set_config(..., true)`, so a pooled connection never carries it to its
 * next user.
 *
 *     await fenced(pool, lock, async (c) => { await c.query("UPDATE stock SET n = n - 1 WHERE sku = $1", ["a"]); });
 *
 * HTTP through fence-proxy: `Fencing-Resource` and `Fencing-Token` on every request; the 409
 * stale-token problem as `StaleToken`.
 *
 *     const f = fencedFetch(lock);
 *     await f(url, { method: "PUT", body });
 *
 * `lock` is anything with `resource` and `fenceToken` (a Lock, or a Lease).
 */
import { FenceRefused, InvalidArgument, StaleToken } from "./errors";

/** What the fence helpers need of a lock. */
export interface Fenceable {
  readonly resource: string;
  readonly fenceToken: string;
}

/** The statement that declares a lock's resource and token for the current transaction only. */
export const DECLARE =
  "SELECT set_config('fencing.resource', $1, true), set_config('fencing.token', $2, true)";
/** SQLSTATEs of a stale token: FN001 (below the highest accepted), FN003 (ended for a newer one). */
export const STALE_SQLSTATES: ReadonlySet<string> = new Set(["FN001", "FN003"]);

/** The part of a node-postgres client the helper uses (pg.Client, pg.PoolClient). */
export interface PgQueryable {
  query(text: string, values?: unknown[]): Promise<unknown>;
  /** node-postgres: 'I' idle, 'T' in a transaction, 'E' in a failed one (fenced() refuses T, E). */
  getTransactionStatus?(): string | null;
}
/** A client a pool lends (pg.PoolClient). */
export type PgPooledClient = PgQueryable & { release(err?: Error | boolean): void };
/** The part of a node-postgres Pool the helper uses (pg.Pool). */
export interface PgPoolLike<C extends PgPooledClient = PgPooledClient> {
  connect(): Promise<C>;
  // pg.Pool's callback form, declared so that TypeScript infers C (pg.PoolClient) from a Pool.
  connect(callback: (err: Error | undefined, client: C | undefined, done: (release?: any) => void) => void): void;
  readonly totalCount: number;
}

/** The fence's refusal carried by a driver's error (or one it wraps), if it is one. */
export function refusalOf(e: unknown): FenceRefused | null {
  const seen = new Set<unknown>();
  let cur: unknown = e;
  while (cur && typeof cur === "object" && !seen.has(cur)) {
    seen.add(cur);
    if (cur instanceof FenceRefused) return cur;
    const state = (cur as { code?: unknown }).code;
    if (typeof state === "string" && /^FN[0-9A-Z]{3}$/.test(state)) {
      const Kind = STALE_SQLSTATES.has(state) ? StaleToken : FenceRefused;
      const text = String((cur as { message?: unknown }).message ?? "").split("\n")[0];
      return new Kind(`fence-proxy refused the write (${state}): ${text}`, state, 0, null, null, null, { cause: cur });
    }
    cur = (cur as { cause?: unknown }).cause;
  }
  return null;
}

function isPool(db: unknown): db is PgPoolLike {
  return typeof db === "object" && db !== null && "totalCount" in db && typeof (db as PgPoolLike).connect === "function";
}

/**
 * Runs `work` in a transaction in which `lock`'s resource and token are declared (BEGIN, the
 * declaration with bound parameters, `work`, COMMIT; ROLLBACK when anything throws). `db` is
 * a node-postgres Client (or PoolClient) or a Pool (a client is taken for the transaction and
 * given back). A fence refusal rejects as `StaleToken` (FN001, FN003) or `FenceRefused`
 * (other FN00x); other errors pass through unchanged.
 *
 * It opens its own transaction, so it rejects with `InvalidArgument` (and runs nothing) when the
 * client is already in one: one the caller began, or an enclosing `fenced()` on the same client.
 */
export function fenced<T, C extends PgPooledClient>(
  pool: PgPoolLike<C>,
  lock: Fenceable,
  work: (client: C) => Promise<T>,
): Promise<T>;
export function fenced<T, C extends PgQueryable>(client: C, lock: Fenceable, work: (client: C) => Promise<T>): Promise<T>;
export async function fenced<T>(
  db: PgQueryable | PgPoolLike,
  lock: Fenceable,
  work: (client: any) => Promise<T>,
): Promise<T> {
  if (isPool(db)) {
    const client = await db.connect();
    let broken: Error | undefined;
    try {
      return await transaction(client, lock, work, (e) => (broken = e));
    } catch (e) {
      // A pooled connection left inside a transaction by its last user must not be lent again.
      if (e instanceof InsideTransaction) broken = e;
      throw e;
    } finally {
      client.release(broken);
    }
  }
  return transaction(db, lock, work, () => undefined);
}

/** The refusal to run inside a transaction the caller (or an enclosing `fenced`) opened. */
class InsideTransaction extends InvalidArgument {}

/** Clients inside a running `fenced()` call. */
const running = new WeakSet<object>();

/**
 * Throws InsideTransaction when `client` is inside a transaction: BEGIN would only warn, the
 * declaration would join that transaction and COMMIT would commit the caller's earlier writes
 * under this lock's token (or end an enclosing `fenced()`'s transaction).
 */
function refuseInsideTransaction(client: PgQueryable): void {
  const refuse = (why: string) => {
    throw new InsideTransaction(
      `fenced() opens its own transaction and cannot run inside one: ${why}; ` +
        "commit or roll back first, or do all the writes inside one fenced() call",
    );
  };
  if (running.has(client)) refuse("this client is inside a running fenced() call");
  // node-postgres (pg.Client, pg.PoolClient, pg-native) tracks the server's ReadyForQuery
  // transaction status: 'I' idle, 'T' in a transaction, 'E' in a failed one. (No query can
  // tell instead: fence-proxy runs statements of its own with the client's.) A client without
  // it is only refused inside a running fenced() call.
  const status = (client as { getTransactionStatus?: () => unknown }).getTransactionStatus;
  if (typeof status === "function") {
    const s = status.call(client);
    if (s === "T") refuse("the client is in a transaction");
    if (s === "E") refuse("the client is in a failed transaction");
  }
}

async function transaction<T, C extends PgQueryable>(
  client: C,
  lock: Fenceable,
  work: (client: C) => Promise<T>,
  onBroken: (e: Error) => void,
): Promise<T> {
  const resource = lock.resource;
  const token = lock.fenceToken;
  refuseInsideTransaction(client);
  running.add(client);
  try {
    return await transactionBody(client, resource, token, work, onBroken);
  } finally {
    running.delete(client);
  }
}

async function transactionBody<T, C extends PgQueryable>(
  client: C,
  resource: string,
  token: string,
  work: (client: C) => Promise<T>,
  onBroken: (e: Error) => void,
): Promise<T> {
  await client.query("BEGIN");
  let result: T;
  try {
    await client.query(DECLARE, [resource, token]);
    result = await work(client);
    await client.query("COMMIT");
  } catch (e) {
    try {
      await client.query("ROLLBACK");
    } catch (rollbackError) {
      // The connection is unusable: a pool must not hand it out again.
      onBroken(rollbackError instanceof Error ? rollbackError : new Error(String(rollbackError)));
    }
    throw refusalOf(e) ?? e;
  }
  return result;
}

/** The two headers fence-proxy reads. */
export function fencingHeaders(lock: Fenceable): Record<string, string> {
  return { "Fencing-Resource": lock.resource, "Fencing-Token": lock.fenceToken };
}

const FENCING_PROBLEMS = new Set([
  "stale-token",
  "forged-token",
  "unsigned-token",
  "malformed-token",
  "malformed-resource",
  "fencing-required",
]);

/**
 * Rejects with `StaleToken` for fence-proxy's 409, `FenceRefused` for its other refusals of the
 * token (a problem+json whose type is a fencing problem); resolves to the response otherwise
 * (its body unread).
 */
export async function checkResponse(response: Response): Promise<Response> {
  const type = response.headers.get("content-type") || "";
  if (!type.includes("problem+json")) return response;
  let problem: Record<string, unknown>;
  try {
    problem = (await response.clone().json()) as Record<string, unknown>;
  } catch {
    return response;
  }
  const kind = String(problem?.type ?? "");
  if (!kind.startsWith("urn:fencing:problem:")) return response;
  const name = kind.slice(kind.lastIndexOf(":") + 1);
  if (!FENCING_PROBLEMS.has(name)) return response;
  const Kind = response.status === 409 ? StaleToken : FenceRefused;
  const str = (v: unknown) => (v === undefined || v === null ? null : String(v));
  throw new Kind(
    `fence-proxy refused the request (${response.status} ${name}): ${problem.detail ?? ""}`,
    name,
    response.status,
    str(problem.resource),
    str(problem.token),
    str(problem.highest),
  );
}

/**
 * A fetch that adds the lock's fencing headers to every request and rejects with `StaleToken`
 * / `FenceRefused` when fence-proxy refuses the token. To stop a request when the lock is lost,
 * pass `signal: lock.signal` (fence-proxy refuses a stale token in any case).
 *
 * Redirects are not followed (`redirect: "manual"`: the 3xx response is returned), because
 * fetch would send the fencing headers, a write capability, to whatever host the redirect
 * names. Pass `redirect: "follow"` to follow them anyway: the headers then go along to the
 * redirect's target, whichever host that is.
 */
export function fencedFetch(lock: Fenceable, fetchImpl: typeof fetch = globalThis.fetch): typeof fetch {
  return (async (input: string | URL | Request, init?: RequestInit | null) => {
    init = init ?? {};
    const headers = new Headers(init.headers ?? (input instanceof Request ? input.headers : undefined));
    for (const [k, v] of Object.entries(fencingHeaders(lock))) headers.set(k, v);
    const response = await fetchImpl(input, { ...init, headers, redirect: init.redirect ?? "manual" });
    return checkResponse(response);
  }) as typeof fetch;
}
