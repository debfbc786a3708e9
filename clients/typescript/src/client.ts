/**
 * The client of lockd: locks that renew themselves, say when they are lost (an AbortSignal and
 * a 'lost' event), and release on `await using`.
 *
 *     const client = new Client("http://127.0.0.1:7420");
 *     await using lock = await client.acquire("inventory:sku-1", { ttlMs: 30_000, waitMs: 10_000 });
 *     await fetch(url, { signal: lock.signal, headers: fencingHeaders(lock) });
 */
import { EventEmitter } from "node:events";
import { setTimeout as sleepFor } from "node:timers/promises";
import { inspect } from "node:util";
import * as grpc from "@grpc/grpc-js";
import {
  Busy,
  Cancelled,
  InvalidArgument,
  LeaseNotCurrent,
  LockdError,
  LockLost,
  Unavailable,
  WaitTimedOut,
  fromRpc,
  isServiceError,
  isTransient,
  neverSent,
} from "./errors";
import {
  lockServiceClient,
  REASON_WAIT_TIMEOUT,
  type PbAcquireAllResponse,
  type PbAcquireResponse,
  type PbDescribeResponse,
  type PbLease,
  type PbNotGranted,
  type PbReleaseResponse,
  type PbRenewResponse,
} from "./proto";
import {
  Backoff,
  CALL_GRACE_MS,
  CALL_WAIT_MAX_MS,
  TRANSPORT_RETRY_FOR_MS,
  checkResource,
  jittered,
  newRequestId,
  now,
  safetyMargin,
  settings,
  type ClientOptions,
  type Settings,
} from "./settings";

// Node 20 has Symbol.asyncDispose (20.4+); older runtimes get the well-known symbol defined here
// so that `await using lock = ...` (TypeScript 5.2+) and `lock[Symbol.asyncDispose]()` work.
if (typeof (Symbol as { asyncDispose?: symbol }).asyncDispose !== "symbol") {
  Object.defineProperty(Symbol, "asyncDispose", { value: Symbol.for("nodejs.asyncDispose") });
}
if (typeof (Symbol as { dispose?: symbol }).dispose !== "symbol") {
  Object.defineProperty(Symbol, "dispose", { value: Symbol.for("nodejs.dispose") });
}

/** What an acquire asks of a read-write lock: `exclusive` is a lock or a semaphore's permit. */
export type Mode = "exclusive" | "read" | "write";
const MODE_NUMBER: Record<Mode, number> = { exclusive: 0, read: 1, write: 2 };

/** Why a lock was lost. */
export type LostReason =
  /** No renewal was confirmed before the lease's local deadline (lockd unreachable or slow). */
  | "deadline_passed"
  /** lockd said the lease is not current any more. */
  | "not_current"
  /** A renewal was refused for another reason. */
  | "renew_refused";

/**
 * A lease as lockd granted it. `token` is a bigint: tokens are uint64 (up to 2^63-1), which a
 * JavaScript number cannot hold exactly. `leaseId` is a capability: never log it.
 */
export class Lease {
  constructor(
    /** The resource the lease is on (a semaphore's permit, a reader's slot: `RESOURCE@...`). */
    readonly resource: string,
    readonly leaseId: string,
    /** The fencing token, exactly (bigint). */
    readonly token: bigint,
    /** The token signed by lockd (`TOKEN.KEY_ID.MAC`), when lockd signs tokens. */
    readonly signedToken: string | null,
    readonly ttlMs: number,
    readonly expiresAtMs: number,
    readonly duplicate: boolean,
    readonly holds: number,
    readonly owner: string | null,
  ) {}

  /** The token as fence-proxy wants it: the signed form when lockd signs, else the number. */
  get fenceToken(): string {
    return this.signedToken || this.token.toString();
  }

  toJSON(): object {
    return { resource: this.resource, token: this.token.toString(), holds: this.holds };
  }

  [inspect.custom](): string {
    return `Lease(${this.resource}, token=${this.token}, holds=${this.holds})`;
  }
}

function leaseOf(resource: string, m: PbLease, owner: string | null): Lease {
  return new Lease(
    m.resource || resource,
    m.lease_id,
    BigInt(m.token),
    m.signed_token || null,
    Number(m.ttl_ms),
    Number(m.expires_at_ms),
    m.duplicate,
    Math.max(m.holds, 1),
    owner,
  );
}

