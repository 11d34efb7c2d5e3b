#!/usr/bin/env python3
"""Helper for scripts/bench-statusline: builds the transcript, appends a fresh response
before each timed run, writes the status-line input and summarizes the timings.

    bench_statusline.py gen OUT --mb 100 [--seed 11]   # a transcript of about that size
    bench_statusline.py stdin TRANSCRIPT               # the JSON a statusLine command gets
    bench_statusline.py append TRANSCRIPT              # one new assistant record with usage
    bench_statusline.py last-usage TRANSCRIPT          # the last main-chain usage, as numbers
    bench_statusline.py bench OUT.json --spec TOOLS.json --transcript T   # the timed runs
    bench_statusline.py report RESULTS_DIR             # medians and ratios from the timings

The transcript comes from the project's generator, ctxd-gen-session (tests/gen; the
release build under the target directory, or $CTXD_GEN_SESSION): one Claude Code
session in which, each time the context passes --compact-at tokens, a compact boundary
and a summary record follow, as after an auto-compact, and the next part starts from
the summary. So the file is as large as asked while every part's usage stays inside a
200k window, the way a long real session looks. Standard library only; the same
arguments give the same bytes.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

GEN = os.environ.get("CTXD_GEN_SESSION") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target"),
    "release", "ctxd-gen-session")


def gen(args):
    if not os.access(GEN, os.X_OK):
        sys.exit(f"no generator at {GEN}: cargo build --release -p ctxd-gen (or set CTXD_GEN_SESSION)")
    # About 8 minutes a turn and 3 turns a 100 kB: start early enough that the session
    # ends before the appended records (stamped now), whatever the size.
    start = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc) - timedelta(days=args.mb / 4)
    tmp = args.out + ".partial"
    done = subprocess.run([GEN, "--target-bytes", str(args.mb * 1_000_000), "--compact-at", str(args.compact_at),
                           "--seed", str(args.seed), "--cwd", args.cwd, "--model", args.model,
                           "--start", start.strftime("%Y-%m-%dT%H:%M:%SZ"), "--out", tmp, "--stats"],
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"ctxd-gen-session failed: {done.stderr}")
    os.replace(tmp, args.out)
    print(f"generated {args.out}: {done.stderr.strip()}")


def tail_lines(path, nbytes=1 << 20):
    with open(path, "rb") as f:
        f.seek(0, 2)
        end = f.tell()
        f.seek(max(0, end - nbytes))
        data = f.read()
    lines = data.split(b"\n")
    if end > nbytes:
        lines = lines[1:]
    return [l for l in lines if l.strip()]


def last_record(path, pred):
    for line in reversed(tail_lines(path)):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if pred(rec):
            return rec
    return None


def first_record(path):
    with open(path, "rb") as f:
        return json.loads(f.readline())


def main_chain_usage(rec):
    msg = rec.get("message") or {}
    return (rec.get("type") == "assistant" and isinstance(msg.get("usage"), dict)
            and not rec.get("isSidechain") and not rec.get("isApiErrorMessage")
            and msg.get("model") != "<synthetic>")


def stdin_json(args):
    first = first_record(args.transcript)
    cwd = first.get("cwd", "/home/dev/project")
    # No `context_window`: with it (and its `current_usage`) Claude Code would hand the
    # answer to every tool; without it each one has to work it out from the transcript.
    print(json.dumps({
        "hook_event_name": "Status",
        "session_id": first["sessionId"],
        "transcript_path": os.path.abspath(args.transcript),
        "cwd": cwd,
        "model": {"id": args.model, "display_name": args.display_name},
        "workspace": {"current_dir": cwd, "project_dir": cwd},
        "version": "2.1.0",
        "output_style": {"name": "default"},
        "cost": {"total_cost_usd": 1.25, "total_duration_ms": 600000, "total_api_duration_ms": 120000,
                 "total_lines_added": 10, "total_lines_removed": 2},
        "exceeds_200k_tokens": False,
    }))


def append(args):
    last = last_record(args.transcript, lambda r: "uuid" in r)
    prev = last_record(args.transcript, main_chain_usage)
    if last is None or prev is None:
        sys.exit("no record with usage in the last MiB")
    u = prev["message"]["usage"]
    rng = random.Random()
    context = u.get("input_tokens", 0) + u.get("cache_creation_input_tokens", 0) + u.get("cache_read_input_tokens", 0)
    creation = rng.randint(20, 200)
    usage = {"input_tokens": 3, "cache_creation_input_tokens": creation,
             "cache_read_input_tokens": context - 3 + u.get("output_tokens", 0),
             "output_tokens": rng.randint(20, 300), "service_tier": "standard"}
    stamp = datetime.now(timezone.utc)
    try:
        stamp = max(stamp, datetime.fromisoformat(last["timestamp"].replace("Z", "+00:00")) + timedelta(seconds=1))
    except (KeyError, ValueError):
        pass
    now = stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    rec = {"parentUuid": last["uuid"], "isSidechain": False, "userType": "external",
           "cwd": last.get("cwd", "/home/dev/project"), "sessionId": last.get("sessionId"),
           "version": "2.1.0", "gitBranch": "main", "type": "assistant",
           "requestId": "req_" + uuid.uuid4().hex[:24],
           "message": {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
                       "model": prev["message"].get("model", "claude-sonnet-4-5-20250929"),
                       "content": [{"type": "text", "text": "Done: the change is in and the tests pass."}],
                       "stop_reason": "end_turn", "stop_sequence": None, "usage": usage},
           "uuid": str(uuid.uuid4()), "timestamp": now}
    with open(args.transcript, "a") as f:
        f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def last_usage(args):
    rec = last_record(args.transcript, main_chain_usage)
    if rec is None:
        sys.exit("no usage")
    u = rec["message"]["usage"]
    ctx = u.get("input_tokens", 0) + u.get("cache_creation_input_tokens", 0) + u.get("cache_read_input_tokens", 0)
    out = u.get("output_tokens", 0)
    print(f"last response's usage: input + cache = {ctx:,} tokens (what ccstatusline and ccusage show); "
          f"+ output {out:,} = {ctx + out:,} (ctxd's figure: the response it produced is context too)")


def bench(args):
    """Times each tool as a process of its own (no shell: argv, stdin from its file,
    stdout to /dev/null), after appending a fresh response to the transcript before
    every run. Rounds interleave the tools, so a change in the machine's load falls on
    all of them alike; a tool with fewer runs runs in evenly spread rounds."""
    with open(args.spec) as f:
        tools = json.load(f)
    rounds = max(t["runs"] for t in tools) + args.warmup
    for t in tools:
        t["wall"], t["cpu"] = [], []
        t["every"] = max(1, (rounds - args.warmup) // t["runs"])
    for r in range(rounds):
        for t in tools:
            k = r - args.warmup
            measured = k >= 0 and k % t["every"] == 0 and len(t["wall"]) < t["runs"]
            if k >= 0 and not measured:
                continue
            append(argparse.Namespace(transcript=args.transcript))
            with open(t.get("stdin", os.devnull), "rb") as stdin:
                start = time.perf_counter()
                p = subprocess.Popen(t["argv"], stdin=stdin, stdout=subprocess.DEVNULL)
                _, status, ru = os.wait4(p.pid, 0)
                wall = time.perf_counter() - start
            p.returncode = os.waitstatus_to_exitcode(status)
            if p.returncode != 0:
                sys.exit(f"{t['name']} failed with {p.returncode}")
            if measured:
                t["wall"].append(wall)
                t["cpu"].append(ru.ru_utime + ru.ru_stime)
    with open(args.out, "w") as f:
        json.dump({"results": [{"command": t["name"], "argv": t["argv"], "median": statistics.median(t["wall"]),
                                "min": min(t["wall"]), "max": max(t["wall"]), "times": t["wall"],
                                "cpu_median": statistics.median(t["cpu"])} for t in tools]}, f, indent=1)


def fmt(seconds):
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.2f} s"


def report(args):
    for name in sorted(os.listdir(args.dir), key=lambda n: int(n.split("mb")[0]) if n[0].isdigit() else 0):
        if not name.endswith("mb.json"):
            continue
        with open(os.path.join(args.dir, name)) as f:
            runs = {r["command"]: r for r in json.load(f)["results"]}
        print(f"\n{name[:-7]} MB transcript: wall median (min - max; runs), CPU median (user + sys)")
        for tool, r in runs.items():
            print(f"  {tool:<13} {fmt(r['median']):>10}   ({fmt(r['min'])} - {fmt(r['max'])}; "
                  f"{len(r['times'])} runs)   CPU {fmt(r['cpu_median'])}")
        ctxd, tail, ccusage, ccs = (runs.get(k) for k in ("ctxd", "tail", "ccusage", "ccstatusline"))

        def ratio(a, b, key):
            return a[key] / max(b[key], 1e-9)
        if ctxd and ccs:
            r = ratio(ccs, ctxd, "median")
            print(f"  ccstatusline / ctxd = {r:.0f}x   (CPU {ratio(ccs, ctxd, 'cpu_median'):.0f}x; "
                  f"target >= 20x: {'met' if r >= 20 else 'MISSED'})")
        if ctxd and ccusage:
            r = ratio(ccusage, ctxd, "median")
            print(f"  ccusage / ctxd      = {r:.0f}x   (CPU {ratio(ccusage, ctxd, 'cpu_median'):.0f}x; "
                  f"target > 1x: {'met' if r > 1 else 'MISSED'})")
        if ctxd and tail:
            r = ratio(ctxd, tail, "median")
            print(f"  ctxd / tail+start   = {r:.2f}x (CPU {ratio(ctxd, tail, 'cpu_median'):.2f}x; "
                  f"target <= 2x: {'met' if r <= 2 else 'MISSED'})")
        hf = {}
        for tool in ("ctxd", "tail", "ccusage", "ccstatusline"):
            path = os.path.join(args.dir, f"hyperfine-{name[:-5]}-{tool}.json")
            if os.path.exists(path):
                with open(path) as f:
                    hf[tool] = json.load(f)["results"][0]
        if hf:
            print("  hyperfine cross-check (one tool after the other, through sh, its start subtracted):")
            print("    " + ", ".join(f"{t} {fmt(r['median'])} median / {fmt(r['mean'])} mean" for t, r in hf.items()))
            pairs = (("ccstatusline", "ctxd"), ("ccusage", "ctxd"), ("ctxd", "tail"))
            def x(v):
                return f"{v:.2f}x" if v < 10 else f"{v:.0f}x"
            print("    " + ", ".join(f"{a} / {b} = {x(hf[a]['median'] / max(hf[b]['median'], 1e-9))} "
                                     f"(means {x(hf[a]['mean'] / max(hf[b]['mean'], 1e-9))})"
                                     for a, b in pairs if a in hf and b in hf))
    imports = os.path.join(args.dir, "import.txt")
    if os.path.exists(imports):
        runs = {}
        with open(imports) as f:
            for line in f:
                w = line.split()
                runs.setdefault(int(w[1]), []).append((float(w[4]), float(w[-2])))
        print("\nctxd import (median wall of the runs; largest peak RSS)")
        for mb, rs in sorted(runs.items()):
            wall = statistics.median(r[0] for r in rs)
            target = mb / 100
            print(f"  {mb} MB: {wall:.2f} s, peak RSS {max(r[1] for r in rs):.0f} MB, {len(rs)} runs "
                  f"(target <= {target:.0f} s: {'met' if wall <= target else 'MISSED'})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("gen")
    a.add_argument("out")
    a.add_argument("--mb", type=int, default=100)
    a.add_argument("--seed", type=int, default=11)
    a.add_argument("--cwd", default="/home/dev/project")
    a.add_argument("--model", default="claude-sonnet-4-5-20250929")
    a.add_argument("--compact-at", type=int, default=150_000,
                   help="tokens at which a part ends with an auto-compact")
    a.set_defaults(fn=gen)
    a = sub.add_parser("stdin")
    a.add_argument("transcript")
    a.add_argument("--model", default="claude-sonnet-4-5-20250929")
    a.add_argument("--display-name", default="Sonnet 4.5")
    a.set_defaults(fn=stdin_json)
    a = sub.add_parser("append")
    a.add_argument("transcript")
    a.set_defaults(fn=append)
    a = sub.add_parser("last-usage")
    a.add_argument("transcript")
    a.set_defaults(fn=last_usage)
    a = sub.add_parser("bench")
    a.add_argument("out")
    a.add_argument("--spec", required=True, help="JSON list of {name, argv, stdin, runs}")
    a.add_argument("--transcript", required=True, help="appended to before every run")
    a.add_argument("--warmup", type=int, default=1)
    a.set_defaults(fn=bench)
    a = sub.add_parser("report")
    a.add_argument("dir")
    a.set_defaults(fn=report)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
