export {
  Client,
  Lock,
  LockSet,
  Lease,
  type AcquireOptions,
  type AcquireSetOptions,
  type Description,
  type LostReason,
  type Mode,
} from "./client";
export * from "./errors";
export {
  fenced,
  fencedFetch,
  fencingHeaders,
  checkResponse,
  refusalOf,
  DECLARE,
  STALE_SQLSTATES,
  type Fenceable,
  type PgQueryable,
  type PgPoolLike,
  type PgPooledClient,
} from "./fence";
export { DEFAULT_ENDPOINT, parseEndpoint, settings, newRequestId, newOwnerId, type ClientOptions } from "./settings";
export { PROTO_ROOT, PROTO_FILE } from "./proto";