/** Who holds a resource, as Describe tells. */
export interface Description {
  resource: string;
  held: boolean;
  holder: string;
  token: bigint | null;
  waiters: number;
  holds: number | null;
  ttlMs: number | null;
  permits: number | null;
  permitsHeld: number | null;
  readers: number | null;
}

export interface AcquireOptions {
  /** Lease length in ms (default: lockd's, 30 s unless configured). */
  ttlMs?: number;
  /** How long to wait in the resource's FIFO queue, ms (default 0: try once). */
  waitMs?: number;
  /** Names this acquire for de-duplication (default: a fresh random one, kept across retries). */
  requestId?: string;
  /** Makes the lock reentrant for this owner. */
  owner?: string;
  /** N (1..1000): one of the N permits of the semaphore `resource`. */
  permits?: number;
  /** A side of the read-write lock `resource`. */
  mode?: Mode;
  /** How this acquirer describes itself (default: the client's holder). */
  holder?: string;
  /** Aborting it gives up the wait: the promise rejects with `Cancelled` and lockd forgets it. */
  signal?: AbortSignal;
  /** Called once if the lock is lost (as `lock.on('lost', ...)`). */
  onLost?: (reason: LostReason, lock: Lock) => void;
}

export interface AcquireSetOptions {
  ttlMs?: number;
  waitMs?: number;
  holder?: string;
  signal?: AbortSignal;
}

function checkAcquire(resource: string, o: AcquireOptions): void {
  checkResource(resource);
  if (o.ttlMs !== undefined && !(Number.isFinite(o.ttlMs) && o.ttlMs > 0)) {
    throw new InvalidArgument(`ttlMs must be a positive number of ms, not ${o.ttlMs}`);
  }
  if (o.waitMs !== undefined && !(Number.isFinite(o.waitMs) && o.waitMs >= 0)) {
    throw new InvalidArgument(`waitMs must be zero or a positive number of ms, not ${o.waitMs}`);
  }
  const permits = o.permits ?? 0;
  if (!Number.isInteger(permits) || permits < 0 || permits > 1000) {
    throw new InvalidArgument(`permits must be 0 (a lock) or 1..1000, not ${o.permits}`);
  }
  const mode = o.mode ?? "exclusive";
  if (!(mode in MODE_NUMBER)) throw new InvalidArgument(`mode must be 'read', 'write' or 'exclusive', not ${mode}`);
  if (o.owner !== undefined && (permits || mode !== "exclusive")) {
    throw new InvalidArgument("owner (reentrancy) is for exclusive locks, not semaphores or read-write locks");
  }
  if (permits && mode !== "exclusive") throw new InvalidArgument("permits and mode do not go together");
}

function sortedUnique(resources: readonly string[]): string[] {
  if (!Array.isArray(resources)) throw new InvalidArgument("resources: an array of resource names");
  resources.forEach(checkResource);
  if (new Set(resources).size !== resources.length) throw new InvalidArgument("a resource is named twice in the set");
  if (resources.length < 1 || resources.length > 32) throw new InvalidArgument("a set has 1 to 32 resources");
  return [...resources].sort();
}

function notGranted(resource: string, ng: PbNotGranted | undefined, waited: boolean): LockdError {
  const token = ng && ng.token !== "0" ? BigInt(ng.token) : null;
  const held = token !== null ? `; held by ${JSON.stringify(ng!.holder)} with token ${token}, ${ng!.waiters} waiting` : "";
  if ((ng && ng.reason === REASON_WAIT_TIMEOUT) || waited) {
    return new WaitTimedOut(`${resource}: the wait ran out${held}`, resource, ng?.holder ?? "", token, ng?.waiters ?? 0);
  }
  return new Busy(`${resource}: busy${held}`, resource, ng?.holder ?? "", token, ng?.waiters ?? 0);
}

/** How long the clean-up after a cancelled acquire may take, ms. */
const ABANDON_FOR_MS = 10_000;

function cancelled(what: string, signal: AbortSignal): Cancelled {
  return new Cancelled(`${what} was cancelled`, { cause: signal.reason });
}

/** Waits `ms`; rejects with Cancelled when `signal` aborts. */
async function pause(ms: number, signal: AbortSignal | undefined, what: string): Promise<void> {
  try {
    await sleepFor(ms, undefined, signal ? { signal } : undefined);
  } catch (e) {
    if (signal?.aborted) throw cancelled(what, signal);
    throw e;
  }
}

