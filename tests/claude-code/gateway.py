"""The real Claude Code program behind `ctxd gateway` (called from prove.py, inside
`unshare -n`): the program's ANTHROPIC_BASE_URL is the gateway, which forwards to a
fresh stub.py on loopback.

    (a) a scripted session (print mode, then --resume) sends the stub the same request
        bodies, byte count and JSON alike, with and without the gateway;
    (b) GET /ctxd/sessions shows the usage the stub reported for the session's last
        request, exactly, under the program's own session id;
    (c) the program still sees claude-opus-5-5's 1M window behind the gateway.

Each run starts from the same home (a fixed user id, so `metadata.user_id` agrees) and a
stub of its own (its reply numbering starts at 1), so the two runs may differ only by
what the gateway would change. Standard library only.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SESSION = "0a7e1c5d-6f2b-4c3e-9d8a-1b2c3d4e5f60"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def read(log):
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def scripted(w, home, base_url):
    """Print mode then --resume, from a fresh copy of the same home. Returns the
    program's JSON results."""
    env = {**w.env, "HOME": home, "ANTHROPIC_BASE_URL": base_url}
    results = []
    for args in (["-p", "Gateway turn one. MARK-GW-1", "--session-id", SESSION],
                 ["-p", "Gateway turn two. MARK-GW-2", "--resume", SESSION]):
        out = subprocess.run([w.claude, *args, "--output-format", "json"], cwd=w.proj, env=env,
                             capture_output=True, text=True, timeout=300)
        try:
            results.append(json.loads(out.stdout))
        except ValueError:
            results.append({"is_error": True, "raw": out.stdout[-1000:], "stderr": out.stderr[-1000:]})
    return results


def run(w, check):
    work = os.path.join(w.work, "gateway")
    os.makedirs(work)
    pristine = os.path.join(work, "home-pristine")
    os.makedirs(os.path.join(pristine, ".claude"))
    # One user id for both runs: the program derives `metadata.user_id` from it.
    with open(os.path.join(pristine, ".claude.json"), "w") as f:
        json.dump({"userID": "5" * 64, "hasCompletedOnboarding": True}, f)
    home = os.path.join(work, "home")
    runs = {}
    gateway_proc = None
    for label in ("direct", "gateway"):
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(pristine, home)
        log = os.path.join(work, f"stub-{label}.jsonl")
        open(log, "w").close()
        port = free_port()
        stub = subprocess.Popen([sys.executable, os.path.join(HERE, "stub.py"), str(port), log])
        wait_port(port)
        base = f"http://127.0.0.1:{port}"
        if label == "gateway":
            gateway_proc = subprocess.Popen(
                [w.ctxd, "--state-dir", os.path.join(work, "ctxd-state"), "--log-file",
                 os.path.join(work, "gateway.log"), "gateway", "--listen", "127.0.0.1:0", "--upstream", base],
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                env={**w.env, "HOME": os.path.join(work, "gateway-home")})
            line = gateway_proc.stdout.readline().strip()
            check("gateway: ctxd gateway starts", line.startswith("ctxd gateway listening on http://"), line)
            base = line.rsplit(" ", 1)[-1]
        try:
            results = scripted(w, home, base)
        finally:
            stub.kill()
            stub.wait()
        runs[label] = (results, read(log), base)
    try:
        compare(w, check, runs)
    finally:
        if gateway_proc:
            gateway_proc.terminate()
            gateway_proc.wait(timeout=30)
    # The program's key passed through the gateway: it is in none of ctxd's files.
    key = w.env["ANTHROPIC_API_KEY"].encode()
    holding = []
    for root in (os.path.join(work, "ctxd-state"), os.path.join(work, "gateway.log")):
        paths = [root] if os.path.isfile(root) else [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
        holding += [p for p in paths if os.path.isfile(p) and key in open(p, "rb").read()]
    check("gateway: the API key is in no file of ctxd's (state, log)", not holding and os.path.isfile(
        os.path.join(work, "gateway.log")), str(holding))


def compare(w, check, runs):
    (direct, direct_seen, _), (through, through_seen, base) = runs["direct"], runs["gateway"]
    ok = all(r.get("subtype") == "success" and not r.get("is_error") for r in direct + through)
    check("gateway: the program's session runs direct and through the gateway", ok,
          json.dumps([str(r)[:300] for r in direct + through]))
    check("gateway: the stub saw the same number of requests", len(direct_seen) == len(through_seen) > 0,
          f"{len(direct_seen)} direct, {len(through_seen)} through the gateway")
    differ = [i for i, (a, b) in enumerate(zip(direct_seen, through_seen))
              if a["bytes"] != b["bytes"] or a["body"] != b["body"] or a["path"] != b["path"]]
    detail = ""
    if differ:
        a, b = direct_seen[differ[0]], through_seen[differ[0]]
        detail = f"request {differ[0]}: {a['bytes']} vs {b['bytes']} bytes; " + next(
            (f"{k}: {json.dumps(a['body'].get(k))[:300]} vs {json.dumps(b['body'].get(k))[:300]}"
             for k in set(a["body"]) | set(b["body"]) if a["body"].get(k) != b["body"].get(k)), "")
    check("gateway: print mode and --resume send the stub identical bodies (bytes and JSON)", not differ, detail)
    # (b) the live figures of the session's last request are the stub's usage.
    with urllib.request.urlopen(base + "/ctxd/sessions", timeout=30) as answer:
        listed = json.loads(answer.read())
    mine = [s for s in listed.get("sessions", []) if s.get("sessionId") == SESSION]
    last = through_seen[-1] if through_seen else {"bytes": -1}
    want = {"inputTokens": max(1, last["bytes"] // 4), "outputTokens": 8, "cacheReadInputTokens": 0,
            "cacheCreationInputTokens": 0, "model": "claude-opus-5-5", "requests": len(through_seen),
            "cacheTtlSeconds": 300}
    got = {k: mine[0].get(k) for k in want} if mine else None
    check("gateway: /ctxd/sessions shows the stub's usage of the last request exactly", got == want,
          f"want {want}, got {got} of {listed}")
    # (c) the program's own window for claude-opus-5-5 behind the gateway.
    windows = [next(iter(r.get("modelUsage", {}).values()), {}).get("contextWindow") for r in through]
    check("gateway: the 1M window of claude-opus-5-5 holds behind the gateway", windows == [1_000_000] * 2,
          str(windows))
