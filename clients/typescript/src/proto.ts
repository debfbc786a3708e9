/**
 * lockd's gRPC contract, loaded at run time from the copy of lock.proto shipped in the package
 * (proto/fencing/lock/v1/lock.proto; a test fails when it differs from lockd-proto's).
 */
import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

/** Where the package's copy of lock.proto lives (dist/src/ → the package root). */
export const PROTO_ROOT = path.resolve(__dirname, "..", "..", "proto");
export const PROTO_FILE = "fencing/lock/v1/lock.proto";

let ctor: grpc.ServiceClientConstructor | null = null;

/** The generated client constructor of fencing.lock.v1.LockService. */
export function lockServiceClient(): grpc.ServiceClientConstructor {
  if (ctor === null) {
    const def = protoLoader.loadSync(PROTO_FILE, {
      includeDirs: [PROTO_ROOT],
      keepCase: true,
      longs: String, // uint64 as decimal strings: tokens go up to 2^63-1
      enums: Number,
      defaults: true,
      oneofs: true,
    });
    const pkg = grpc.loadPackageDefinition(def) as any;
    ctor = pkg.fencing.lock.v1.LockService as grpc.ServiceClientConstructor;
  }
  return ctor;
}

// The messages as proto-loader gives them (keepCase, longs as strings, oneofs named).
export interface PbLease {
  lease_id: string;
  token: string;
  expires_at_ms: string;
  ttl_ms: string;
  duplicate: boolean;
  held: boolean;
  signed_token: string;
  holds: number;
  resource: string;
}

export interface PbNotGranted {
  reason: number;
  holder: string;
  token: string;
  expires_at_ms: string;
  waiters: number;
}

export const REASON_WAIT_TIMEOUT = 2;

export interface PbAcquireResponse {
  outcome?: "granted" | "not_granted";
  granted?: PbLease;
  not_granted?: PbNotGranted;
}

export interface PbAcquireAllResponse {
  outcome?: "granted" | "not_granted";
  granted?: { leases: PbLease[] };
  not_granted?: PbNotGranted;
  busy_resource: string;
}

export interface PbRenewResponse {
  expires_at_ms: string;
  ttl_ms: string;
}

export interface PbReleaseResponse {
  released: boolean;
  current_token: string;
  holds: number;
}

export interface PbDescribeResponse {
  held: boolean;
  holder: string;
  token: string;
  expires_at_ms: string;
  ttl_ms: string;
  waiters: number;
  holds: number;
  permits: number;
  permits_held: number;
  read_write: boolean;
  readers: number;
}
