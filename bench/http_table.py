"""Turns bench/http.sh's wrk output into the tables of BENCHMARKS.md."""
import re
import sys

text = open(sys.argv[1]).read()
marks = int(sys.argv[2])
runs = {}
for block in text.split("== ")[1:]:
    name, _, body = block.partition("\n")
    rps = re.search(r"Requests/sec:\s+([\d.]+)", body)
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", body, re.M))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", body)
    runs[name.strip()] = (float(rps.group(1)) if rps else None, lat, int(errors.group(1)) if errors else 0)


def ms(v):
    num, unit = re.match(r"([\d.]+)(\w+)", v).groups()
    return float(num) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


print("| run | requests/s | vs nginx | p50 ms | p99 ms | p99 vs nginx | non-2xx |")
print("|---|---|---|---|---|---|---|")
pairs = {
    "direct GET": None,
    "nginx GET": "nginx GET",
    "fence-proxy GET (unfenced)": "nginx GET",
    "nginx POST": "nginx POST",
    "fence-proxy POST (fenced, steady token)": "nginx POST",
}
for name, base in pairs.items():
    if name not in runs:
        continue
    rps, lat, errors = runs[name]
    ratio = f"{rps / runs[base][0]:.2f}x" if base and runs.get(base) else "-"
    p99 = f"{ms(lat['99']) / ms(runs[base][1]['99']):.2f}x" if base and runs.get(base) else "-"
    print(f"| {name} | {rps:.0f} | {ratio} | {ms(lat['50']):.2f} | {ms(lat['99']):.2f} | {p99} | {errors} |")

m = re.search(r"rss_before_kib=(\d+) rss_after_kib=(\d+) marks=(\d+)kib", text)
filled = re.search(r"sent=(\d+) failed=(\d+) seconds=([\d.]+) rate=(\d+)", text)
if m:
    before, after, disk = (int(x) for x in m.groups())
    rate = f"{filled.group(4)}/s ({filled.group(2)} failed)" if filled else "-"
    print()
    print("| marks | RSS before | RSS after | marks.redb on disk | raise rate |")
    print("|---|---|---|---|---|")
    print(f"| {marks} | {before / 1024:.0f} MiB | {after / 1024:.0f} MiB ({after * 1024 / 1e6:.0f} MB) | {disk / 1024:.0f} MiB | {rate} |")
