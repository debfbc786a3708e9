/**
 * Typed errors of the SDK. Every error it throws is a `LockdError`.
 */
import { Metadata, status as Status, type ServiceError } from "@grpc/grpc-js";

/** Metadata key of lockd's stable error code (docs/api.md). */
export const ERROR_CODE_KEY = "lockd-error";

/** Base class of every error the SDK throws. */
export class LockdError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The request is invalid as written (checked here, or refused by lockd). */
export class InvalidArgument extends LockdError {}

/** The lock was not granted. `holder`, `token` and `waiters` describe who held it. */
export class NotGranted extends LockdError {
  constructor(
    message: string,
    readonly resource: string,
    readonly holder: string = "",
    /** The current holder's token, or null when nobody holds it. */
    readonly token: bigint | null = null,
    readonly waiters: number = 0,
  ) {
    super(message);
  }
}

/** The resource was held and no wait was asked for (a try). */
export class Busy extends NotGranted {}

/** The wait ran out before the lock was handed over. */
export class WaitTimedOut extends NotGranted {}

/**
 * The caller aborted the wait (its AbortSignal); nothing is held. Its `name` is "AbortError"
 * (as fetch's) and `cause` is the signal's reason.
 */
export class Cancelled extends LockdError {
  readonly code = "ABORT_ERR";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "AbortError";
  }
}

/** The lease is not the resource's current lease (expired, released, or never was). */
export class LeaseNotCurrent extends LockdError {}

/** The caller may not use this resource (another tenant's). */
export class PermissionDenied extends LockdError {}

/** lockd has a policy and the call carried no identity it knows. */
export class Unauthenticated extends PermissionDenied {}

/** A limit of lockd or of the caller's tenant (RESOURCE_EXHAUSTED); `code` says which. */
export class QuotaExceeded extends LockdError {
  constructor(message: string, readonly code: string | null) {
    super(message);
  }
}

/** lockd could not be reached, or did not answer, within the retry budget. */
export class Unavailable extends LockdError {}

/** The TLS connection to lockd failed (a certificate refused, bad TLS files). Not retried. */
export class TlsError extends LockdError {}

/** lockd refused the call for another reason: `status` is the gRPC status code, `code` lockd's. */
export class Rejected extends LockdError {
  constructor(message: string, readonly status: number, readonly code: string | null) {
    super(message);
  }
}

/** Work was attempted under a lock that is known to be lost (also `lock.signal.reason`). */
export class LockLost extends LockdError {
  constructor(message: string, readonly reason: string) {
    super(message);
  }
}

/**
 * fence-proxy (or PostgreSQL's fence check) refused a write: `code` is the SQLSTATE (`FN00x`)
 * or the HTTP problem type's name, `status` the HTTP status (0 for PostgreSQL).
 */
export class FenceRefused extends LockdError {
  constructor(
    message: string,
    readonly code: string,
    readonly status: number = 0,
    readonly resource: string | null = null,
    readonly token: string | null = null,
    readonly highest: string | null = null,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/**
 * The write's token is older than one already accepted for its resource (FN001, FN003, HTTP
 * 409): a newer holder exists, so stop working under this lock.
 */
export class StaleToken extends FenceRefused {}

function codeOf(err: ServiceError): string | null {
  const md = err.metadata;
  if (!(md instanceof Metadata)) return null;
  const values = md.get(ERROR_CODE_KEY);
  if (values.length === 0) return null;
  const v = values[0];
  return typeof v === "string" ? v : v.toString("utf8");
}

const TLS_WORDS = ["ssl", "handshake", "certificate", "tls", "self-signed", "self signed"];

export function isTlsFailure(err: ServiceError): boolean {
  const details = (err.details || "").toLowerCase();
  return err.code === Status.UNAVAILABLE && TLS_WORDS.some((w) => details.includes(w));
}

/** Status codes after which the same request may be sent again. */
export const TRANSIENT: ReadonlySet<number> = new Set([
  Status.UNAVAILABLE,
  Status.DEADLINE_EXCEEDED,
  Status.UNKNOWN,
  Status.ABORTED,
  Status.INTERNAL,
]);

export function isServiceError(e: unknown): e is ServiceError {
  return e instanceof Error && typeof (e as ServiceError).code === "number" && "details" in e;
}

export function isTransient(err: ServiceError): boolean {
  return TRANSIENT.has(err.code) && !isTlsFailure(err);
}

/** The call failed before it was sent: no connection to the endpoint could be made. */
export function neverSent(err: ServiceError): boolean {
  return err.code === Status.UNAVAILABLE && /no connection established|econnrefused|failed to connect/i.test(err.details ?? "");
}

/** The SDK's error for a failed call. */
export function fromRpc(err: ServiceError, hint = ""): LockdError {
  const status = err.code;
  const name = Status[status] ?? String(status);
  const details = err.details || name;
  const code = codeOf(err);
  if (isTlsFailure(err)) return new TlsError(`TLS with lockd failed: ${details}${hint}`);
  if (status === Status.INVALID_ARGUMENT) return new InvalidArgument(details);
  if (status === Status.FAILED_PRECONDITION && (code === null || code === "lease_not_current")) {
    return new LeaseNotCurrent(details);
  }
  if (status === Status.UNAUTHENTICATED) return new Unauthenticated(details);
  if (status === Status.PERMISSION_DENIED) return new PermissionDenied(details);
  if (status === Status.RESOURCE_EXHAUSTED) return new QuotaExceeded(details, code);
  if (TRANSIENT.has(status) || status === Status.CANCELLED) {
    return new Unavailable(`lockd is unreachable (${name}): ${details}${hint}`);
  }
  return new Rejected(
    `lockd refused the call (${name}${code ? ", " + code : ""}): ${details}`,
    status,
    code,
  );
}
