/** Settings are checked before any call: what cannot work is refused as InvalidArgument. */
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { Metadata, type ServiceError } from "@grpc/grpc-js";
import { neverSent } from "../src/errors";
import { Client, InvalidArgument, parseEndpoint, settings } from "../src/index";

const dir = mkdtempSync(path.join(tmpdir(), "lockd-ts-settings-"));
const tokenFile = path.join(dir, "token");
writeFileSync(tokenFile, "s3cret-token\n");
const pem = path.join(dir, "some.pem");
writeFileSync(pem, "not really a certificate\n");

function refused(fn: () => unknown, pattern: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof InvalidArgument, `not an InvalidArgument: ${e}`);
    assert.match((e as Error).message, pattern);
    return true;
  });
}

test("endpoints are parsed into gRPC targets", () => {
  assert.deepEqual(parseEndpoint("http://127.0.0.1:7420"), {
    target: "127.0.0.1:7420",
    tls: false,
    loopback: true,
    url: "http://127.0.0.1:7420",
  });
  assert.equal(parseEndpoint("https://lockd.example.com").target, "lockd.example.com:443");
  assert.equal(parseEndpoint("http://lockd.example.com/").target, "lockd.example.com:80");
  assert.equal(parseEndpoint("http://[::1]:7420").target, "[::1]:7420");
  assert.equal(parseEndpoint("http://[::1]:7420").loopback, true);
  assert.equal(parseEndpoint("http://localhost:1").loopback, true);
  assert.equal(parseEndpoint("http://10.0.0.1:1").loopback, false);
  const s = settings("http://127.0.0.1:1, http://127.0.0.1:2");
  assert.deepEqual(s.endpoints.map((e) => e.target), ["127.0.0.1:1", "127.0.0.1:2"]);
});

test("bad URLs are refused", () => {
  for (const bad of ["", "127.0.0.1:7420", "ftp://host:1", "http://", "http://host:1/path", "http://host:1?q=1",
    "http://user@host:1", "http://host:99999", "not a url"]) {
    refused(() => new Client(bad), /endpoint/);
  }
  refused(() => new Client([]), /no endpoint/);
});

test("mixed schemes are refused", () => {
  refused(() => new Client(["http://127.0.0.1:1", "https://127.0.0.1:2"]), /mix http:\/\/ and https:\/\//);
});

test("TLS files with http:// are refused", () => {
  refused(() => new Client("http://127.0.0.1:1", { ca: pem }), /TLS files .* http:\/\//);
  refused(() => new Client("http://127.0.0.1:1", { cert: pem, key: pem }), /TLS files/);
});

test("a certificate without its key (or a key without its certificate) is refused", () => {
  refused(() => new Client("https://127.0.0.1:1", { cert: pem }), /needs its key/);
  refused(() => new Client("https://127.0.0.1:1", { key: pem }), /needs its key/);
});

test("a bearer token over plaintext to another host is refused, to a loopback host allowed", () => {
  refused(() => new Client("http://10.1.2.3:7420", { token: "abc" }), /plaintext/);
  refused(() => new Client("http://lockd.example.com:7420", { tokenFile }), /plaintext/);
  refused(() => new Client(["http://127.0.0.1:1", "http://10.1.2.3:2"], { token: "abc" }), /plaintext/);
  assert.equal(settings("http://127.0.0.1:7420", { tokenFile }).authorization, "Bearer s3cret-token");
  assert.equal(settings("http://localhost:7420", { token: "abc" }).authorization, "Bearer abc");
  assert.equal(settings("https://lockd.example.com", { token: "abc" }).authorization, "Bearer abc");
});

test("bad tokens and unreadable files are refused", () => {
  refused(() => new Client("http://127.0.0.1:1", { token: "has space" }), /printable ASCII/);
  refused(() => new Client("http://127.0.0.1:1", { token: "  " }), /printable ASCII/);
  refused(() => new Client("http://127.0.0.1:1", { token: "a", tokenFile }), /not both/);
  refused(() => new Client("http://127.0.0.1:1", { tokenFile: path.join(dir, "missing") }), /cannot read the token file/);
  refused(() => new Client("https://127.0.0.1:1", { ca: path.join(dir, "missing") }), /cannot read the CA file/);
});

test("acquire checks its arguments before any call", async () => {
  const client = new Client("http://127.0.0.1:1"); // nothing listens: a call would be Unavailable
  try {
    for (const [resource, opts] of [
      ["has space", {}],
      ["", {}],
      ["x".repeat(257), {}],
      ["r", { ttlMs: 0 }],
      ["r", { ttlMs: -1 }],
      ["r", { waitMs: -1 }],
      ["r", { waitMs: Number.NaN }],
      ["r", { permits: 1001 }],
      ["r", { permits: 1.5 }],
      ["r", { owner: "o", permits: 2 }],
      ["r", { owner: "o", mode: "read" }],
      ["r", { permits: 2, mode: "write" }],
      ["r", { mode: "shared" }],
    ] as [string, object][]) {
      await assert.rejects(client.acquire(resource, opts), InvalidArgument, `${resource} ${JSON.stringify(opts)}`);
    }
    await assert.rejects(client.acquireAll(["a", "a"]), InvalidArgument);
    await assert.rejects(client.acquireAll([]), InvalidArgument);
    await assert.rejects(client.acquireOrdered(["a", "b c"]), InvalidArgument);
    await assert.rejects(client.describe("bad name"), InvalidArgument);
  } finally {
    client.close();
  }
});

test("an aborted signal cancels before any call", async () => {
  const client = new Client("http://127.0.0.1:1");
  try {
    const ctl = new AbortController();
    ctl.abort();
    await assert.rejects(client.acquire("r", { waitMs: 1000, signal: ctl.signal }), (e: Error) => e.name === "AbortError");
  } finally {
    client.close();
  }
});

test("only a failed connection counts as never sent", () => {
  const err = (code: number, details: string) =>
    Object.assign(new Error(details), { code, details, metadata: new Metadata() }) as ServiceError;
  assert.equal(neverSent(err(14, "No connection established. Last error: connect ECONNREFUSED 127.0.0.1:9")), true);
  assert.equal(neverSent(err(14, "Connection dropped")), false);
  assert.equal(neverSent(err(4, "Deadline exceeded")), false);
});
