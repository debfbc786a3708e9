"""Turns bench/run.sh's results.jsonl into the Markdown tables of BENCHMARKS.md."""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
base = next(r for r in rows if r["mode"] == "baseline")
closed = {(r["target"], r["clients"]): r for r in rows if r["mode"] == "closed"}
opened = next((r for r in rows if r["mode"] == "open"), None)
fill = next((r for r in rows if r["mode"] == "fill"), None)


def ms(us):
    return f"{us / 1000:.2f}"


print("### Durable acquire+release, closed loop\n")
print("| system | clients | pairs/s | vs etcd | acquire p50 ms | acquire p99 ms | acquire p99.9 ms | release p50 ms | errors |")
print("|---|---|---|---|---|---|---|---|---|")
for clients in (64, 1):
    etcd = closed.get(("etcd", clients))
    for target in ("lockd", "etcd", "redis"):
        r = closed.get((target, clients))
        if not r:
            continue
        ratio = f"{r['pairs_per_s'] / etcd['pairs_per_s']:.2f}x" if etcd else "-"
        a, rel = r["acquire"], r["release"]
        print(f"| {target} | {clients} | {r['pairs_per_s']:.0f} | {ratio} | {ms(a['p50_us'])} | {ms(a['p99_us'])} | {ms(a['p999_us'])} | {ms(rel['p50_us'])} | {r['errors']} |")

floor = base["floor_p50_us"]
single = closed.get(("lockd", 1))
print("\n### Single-client acquire against the machine's floor\n")
print("| measure | p50 |")
print("|---|---|")
print(f"| loopback TCP round trip | {base['rtt']['p50_us']} us |")
print(f"| fdatasync of a 4 KiB overwrite | {base['fdatasync']['p50_us']} us |")
print(f"| floor = round trip + fdatasync | {floor} us |")
if single:
    p50 = single["acquire"]["p50_us"]
    rel = single["release"]["p50_us"]
    print(f"| lockd release, 1 client (gRPC round trip through lockd, no sync) | {rel} us |")
    print(f"| lockd acquire, 1 client | {p50} us = **{p50 / floor:.2f}x** the floor, {p50 / (rel + base['fdatasync']['p50_us']):.2f}x (release + fdatasync) |")

if opened:
    print("\n### Open loop at the specification's load (lockd)\n")
    print("| operation | rate/s | p50 ms | p99 ms | p99.9 ms | max ms | failed |")
    print("|---|---|---|---|---|---|---|")
    for op in ("acquire", "renew", "release"):
        o = opened[op]
        print(f"| {op} | {o['rate_per_s']} | {ms(o['p50_us'])} | {ms(o['p99_us'])} | {ms(o['p999_us'])} | {ms(o['max_us'])} | {o['errors']} |")

if fill:
    print("\n### Memory with held leases (lockd)\n")
    print("| leases held | RSS before | RSS after | peak RSS | fill rate |")
    print("|---|---|---|---|---|")
    print(f"| {fill['held']} | {fill['rss_before_mib']:.0f} MiB | {fill['rss_after_mib']:.0f} MiB | {fill['rss_peak_mib']:.0f} MiB | {fill['held'] / fill['seconds']:.0f}/s |")
