/**
 * Endpoints and credentials, checks made before any call, request ids, backoff and the
 * renewal schedule: what the client and its locks share.
 */
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { isIP } from "node:net";
import { credentials, type ChannelCredentials } from "@grpc/grpc-js";
import { InvalidArgument } from "./errors";

/** Default endpoint of lockd (when neither an endpoint nor $LOCKD_ENDPOINT is given). */
export const DEFAULT_ENDPOINT = "http://127.0.0.1:7420";
/** How long transport failures are retried past the caller's wait before giving up (ms). */
export const TRANSPORT_RETRY_FOR_MS = 10_000;
/** Time allowed for a call beyond the wait it asks lockd for (ms). */
export const CALL_GRACE_MS = 5_000;
/** Longest wait asked for in one call (lockd's default `limits.wait_max_ms`). */
export const CALL_WAIT_MAX_MS = 300_000;
/** First and largest retry delay (ms). */
export const BACKOFF_MIN_MS = 50;
export const BACKOFF_MAX_MS = 1_000;

const RESOURCE = /^[A-Za-z0-9\-_.:/@]{1,256}$/;

/** A monotonic clock, in milliseconds. */
export const now = (): number => performance.now();

export function checkResource(resource: unknown): asserts resource is string {
  if (typeof resource !== "string" || !RESOURCE.test(resource)) {
    throw new InvalidArgument(
      `bad resource name ${JSON.stringify(resource)}: 1-256 bytes, allowed are ASCII letters, digits and - _ . : / @`,
    );
  }
}

/** A fresh random request id (128 bits, URL-safe). */
export function newRequestId(): string {
  return randomBytes(16).toString("base64url");
}

/** A fresh random owner id, for reentrant locks. */
export function newOwnerId(): string {
  return randomBytes(16).toString("base64url");
}

export function defaultHolder(): string {
  return `${hostname()}:${process.pid}`;
}

/**
 * How much earlier than lockd a lease is considered over: a tenth of the TTL, at least 10 ms.
 */
export function safetyMargin(ttlMs: number): number {
  return Math.max(ttlMs / 10, 10);
}

/** Retry delays: 50 ms doubling to 1 s, each drawn from the upper half of its base. */
export class Backoff {
  private base = BACKOFF_MIN_MS;
  next(): number {
    const base = this.base;
    this.base = Math.min(base * 2, BACKOFF_MAX_MS);
    return base / 2 + Math.random() * (base / 2);
  }
  reset(): void {
    this.base = BACKOFF_MIN_MS;
  }
}

/** `interval` ±10%. */
export function jittered(interval: number): number {
  return interval * (0.9 + Math.random() * 0.2);
}

export interface Endpoint {
  /** host:port, as gRPC wants it. */
  target: string;
  tls: boolean;
  loopback: boolean;
  url: string;
}

function isLoopback(host: string): boolean {
  if (host === "localhost") return true;
  const h = host.startsWith("[") ? host.slice(1, -1) : host;
  const kind = isIP(h);
  if (kind === 4) return h.startsWith("127.");
  if (kind === 6) return h === "::1" || h === "0:0:0:0:0:0:0:1" || /^::ffff:127\./i.test(h);
  return false;
}

export function parseEndpoint(url: unknown): Endpoint {
  if (typeof url !== "string") {
    throw new InvalidArgument(`bad endpoint ${String(url)}: expected http://HOST:PORT or https://HOST:PORT`);
  }
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new InvalidArgument(`bad endpoint ${JSON.stringify(url)}: expected http://HOST:PORT or https://HOST:PORT`);
  }
  if ((u.protocol !== "http:" && u.protocol !== "https:") || !u.hostname) {
    throw new InvalidArgument(`bad endpoint ${JSON.stringify(url)}: expected http://HOST:PORT or https://HOST:PORT`);
  }
  if ((u.pathname !== "" && u.pathname !== "/") || u.search || u.hash || u.username || u.password) {
    throw new InvalidArgument(`bad endpoint ${JSON.stringify(url)}: only a scheme, a host and a port`);
  }
  const tls = u.protocol === "https:";
  const port = u.port || (tls ? "443" : "80");
  return { target: `${u.hostname}:${port}`, tls, loopback: isLoopback(u.hostname), url };
}