/**
 * A client of one or several lockd endpoints (any instance serves; after UNAVAILABLE the next
 * is tried). Share one per process; `close()` it at the end.
 *
 * `endpoints`: a URL, an array, or a comma-separated string (default: `$LOCKD_ENDPOINT`, else
 * http://127.0.0.1:7420); `https://` with `ca` (and `cert`/`key` for mutual TLS); `token` /
 * `tokenFile`: a bearer token for a lockd with a policy (refused over plaintext to another
 * host); `holder`: how this process describes itself (default host:pid). Invalid settings
 * throw `InvalidArgument`.
 */
export class Client {
  private readonly s: Settings;
  private readonly stubs: (grpc.Client | null)[];
  private current = 0;
  private closed = false;

  constructor(endpoints?: string | readonly string[], options: ClientOptions = {}) {
    this.s = settings(endpoints, options);
    this.stubs = this.s.endpoints.map(() => null);
  }

  /** Closes the connections. Locks still held stop renewing when their next renewal fails. */
  close(): void {
    this.closed = true;
    for (const stub of this.stubs) stub?.close();
    this.stubs.fill(null);
  }

  [Symbol.dispose](): void {
    this.close();
  }

  // -- calls ---------------------------------------------------------------------------

  private stub(i: number): grpc.Client {
    if (this.closed) throw new LockdError("the client is closed");
    let stub = this.stubs[i];
    if (stub === null) {
      const Ctor = lockServiceClient();
      const ep = this.s.endpoints[i];
      stub = new Ctor(ep.target, this.s.credentials, this.s.options);
      this.stubs[i] = stub;
    }
    return stub;
  }

  private failed(i: number): void {
    if (this.current === i) this.current = (i + 1) % this.stubs.length;
  }

  /**
   * One call to the current endpoint. Rejects with the gRPC ServiceError (moving on to the next
   * endpoint after a transient one), or with `Cancelled` when `signal` aborts (the call is
   * cancelled, so lockd forgets it).
   */
  private callOnce<T>(method: string, request: object, timeoutMs: number, signal?: AbortSignal, what = method): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      if (signal?.aborted) return reject(cancelled(what, signal));
      const i = this.current;
      const metadata = new grpc.Metadata();
      if (this.s.authorization) metadata.set("authorization", this.s.authorization);
      let call: grpc.ClientUnaryCall | undefined;
      const onAbort = () => call?.cancel();
      try {
        const stub = this.stub(i) as any;
        call = stub[method](
          request,
          metadata,
          { deadline: Date.now() + Math.max(Math.ceil(timeoutMs), 1) },
          (err: grpc.ServiceError | null, resp: T) => {
            signal?.removeEventListener("abort", onAbort);
            if (signal?.aborted) return reject(cancelled(what, signal));
            if (err) {
              if (isTransient(err)) this.failed(i);
              return reject(err);
            }
            resolve(resp);
          },
        );
      } catch (e) {
        return reject(e);
      }
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  /**
   * A call other than an acquire, tried on each endpoint in turn while `again` says so: while
   * they are unreachable for a call that is safe to repeat; for a release only while it was
   * never sent (a repeat would end one more hold of a reentrant lease).
   */
  private async call<T>(method: string, request: object, timeoutMs = 10_000, signal?: AbortSignal, deadline?: number,
    again: (e: grpc.ServiceError) => boolean = isTransient): Promise<T> {
    let last: unknown;
    for (let n = 0; n < this.stubs.length; n++) {
      const t = deadline === undefined ? timeoutMs : Math.max(deadline - now(), 1);
      try {
        return await this.callOnce<T>(method, request, t, signal);
      } catch (e) {
        last = e;
        if (!isServiceError(e) || !again(e)) break;
        if (deadline !== undefined && now() >= deadline) break;
      }
    }
    if (isServiceError(last)) throw fromRpc(last);
    throw last;
  }

  /**
   * Acquires the lock of `resource`, waiting up to `waitMs` (0: try once).
   *
   * Rejects with `Busy` (held, no wait), `WaitTimedOut`, `Cancelled` (the signal aborted), and
   * the other `LockdError`s. Transport failures are retried with the same request id (a grant
   * whose answer was lost is returned, never doubled) until 10 s past the wait.
   */
  async acquire(resource: string, options?: AcquireOptions | null): Promise<Lock> {
    options = options ?? {};
    if (typeof options !== "object") throw new InvalidArgument(`options must be an object, not ${typeof options}`);
    checkAcquire(resource, options);
    return this.acquireLoop(resource, options, "");
  }

