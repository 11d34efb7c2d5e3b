#!/usr/bin/env python3
"""What the live parts of `ctxd statusline` cost: asking the gateway, and a new
session's baseline from the project's earlier transcripts.

    scripts/bench_statusline_live.py [--ctxd target/release/ctxd] [--runs 200]

Each case runs `ctxd statusline` as a process on the real Claude Code 2.1.332 input
(tests/fixtures/transcripts/claude-code-2.1.332/statusline-inputs.jsonl), the cases
interleaved run by run so the machine's load falls on all alike, and prints the median
CPU time (user + system, from wait4) and wall time of each:

- the program's own `prompt_cache` (the gateway is not asked), the reference;
- no `prompt_cache`, nothing listening at the gateway's address (refused at once);
- no `prompt_cache`, a gateway stand-in (Python's http.server, slower than ctxd's)
  answering `GET /ctxd/sessions`;
- a new session in a project folder of 0, 1, 1,000, 2,000 and 10,000 transcripts (over
  2,000 the baseline is not looked for).

Standard library only.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "tests/fixtures/transcripts/claude-code-2.1.332")


def captured(n):
    with open(os.path.join(FIXTURES, "statusline-inputs.jsonl")) as f:
        return json.loads(f.read().splitlines()[n])


def once(ctxd, stdin, home):
    started = time.perf_counter()
    p = subprocess.Popen([ctxd, "statusline"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"HOME": home})
    p.stdin.write(stdin)
    p.stdin.close()
    out = p.stdout.read().decode().strip()
    _, _, usage = os.wait4(p.pid, 0)
    return (usage.ru_utime + usage.ru_stime) * 1000, (time.perf_counter() - started) * 1000, out


def home_with_gateway(addr):
    home = tempfile.mkdtemp()
    os.makedirs(os.path.join(home, ".config/ctxd"))
    with open(os.path.join(home, ".config/ctxd/settings.json"), "w") as f:
        json.dump({"gateway": {"listen": addr}}, f)
    return home


def gateway_stand_in(session_id):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            body = json.dumps({"sessions": [{
                "sessionId": session_id, "model": "claude-opus-5-5", "inputTokens": 1,
                "cacheReadInputTokens": 14000, "cacheCreationInputTokens": 200, "outputTokens": 8,
                "sentAt": "2026-12-05T01:00:00.000Z", "answeredAt": "2026-12-05T01:00:01.000Z",
                "cacheTtlSeconds": 300, "requests": 3}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"127.0.0.1:{server.server_address[1]}"


def report(name, samples, out):
    cpu = statistics.median(s[0] for s in samples)
    wall = statistics.median(s[1] for s in samples)
    print(f"{name:<52} cpu {cpu:6.2f} ms   wall {wall:6.2f} ms   {out[:70]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ctxd", default=os.path.join(ROOT, "target/release/ctxd"))
    p.add_argument("--runs", type=int, default=200)
    args = p.parse_args()

    turn = captured(2)
    turn["transcript_path"] = os.path.join(FIXTURES, "manual-compact.jsonl")
    without = {k: v for k, v in turn.items() if k != "prompt_cache"}
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    nothing = home_with_gateway(f"127.0.0.1:{free.getsockname()[1]}")
    free.close()
    answering = home_with_gateway(gateway_stand_in(turn["session_id"]))
    cases = {
        "program's prompt_cache (gateway not asked)": (json.dumps(turn).encode(), nothing),
        "no prompt_cache, nothing at the gateway's address": (json.dumps(without).encode(), nothing),
        "no prompt_cache, a gateway answers": (json.dumps(without).encode(), answering),
    }
    samples = {name: [] for name in cases}
    outs = {}
    for _ in range(args.runs):
        for name, (stdin, home) in cases.items():
            cpu, wall, outs[name] = once(args.ctxd, stdin, home)
            samples[name].append((cpu, wall))
    for name in cases:
        report(name, samples[name], outs[name])

    new = captured(0)
    for count in (0, 1, 1000, 2000, 10000):
        project = tempfile.mkdtemp()
        for i in range(max(0, count - 1)):
            with open(os.path.join(project, f"old-{i}.jsonl"), "w") as f:
                f.write("{}\n")
        if count:
            time.sleep(0.01)
            shutil.copy(os.path.join(FIXTURES, "manual-compact.jsonl"), os.path.join(project, "newest.jsonl"))
        new["transcript_path"] = os.path.join(project, "new.jsonl")
        stdin = json.dumps(new).encode()
        runs = [once(args.ctxd, stdin, nothing) for _ in range(max(20, args.runs // 4))]
        report(f"new session, {count} transcripts in the project", [(c, w) for c, w, _ in runs], runs[-1][2])
        shutil.rmtree(project)


if __name__ == "__main__":
    main()
