"""The real Claude Code program's `/compact` answered by `ctxd gateway` from a summary it
prepared while the session was idle (called from prove.py, inside `unshare -n`).

A fresh stub.py takes 20 s to answer the program's own compaction request
(STUB_SLOW_COMPACT), as a model takes its time to write a summary; the gateway prepares
the session's summary after one idle second (`--precompute-idle 1 --precompute-at 1`).

    - the stub saw the preparation fork, and its messages up to the appended instruction
      equal the session's last request's (the cache prefix is shared);
    - `/compact` is answered by the gateway: the program's compaction took <= 1 s
      (`compactMetadata.durationMs`), and its compaction request never reached the stub;
    - `claude --resume` afterwards sends each user message once.

Standard library only.
"""
import json
import os
import subprocess
import sys
import time

from gateway import free_port, read, wait_port

HERE = os.path.dirname(os.path.abspath(__file__))
SESSION = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
SLOW = 20


def last_text(body):
    content = (body.get("messages") or [{}])[-1].get("content")
    blocks = content if isinstance(content, list) else [{"text": content or ""}]
    return " ".join(b.get("text", "") for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str))


def run(w, check):
    work = os.path.join(w.work, "instant")
    home = os.path.join(work, "home")
    os.makedirs(os.path.join(home, ".claude"))
    with open(os.path.join(home, ".claude.json"), "w") as f:
        json.dump({"userID": "6" * 64, "hasCompletedOnboarding": True}, f)
    log = os.path.join(work, "stub.jsonl")
    open(log, "w").close()
    port = free_port()
    stub = subprocess.Popen([sys.executable, os.path.join(HERE, "stub.py"), str(port), log],
                            env={**os.environ, "STUB_SLOW_COMPACT": str(SLOW)})
    wait_port(port)
    glog = os.path.join(work, "gateway.log")
    gateway = subprocess.Popen(
        [w.ctxd, "--state-dir", os.path.join(work, "ctxd-state"), "--log-file", glog, "gateway",
         "--listen", "127.0.0.1:0", "--upstream", f"http://127.0.0.1:{port}",
         "--precompute-idle", "1", "--precompute-at", "1"],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env={**w.env, "HOME": os.path.join(work, "gateway-home"), "CTXD_LOG": "info"})
    base = gateway.stdout.readline().strip().rsplit(" ", 1)[-1]
    env = {**w.env, "HOME": home, "ANTHROPIC_BASE_URL": base}

    def claude(*args):
        out = subprocess.run([w.claude, *args, "--output-format", "json"], cwd=w.proj, env=env,
                             capture_output=True, text=True, timeout=300)
        try:
            return json.loads(out.stdout)
        except ValueError:
            return {"is_error": True, "raw": out.stdout[-1000:], "stderr": out.stderr[-1000:]}

    try:
        first = claude("-p", "Instant turn one. MARK-PROMPT-71", "--session-id", SESSION)
        check("instant: the session's first turn runs through the gateway", not first.get("is_error"), str(first)[:500])
        deadline = time.time() + 60
        while "gateway: summary prepared" not in open(glog).read() and time.time() < deadline:
            time.sleep(0.1)
        seen = read(log)
        forks = [r for r in seen if "This conversation is about to be replaced" in last_text(r["body"])]
        turns = [r for r in seen if r not in forks]
        check("instant: the gateway prepared the idle session's summary through a fork", len(forks) == 1,
              f"{len(forks)} forks; log tail: {open(glog).read()[-1500:]}")
        if forks and turns:
            fork, last = forks[0]["body"], turns[-1]["body"]
            same = fork["messages"][:-1] == last["messages"] and all(
                fork.get(k) == last.get(k) for k in ("model", "system", "tools", "thinking"))
            check("instant: the fork's messages, system and tools are the last request's (cache shared)", same,
                  f"{len(fork['messages'])} vs {len(last['messages'])} messages")
        before = len(read(log))
        compacted = claude("-p", "/compact", "--resume", SESSION)
        glog_text = open(glog).read()
        check("instant: /compact is answered by the gateway from the prepared summary",
              "compaction answered from the prepared summary" in glog_text,
              str(compacted)[:300] + " | " + glog_text[-1500:])
        reached = [r for r in read(log)[before:] if last_text(r["body"]).lstrip().startswith("CRITICAL: Respond with TEXT ONLY")]
        check("instant: the program's compaction request never reached the stub", not reached, f"{len(reached)} reached")
        # What it cost and saved: the preparation's line and the answer's (written behind it).
        deadline = time.time() + 30
        while open(glog).read().count("gateway: cost recorded") < 2 and time.time() < deadline:
            time.sleep(0.1)
        out = subprocess.run([w.ctxd, "--state-dir", os.path.join(work, "ctxd-state"), "claude", "stats", SESSION[:8],
                              "--json"], capture_output=True, text=True, timeout=60,
                             env={**w.env, "HOME": os.path.join(work, "gateway-home")})
        stats = (json.loads(out.stdout or "{}").get("sessions") or [{}])[0]
        check("instant: ctxd claude stats counts the preparation at its cost and the compaction answered at once",
              out.returncode == 0 and stats.get("preparations") == 1 and stats.get("instantCompactions") == 1
              and stats.get("preparationUsd", 0) > 0 and stats.get("savedUsd", 0) > 0,
              out.stdout[-800:] + out.stderr[-400:])
        transcript = next((os.path.join(d, f) for d, _, fs in os.walk(os.path.join(home, ".claude", "projects"))
                           for f in fs if f == f"{SESSION}.jsonl"), None)
        boundaries = []
        if transcript:
            for line in open(transcript):
                record = json.loads(line)
                if record.get("subtype") == "compact_boundary":
                    boundaries.append(record.get("compactMetadata") or {})
        took = [b.get("durationMs") for b in boundaries]
        check("instant: the program's compaction took at most 1 s (20 s at the stub)",
              len(took) == 1 and isinstance(took[0], (int, float)) and took[0] <= 1000, str(took))
        resumed = claude("-p", "Instant turn two. MARK-PROMPT-72", "--resume", SESSION)
        after = [r for r in read(log) if "MARK-PROMPT-72" in json.dumps(r["body"].get("messages"))]
        text = json.dumps(after[0]["body"]["messages"]) if after else ""
        check("instant: --resume after the compaction sends each message once",
              not resumed.get("is_error") and len(after) >= 1 and text.count("MARK-PROMPT-72") == 1
              and text.count("Instant turn one. MARK-PROMPT-71") <= 1,
              f"{text.count('MARK-PROMPT-72')} × turn two; {str(resumed)[:300]}")
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
        stub.kill()
        stub.wait()