  /** @internal */
  async acquireLoop(resource: string, o: AcquireOptions, downgrade: string): Promise<Lock> {
    const what = `the acquire of ${resource}`;
    const signal = o.signal;
    if (signal?.aborted) throw cancelled(what, signal);
    const waitMs = o.waitMs ?? 0;
    const owner = o.owner ?? null;
    let requestId = o.requestId || newRequestId();
    const deadline = now() + waitMs;
    const backoff = new Backoff();
    // Whether an Acquire with `requestId` was sent and not answered: lockd may have granted it
    // (an answer lost, or a grant made just as the signal cancelled the call).
    let mayBeGranted = false;
    let request: Record<string, unknown> | null = null;
    try {
      for (;;) {
        const callWait = Math.min(Math.max(deadline - now(), 0), CALL_WAIT_MAX_MS);
        request = {
          resource,
          request_id: requestId,
          ttl_ms: o.ttlMs === undefined ? 0 : Math.max(Math.round(o.ttlMs), 1),
          wait_timeout_ms: Math.round(callWait),
          holder: o.holder || this.s.holder,
          owner: owner ?? "",
          permits: o.permits ?? 0,
          mode: MODE_NUMBER[o.mode ?? "exclusive"],
          downgrade_lease_id: downgrade,
        };
        const sent = now();
        let resp: PbAcquireResponse | null = null;
        try {
          if (!signal?.aborted) mayBeGranted = true;
          resp = await this.callOnce<PbAcquireResponse>("Acquire", request, callWait + CALL_GRACE_MS, signal, what);
        } catch (e) {
          if (!isServiceError(e)) throw e;
          const exhausted = e.code === grpc.status.RESOURCE_EXHAUSTED;
          const budget = exhausted ? deadline : deadline + TRANSPORT_RETRY_FOR_MS;
          if (!(isTransient(e) || exhausted) || now() >= budget) throw fromRpc(e);
          // Retried below with the same request id: lockd may have granted it.
        }
        if (resp !== null) {
          if (resp.outcome === "granted" && resp.granted) {
            const lease = leaseOf(resource, resp.granted, owner);
            if (!lease.duplicate) return new Lock(this, lease, sent, o.onLost);
            // The grant of an earlier attempt whose answer was lost: nobody renewed it and when it
            // was made is unknown, so renew it now to learn a safe deadline. If it has ended under
            // an id this call made, it was never used: ask anew; under the caller's own id it may
            // have been, and is never granted twice.
            if (resp.granted.held) {
              const renewSent = now();
              try {
                await this.renew(lease.resource, lease.leaseId, 10_000, signal);
                return new Lock(this, lease, renewSent, o.onLost);
              } catch (e) {
                if (!(e instanceof LeaseNotCurrent)) {
                  // Not seen to end (the renewal did not get through): asked again under the
                  // same id, as a transport failure of the acquire is.
                  if (!(e instanceof Unavailable) || now() >= deadline + TRANSPORT_RETRY_FOR_MS) throw e;
                  await pause(backoff.next(), signal, what);
                  continue;
                }
              }
            }
            mayBeGranted = false;
            if (o.requestId) throw grantEnded(requestId);
            requestId = newRequestId();
            continue;
          } else if (resp.outcome === "not_granted") {
            mayBeGranted = false;
            if (now() >= deadline) throw notGranted(resource, resp.not_granted, waitMs > 0);
          } else {
            throw new Unavailable("lockd sent an empty AcquireResponse");
          }
        }
        await pause(backoff.next(), signal, what);
      }
    } catch (e) {
      if (e instanceof Cancelled && signal?.aborted && mayBeGranted && request !== null) {
        this.abandon("Acquire", { ...request, wait_timeout_ms: 0 }, (r: PbAcquireResponse) =>
          r.outcome === "granted" && r.granted ? [[r.granted.resource || resource, r.granted.lease_id]] : []);
      }
      throw e;
    }
  }