export interface ClientOptions {
  /** PEM file of the CA that signed lockd's certificate (https:// only; default: system roots). */
  ca?: string;
  /** PEM file of a client certificate (mutual TLS); needs `key`. */
  cert?: string;
  /** PEM file of the client certificate's private key. */
  key?: string;
  /** A bearer token for a lockd with a policy (refused over plaintext to another host). */
  token?: string;
  /** A file holding the bearer token. */
  tokenFile?: string;
  /** How this process describes itself to Describe and logs (default: host:pid). */
  holder?: string;
}

export interface Settings {
  endpoints: Endpoint[];
  credentials: ChannelCredentials;
  authorization: string | null;
  holder: string;
  options: Record<string, number>;
}

function read(path: string | undefined, what: string): Buffer | null {
  if (path === undefined || path === null) return null;
  try {
    return readFileSync(path);
  } catch (e) {
    throw new InvalidArgument(`cannot read the ${what} ${path}: ${(e as Error).message}`);
  }
}

/** Checks a client's endpoints and options; throws InvalidArgument for what cannot work. */
export function settings(endpoints: string | readonly string[] | undefined, opts: ClientOptions = {}): Settings {
  let list: readonly string[];
  if (endpoints === undefined || endpoints === null) {
    endpoints = process.env.LOCKD_ENDPOINT || DEFAULT_ENDPOINT;
  }
  if (typeof endpoints === "string") {
    list = endpoints.split(",").map((e) => e.trim()).filter((e) => e);
  } else if (Array.isArray(endpoints)) {
    list = endpoints;
  } else {
    throw new InvalidArgument("endpoints: a URL, a comma-separated string of URLs, or an array of them");
  }
  const parsed = list.map(parseEndpoint);
  if (parsed.length === 0) throw new InvalidArgument("no endpoint given");
  if (new Set(parsed.map((e) => e.tls)).size > 1) {
    throw new InvalidArgument("the endpoints mix http:// and https://: use one scheme");
  }
  const tls = parsed[0].tls;
  if ((opts.cert === undefined) !== (opts.key === undefined)) {
    throw new InvalidArgument("a client certificate needs its key, and a key its certificate (cert and key)");
  }
  if (!tls && (opts.ca !== undefined || opts.cert !== undefined)) {
    throw new InvalidArgument("TLS files are given but the endpoints are http://; use https://");
  }
  let creds: ChannelCredentials = credentials.createInsecure();
  if (tls) {
    const ca = read(opts.ca, "CA file");
    const key = read(opts.key, "client key");
    const cert = read(opts.cert, "client certificate");
    try {
      creds = credentials.createSsl(ca, key, cert);
    } catch (e) {
      throw new InvalidArgument(`bad TLS files: ${(e as Error).message}`);
    }
  }
  if (opts.token !== undefined && opts.tokenFile !== undefined) {
    throw new InvalidArgument("give a bearer token or a token file, not both");
  }
  let token = opts.token;
  if (opts.tokenFile !== undefined) token = (read(opts.tokenFile, "token file") ?? Buffer.alloc(0)).toString("latin1");
  let authorization: string | null = null;
  if (token !== undefined) {
    token = token.trim();
    if (!token || ![...token].every((c) => c.charCodeAt(0) >= 33 && c.charCodeAt(0) <= 126)) {
      throw new InvalidArgument("bearer token: it must be printable ASCII without spaces");
    }
    if (!tls && !parsed.every((e) => e.loopback)) {
      throw new InvalidArgument("bearer token: not sent over plaintext to another host; use an https:// endpoint");
    }
    authorization = `Bearer ${token}`;
  }
  if (opts.holder !== undefined && (typeof opts.holder !== "string" || opts.holder.length > 128)) {
    throw new InvalidArgument("holder: a string of at most 128 bytes");
  }
  return {
    endpoints: parsed,
    credentials: creds,
    authorization,
    holder: opts.holder || defaultHolder(),
    options: {
      "grpc.keepalive_time_ms": 10_000,
      "grpc.keepalive_timeout_ms": 20_000,
      "grpc.keepalive_permit_without_calls": 0,
      "grpc.initial_reconnect_backoff_ms": 100,
      "grpc.max_reconnect_backoff_ms": 1_000,
    },
  };
}