  /**
   * In the background (not awaited, at most ABANDON_FOR_MS, never rejecting): asks again, without
   * waiting, for what a cancelled acquire asked with the same request id, and releases whatever
   * it is given. lockd may have granted the cancelled call just as it was cancelled, and nobody
   * would renew or release that lease: the resource would stay held for the TTL.
   */
  private abandon<R>(method: string, request: object, leasesOf: (r: R) => [string, string][]): void {
    const cleanUp = async () => {
      const deadline = now() + ABANDON_FOR_MS;
      // Asked again whatever the resource looks like: the given-up call may still be on its way
      // to lockd, and a resource free now would be granted to it next. This call either finds
      // that grant, or comes first: granted (and released here), the late call then finds that
      // grant ended; busy, the late call joins the queue and its cancellation, sent after it,
      // takes it out.
      const backoff = new Backoff();
      for (;;) {
        let resp: R;
        try {
          resp = await this.callOnce<R>(method, request, Math.max(Math.min(deadline - now(), CALL_GRACE_MS), 1));
        } catch (e) {
          if (!isServiceError(e) || !isTransient(e) || now() >= deadline) return;
          await sleepFor(backoff.next(), undefined, { ref: false });
          continue;
        }
        for (const [resource, leaseId] of leasesOf(resp)) {
          for (;;) {
            try {
              await this.callOnce("Release", { resource, lease_id: leaseId }, Math.max(Math.min(deadline - now(), CALL_GRACE_MS), 1));
              break;
            } catch (e) {
              if (!isServiceError(e) || !isTransient(e) || now() >= deadline) break;
              await sleepFor(backoff.next(), undefined, { ref: false });
            }
          }
        }
        return;
      }
    };
    cleanUp().catch(() => undefined);
  }

  /** Renews a lease once (a Lock does this by itself). `deadline`: on the monotonic clock. */
  async renew(resource: string, leaseId: string, timeoutMs = 10_000, signal?: AbortSignal, deadline?: number): Promise<PbRenewResponse> {
    return this.call<PbRenewResponse>("Renew", { resource, lease_id: leaseId }, timeoutMs, signal, deadline);
  }

  /**
   * Releases a lease by its id (or one hold of a reentrant one): true when this call ended it,
   * false when it was not current. The low-level call; `lock.release()` is the usual way.
   */
  async release(resource: string, leaseId: string): Promise<boolean> {
    checkResource(resource);
    const r = await this.call<PbReleaseResponse>("Release", { resource, lease_id: leaseId }, 10_000, undefined, undefined, neverSent);
    return r.released;
  }

  /** Who holds `resource`, with which token, and how many wait. */
  async describe(resource: string): Promise<Description> {
    checkResource(resource);
    const d = await this.call<PbDescribeResponse>("Describe", { resource });
    return {
      resource,
      held: d.held,
      holder: d.holder,
      token: d.held ? BigInt(d.token) : null,
      waiters: d.waiters,
      holds: d.held ? Math.max(d.holds, 1) : null,
      ttlMs: d.held ? Number(d.ttl_ms) : null,
      permits: d.permits || null,
      permitsHeld: d.permits ? d.permits_held : null,
      readers: d.read_write ? d.readers : null,
    };
  }

  /**
   * Takes every resource at once, or none (one commit at lockd; at most 32). Try-only at lockd:
   * with a wait, asked again with backoff until it ends. Rejects with `Busy` / `WaitTimedOut`
   * naming the first held member.
   */
  async acquireAll(resources: readonly string[], options?: (AcquireSetOptions & { requestId?: string }) | null): Promise<LockSet> {
    options = options ?? {};
    sortedUnique(resources);
    const names = [...resources];
    const what = `the acquire of ${names.join(", ")}`;
    const { signal } = options;
    if (options.ttlMs !== undefined && !(Number.isFinite(options.ttlMs) && options.ttlMs > 0)) {
      throw new InvalidArgument(`ttlMs must be a positive number of ms, not ${options.ttlMs}`);
    }
    const waitMs = options.waitMs ?? 0;
    let requestId = options.requestId || newRequestId();
    const deadline = now() + waitMs;
    const backoff = new Backoff();
    let mayBeGranted = false;
    let request: Record<string, unknown> | null = null;
    try {
      for (;;) {
        request = {
          resources: names,
          request_id: requestId,
          ttl_ms: options.ttlMs === undefined ? 0 : Math.max(Math.round(options.ttlMs), 1),
          holder: options.holder || this.s.holder,
        };
        let sent = now();
        let resp: PbAcquireAllResponse | null = null;
        try {
          if (!signal?.aborted) mayBeGranted = true;
          resp = await this.callOnce<PbAcquireAllResponse>("AcquireAll", request, CALL_GRACE_MS, signal, what);
        } catch (e) {
          if (!isServiceError(e)) throw e;
          if (!isTransient(e) || now() >= deadline + TRANSPORT_RETRY_FOR_MS) throw fromRpc(e);
        }
        if (resp !== null) {
          if (resp.outcome === "granted" && resp.granted) {
            const got = resp.granted.leases;
            if (got.length !== names.length) throw new Unavailable(`lockd answered ${got.length} leases for ${names.length}`);
            const leases = got.map((m, k) => leaseOf(names[k], m, null));
            if (leases.some((l) => l.duplicate)) {
              sent = now();
              try {
                for (const l of leases) await this.renew(l.resource, l.leaseId, 10_000, signal);
              } catch (e) {
                if (!(e instanceof LeaseNotCurrent)) {
                  // Not seen to end: asked again under the same id.
                  if (!(e instanceof Unavailable) || now() >= deadline + TRANSPORT_RETRY_FOR_MS) throw e;
                  await pause(backoff.next(), signal, what);
                  continue;
                }
                mayBeGranted = false;
                if (options.requestId) throw grantEnded(requestId);
                requestId = newRequestId();
                continue;
              }
            }
            return new LockSet(leases.map((l) => new Lock(this, l, sent)));
          }
          mayBeGranted = false;
          if (now() >= deadline) throw notGranted(resp.busy_resource || names[0], resp.not_granted, waitMs > 0);
        }
        await pause(backoff.next(), signal, what);
      }
    } catch (e) {
      if (e instanceof Cancelled && signal?.aborted && mayBeGranted && request !== null) {
        this.abandon("AcquireAll", request, (r: PbAcquireAllResponse) =>
          r.outcome === "granted" && r.granted ? r.granted.leases.map((m, k) => [m.resource || names[k], m.lease_id]) : []);
      }
      throw e;
    }
  }

  /**
   * Takes each lock in sorted order, waiting in each queue, within one `waitMs`; on any failure
   * releases those taken, last first. Two callers never deadlock.
   */
  async acquireOrdered(resources: readonly string[], options?: AcquireSetOptions | null): Promise<LockSet> {
    options = options ?? {};
    const ordered = sortedUnique(resources);
    const deadline = now() + (options.waitMs ?? 0);
    const taken: Lock[] = [];
    try {
      for (const r of ordered) {
        taken.push(
          await this.acquire(r, {
            ttlMs: options.ttlMs,
            waitMs: Math.max(deadline - now(), 0),
            holder: options.holder,
            signal: options.signal,
          }),
        );
      }
    } catch (e) {
      for (const lock of taken.reverse()) {
        try {
          await lock.release();
        } catch {
          // it ends by itself at its TTL
        }
      }
      throw e;
    }
    return new LockSet(taken);
  }
}

/**
 * A held lock: renews itself every third of its TTL (±10%) and says when it is lost.
 *
 * Lost is final: `signal` aborts (its reason a `LockLost`) and 'lost' is emitted with the
 * reason when lockd refuses a renewal, or when no renewal was confirmed before the lease's local
 * deadline: the send time of the request that last extended it, plus the TTL, minus a safety
 * margin (a tenth of the TTL, at least 10 ms), on the monotonic clock. That deadline ends
 * before lockd's, so stop working under the token when it fires. `signal` also aborts when the
 * lock is released. `release()` is idempotent; `await using` releases.
 *
 * A lock does not keep the process alive: its timers are unref'd, and cleared on release.
 */
export class Lock extends EventEmitter {
  readonly lease: Lease;
  /**
   * Aborts when the lock is lost (reason: a LockLost) or released. Give it to fetch & co. Made
   * on first use: a lock whose signal nobody reads costs no AbortController.
   */
  get signal(): AbortSignal {
    if (this.controller === null) {
      this.controller = new AbortController();
      if (this.lostReason !== null) {
        this.controller.abort(this.lostError());
      } else if (this.ended) {
        this.controller.abort(this.releasedError());
      }
    }
    return this.controller.signal;
  }
  /** Why the lock was lost, or null while it is not. */
  lostReason: LostReason | null = null;
  lostDetail = "";
  /** The local deadline, on the monotonic clock (performance.now()). */
  deadline: number;

  private readonly client: Client;
  private controller: AbortController | null = null;
  private ended = false;
  private renewTimer: NodeJS.Timeout | null = null;
  private deadlineTimer: NodeJS.Timeout | null = null;
  private renewCall: AbortController | null = null;
  private nextAt: number;
  private readonly backoff = new Backoff();

  /** @internal */
  constructor(client: Client, lease: Lease, extendedAt: number, onLost?: (reason: LostReason, lock: Lock) => void) {
    super();
    this.client = client;
    this.lease = lease;
    this.deadline = extendedAt + lease.ttlMs - safetyMargin(lease.ttlMs);
    if (onLost) this.once("lost", onLost);
    this.nextAt = extendedAt + jittered(lease.ttlMs / 3);
    this.armDeadline();
    this.scheduleRenew();
  }

  get resource(): string {
    return this.lease.resource;
  }
  /** The fencing token's number, exactly (bigint). */
  get token(): bigint {
    return this.lease.token;
  }
  get signedToken(): string | null {
    return this.lease.signedToken;
  }
  /** The token to attach to every write: signed when lockd signs, else the decimal number. */
  get fenceToken(): string {
    return this.lease.fenceToken;
  }
  get holds(): number {
    return this.lease.holds;
  }
  /** True once the lock is lost. */
  get lost(): boolean {
    return this.lostReason !== null;
  }

  [inspect.custom](): string {
    const state = this.lost ? "lost" : this.ended ? "ended" : "held";
    return `Lock(${this.resource}, token=${this.token}, ${state})`;
  }

  /** Throws `LockLost` if the lock is lost (call it between steps of long work). */
  check(): void {
    if (this.lostReason !== null) {
      throw new LockLost(`the lock of ${this.resource} (token ${this.token}) was lost: ${this.lostReason}: ${this.lostDetail}`, this.lostReason);
    }
  }

  private armDeadline(): void {
    if (this.deadlineTimer) clearTimeout(this.deadlineTimer);
    const fire = () => {
      this.deadlineTimer = null;
      if (this.ended || this.lostReason !== null) return;
      const left = this.deadline - now();
      if (left > 0) {
        this.deadlineTimer = setTimeout(fire, Math.ceil(left)).unref();
        return;
      }
      this.lose("deadline_passed", "no renewal was confirmed before the lease's local deadline");
    };
    this.deadlineTimer = setTimeout(fire, Math.max(Math.ceil(this.deadline - now()), 0)).unref();
  }

  private scheduleRenew(): void {
    if (this.ended || this.lostReason !== null) return;
    if (this.renewTimer) clearTimeout(this.renewTimer);
    this.renewTimer = setTimeout(() => {
      this.renewTimer = null;
      void this.renewNow();
    }, Math.max(Math.ceil(this.nextAt - now()), 0)).unref();
  }

  private async renewNow(): Promise<void> {
    if (this.ended || this.lostReason !== null) return;
    const sent = now();
    if (sent >= this.deadline) return this.lose("deadline_passed", "no renewal was confirmed before the lease's local deadline");
    const ctl = new AbortController();
    this.renewCall = ctl;
    try {
      await this.client.renew(this.lease.resource, this.lease.leaseId, this.deadline - sent, ctl.signal, this.deadline);
      if (this.ended || this.lostReason !== null) return;
      this.deadline = Math.max(this.deadline, sent + this.lease.ttlMs - safetyMargin(this.lease.ttlMs));
      this.backoff.reset();
      this.nextAt = sent + jittered(this.lease.ttlMs / 3);
      this.armDeadline();
    } catch (e) {
      if (this.ended || this.lostReason !== null) return;
      if (e instanceof LeaseNotCurrent) return this.lose("not_current", e.message);
      if (e instanceof Unavailable || e instanceof Cancelled) {
        this.nextAt = now() + this.backoff.next();
      } else {
        return this.lose("renew_refused", e instanceof Error ? e.message : String(e));
      }
    } finally {
      if (this.renewCall === ctl) this.renewCall = null;
    }
    this.scheduleRenew();
  }

  private stopTimers(): void {
    if (this.renewTimer) clearTimeout(this.renewTimer);
    if (this.deadlineTimer) clearTimeout(this.deadlineTimer);
    this.renewTimer = this.deadlineTimer = null;
    this.renewCall?.abort();
    this.renewCall = null;
  }

  /** Signals the loss once; not for a lock already ended unless `endedToo` (a downgrade that failed). */
  private lose(reason: LostReason, detail: string, endedToo = false): void {
    if ((this.ended && !endedToo) || this.lostReason !== null) return;
    this.lostReason = reason;
    this.lostDetail = detail;
    this.stopTimers();
    this.controller?.abort(this.lostError());
    // Every listener is told, even when one before it throws.
    for (const listener of this.rawListeners("lost")) {
      try {
        (listener as (reason: LostReason, lock: Lock) => unknown).call(this, reason, this);
      } catch (e) {
        process.emitWarning(`a 'lost' listener of the lock of ${this.resource} threw: ${e}`);
      }
    }
  }

  private lostError(): LockLost {
    const reason = this.lostReason ?? "released";
    return new LockLost(`the lock of ${this.resource} (token ${this.token}) was lost: ${reason}: ${this.lostDetail}`, reason);
  }

  private releasedError(): LockLost {
    return new LockLost(`the lock of ${this.resource} was released`, "released");
  }

  /** Stops renewing; false if the lock had already ended. */
  private stopRenewing(): boolean {
    if (this.ended) return false;
    this.ended = true;
    this.stopTimers();
    return true;
  }

  /**
   * Stops renewing and releases (one hold of a reentrant lease). Resolves true when this call
   * ended it at lockd; false when it was not current any more, or already released (then
   * without a call).
   */
  async release(): Promise<boolean> {
    if (!this.stopRenewing()) return false;
    if (this.controller !== null && !this.controller.signal.aborted) {
      this.controller.abort(this.releasedError());
    }
    return this.client.release(this.lease.resource, this.lease.leaseId);
  }

  /** Stops renewing without releasing, and hands the lease over. */
  detach(): Lease {
    this.stopRenewing();
    return this.lease;
  }

  /**
   * One more hold of this reentrant lease (acquired with an `owner`): the same lease and token,
   * a Lock of its own that releases that hold.
   */
  async reenter(): Promise<Lock> {
    if (this.lease.owner === null) {
      throw new InvalidArgument(`the lease of ${this.resource} has no owner: acquire it with one to nest it`);
    }
    let inner: Lock | null = null;
    try {
      inner = await this.client.acquire(this.lease.resource, { ttlMs: this.lease.ttlMs, owner: this.lease.owner });
    } catch (e) {
      if (!(e instanceof Busy)) throw e;
    }
    if (inner === null || inner.lease.leaseId !== this.lease.leaseId) {
      if (inner !== null) await inner.release();
      throw new LeaseNotCurrent(`the lease of ${this.resource} with token ${this.token} has ended`);
    }
    return inner;
  }

  /**
   * Trades this write lease of a read-write lock for a read lease in one step at lockd. This Lock
   * ends either way: when the downgrade fails, its lease is released and the Lock is lost
   * (`not_current`: the `lost` event, `lock.lost`, its signal aborted).
   */
  async downgrade(): Promise<Lock> {
    if (!this.stopRenewing()) {
      throw new LeaseNotCurrent(`this Lock of ${this.resource} has ended (released, detached or downgraded before)`);
    }
    try {
      const reader = await this.client.acquireLoop(this.lease.resource, { ttlMs: this.lease.ttlMs, mode: "read" }, this.lease.leaseId);
      // This write lease has ended: work bound to its signal stops, as after a release.
      if (this.controller !== null && !this.controller.signal.aborted) this.controller.abort(this.releasedError());
      return reader;
    } catch (e) {
      try {
        await this.client.release(this.lease.resource, this.lease.leaseId);
      } catch {
        // it ends by itself at its TTL
      }
      this.lose("not_current", `the downgrade failed and the lease was released: ${e instanceof Error ? e.message : String(e)}`, true);
      throw e;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }
}

/** Several held locks (`acquireAll`, `acquireOrdered`); `await using` releases them all. */
export class LockSet implements Iterable<Lock> {
  constructor(readonly locks: Lock[]) {}

  [Symbol.iterator](): Iterator<Lock> {
    return this.locks[Symbol.iterator]();
  }

  get length(): number {
    return this.locks.length;
  }

  /** Aborts when any of the locks is lost or released. */
  get signal(): AbortSignal {
    return AbortSignal.any(this.locks.map((l) => l.signal));
  }

  /** Releases every lock, last first; true when each was current. */
  async release(): Promise<boolean> {
    let all = true;
    let error: unknown = null;
    for (const lock of [...this.locks].reverse()) {
      try {
        if (!(await lock.release())) all = false;
      } catch (e) {
        error ??= e;
      }
    }
    if (error !== null) throw error;
    return all;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }
}

/**
 * The error for an acquire under the caller's own request id whose grant has ended since:
 * acquiring again under it would grant one request twice (docs/api.md, `request_id`).
 */
function grantEnded(requestId: string): InvalidArgument {
  return new InvalidArgument(
    `request id ${JSON.stringify(requestId)} was granted before and that grant has ended (released or expired): ` +
      "acquiring under it again would grant the same request twice; use a new request id to acquire again",
  );
}
