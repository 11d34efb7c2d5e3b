"""The real Claude Code program's `/compact` answered by `ctxd gateway` from a summary it
prepared while the session was idle (called from prove.py, inside `unshare -n`).

A fresh stub.py takes 20 s to answer the program's own compaction request
(STUB_SLOW_COMPACT), as a model takes its time to write a summary; the gateway prepares
the session's summary after one idle second (`--precompute-idle 1 --precompute-at 1`).

    - the stub saw the preparation fork, and its messages up to the appended instruction
      equal the session's last request's (the cache prefix is shared);
    - `ctxd statusline`, run as the program runs its `statusLine` command (its JSON on
      stdin, the user's HOME), says once the cache is cold that `/compact` is instant
      (summary ready);
    - `/compact` is answered by the gateway: the program's compaction took <= 1 s
      (`compactMetadata.durationMs`), and its compaction request never reached the stub;
    - `ctxd claude stats` counts the preparation at its cost and the compaction answered;
    - `claude --resume` afterwards sends each user message once.

A session too small to prepare (`unmatched`): its `/compact` matches nothing prepared, so
the gateway forwards it (one log line says why) and it takes the stub's 20 s; `--resume`
afterwards sends each user message once.

Then an automatic compaction (`auto`): the stub reports a usage (`[[USAGE:N]]`) that puts
the session at 55 % of the gateway's threshold, the gateway prepares while idle, two more
turns follow (the second past the program's own threshold, lowered for it alone with
CLAUDE_AUTOCOMPACT_PCT_OVERRIDE), and the next turn makes the program compact:

    - the gateway answers it from the prepared summary with the two turns folded in, and
      the program's compaction request never reaches the stub;
    - the program's compaction took <= 2 s, and the summary it wrote to its transcript
      names every user message of the session;
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


PROGRAM_INSTRUCTION = "CRITICAL: Respond with TEXT ONLY"
AUTO_SESSION = "2d3e4f5a-6b7c-4d8e-9fa0-1b2c3d4e5f60"
UNMATCHED_SESSION = "3e4f5a6b-7c8d-4e9f-a0b1-2c3d4e5f6a7b"
# The program compacts at 58 % of its effective window here (CLAUDE_AUTOCOMPACT_PCT_OVERRIDE,
# set for its process only); the gateway keeps the default threshold.
AUTO_PERCENT = 58


class Rig:
    """The slow stub, a gateway that prepares after one idle second, and `claude` runs
    through it in a home of their own."""

    def __init__(self, w):
        self.w = w
        work = self.work = os.path.join(w.work, "instant")
        self.home = os.path.join(work, "home")
        os.makedirs(os.path.join(self.home, ".claude"))
        with open(os.path.join(self.home, ".claude.json"), "w") as f:
            json.dump({"userID": "6" * 64, "hasCompletedOnboarding": True}, f)
        self.log = os.path.join(work, "stub.jsonl")
        open(self.log, "w").close()
        port = free_port()
        self.stub = subprocess.Popen([sys.executable, os.path.join(HERE, "stub.py"), str(port), self.log],
                                     env={**os.environ, "STUB_SLOW_COMPACT": str(SLOW)})
        wait_port(port)
        self.glog = os.path.join(work, "gateway.log")
        self.gateway = subprocess.Popen(
            [w.ctxd, "--state-dir", os.path.join(work, "ctxd-state"), "--log-file", self.glog, "gateway",
             "--listen", "127.0.0.1:0", "--upstream", f"http://127.0.0.1:{port}",
             "--precompute-idle", "1", "--precompute-at", "1"],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
            env={**w.env, "HOME": os.path.join(work, "gateway-home"), "CTXD_LOG": "info"})
        self.base = self.gateway.stdout.readline().strip().rsplit(" ", 1)[-1]
        self.env = {**w.env, "HOME": self.home, "ANTHROPIC_BASE_URL": self.base}

    def claude(self, *args, env=None):
        out = subprocess.run([self.w.claude, *args, "--output-format", "json"], cwd=self.w.proj,
                             env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=300)
        try:
            return json.loads(out.stdout)
        except ValueError:
            return {"is_error": True, "raw": out.stdout[-1000:], "stderr": out.stderr[-1000:]}

    def gateway_log(self):
        with open(self.glog) as f:
            return f.read()

    def wait_log(self, needle, count, seconds=60):
        """Waits until `needle` stands `count` times in the gateway's log."""
        deadline = time.time() + seconds
        while self.gateway_log().count(needle) < count and time.time() < deadline:
            time.sleep(0.1)
        return self.gateway_log().count(needle) >= count

    def transcript(self, session):
        """The program's records of `session`."""
        path = next((os.path.join(d, f) for d, _, fs in os.walk(os.path.join(self.home, ".claude", "projects"))
                     for f in fs if f == f"{session}.jsonl"), None)
        if not path:
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def program_compactions(self, since):
        """The program's own compaction requests the stub saw after the first `since`."""
        return [r for r in read(self.log)[since:] if PROGRAM_INSTRUCTION in last_text(r["body"])]

    def close(self):
        self.gateway.terminate()
        self.gateway.wait(timeout=30)
        self.stub.kill()
        self.stub.wait()


def boundaries(records):
    return [r.get("compactMetadata") or {} for r in records if r.get("subtype") == "compact_boundary"]


def sent_once(rig, mark, also):
    """Whether the first request carrying `mark` carries it once and `also` at most once."""
    after = [r for r in read(rig.log) if mark in json.dumps(r["body"].get("messages"))]
    text = json.dumps(after[0]["body"]["messages"]) if after else ""
    return bool(after) and text.count(mark) == 1 and all(text.count(a) <= 1 for a in also), \
        f"{text.count(mark)} × {mark}"


def run(w, check):
    rig = Rig(w)
    try:
        window = manual(rig, check)
        check("instant: the program names its model's window", bool(window), str(window))
        unmatched(rig, check)
        if window:
            auto(rig, check, window)
    finally:
        rig.close()


def manual(rig, check):
    first = rig.claude("-p", "Instant turn one. MARK-PROMPT-71", "--session-id", SESSION)
    check("instant: the session's first turn runs through the gateway", not first.get("is_error"), str(first)[:500])
    window = next(iter((first.get("modelUsage") or {}).values()), {}).get("contextWindow")
    rig.wait_log("gateway: summary prepared", 1)
    seen = read(rig.log)
    forks = [r for r in seen if "This conversation is about to be replaced" in last_text(r["body"])]
    turns = [r for r in seen if r not in forks]
    check("instant: the gateway prepared the idle session's summary through a fork", len(forks) == 1,
          f"{len(forks)} forks; log tail: {rig.gateway_log()[-1500:]}")
    if forks and turns:
        fork, last = forks[0]["body"], turns[-1]["body"]
        same = fork["messages"][:-1] == last["messages"] and all(
            fork.get(k) == last.get(k) for k in ("model", "system", "tools", "thinking"))
        check("instant: the fork's messages, system and tools are the last request's (cache shared)", same,
              f"{len(fork['messages'])} vs {len(last['messages'])} messages")
    # The status line the program would show once the cache went cold: its input in the
    # program's shape (captured from 2.1.332), this session's, `prompt_cache` cold.
    with open(os.path.join(HERE, "..", "fixtures", "transcripts", "claude-code-2.1.332",
                           "statusline-inputs.jsonl")) as f:
        status_input = json.loads(f.read().splitlines()[2])
    status_input["session_id"] = SESSION
    status_input.pop("transcript_path", None)
    status_input["prompt_cache"].update(warm=False, expires_at=int(time.time()) - 60)
    config = os.path.join(rig.home, ".config", "ctxd")
    os.makedirs(config, exist_ok=True)
    with open(os.path.join(config, "settings.json"), "w") as f:
        json.dump({"gateway": {"listen": rig.base.split("//", 1)[-1]}}, f)
    line = subprocess.run([rig.w.ctxd, "statusline"], input=json.dumps(status_input), env=rig.env,
                          capture_output=True, text=True, timeout=30).stdout.strip()
    check("instant: the status line says the cold cache's fix, /compact is instant (summary ready)",
          line.endswith("; /compact is instant (summary ready)") and "cache cold: next turn re-writes" in line,
          line)
    before = len(read(rig.log))
    compacted = rig.claude("-p", "/compact", "--resume", SESSION)
    glog_text = rig.gateway_log()
    check("instant: /compact is answered by the gateway from the prepared summary",
          "compaction answered from the prepared summary" in glog_text,
          str(compacted)[:300] + " | " + glog_text[-1500:])
    reached = rig.program_compactions(before)
    check("instant: the program's compaction request never reached the stub", not reached, f"{len(reached)} reached")
    # What it cost and saved: the preparation's line and the answer's (written behind it).
    rig.wait_log("gateway: cost recorded", 2, seconds=30)
    out = subprocess.run([rig.w.ctxd, "--state-dir", os.path.join(rig.work, "ctxd-state"), "claude", "stats",
                          SESSION[:8], "--json"], capture_output=True, text=True, timeout=60,
                         env={**rig.w.env, "HOME": os.path.join(rig.work, "gateway-home")})
    stats = (json.loads(out.stdout or "{}").get("sessions") or [{}])[0]
    check("instant: ctxd claude stats counts the preparation at its cost and the compaction answered at once",
          out.returncode == 0 and stats.get("preparations") == 1 and stats.get("instantCompactions") == 1
          and stats.get("preparationUsd", 0) > 0 and stats.get("savedUsd", 0) > 0,
          out.stdout[-800:] + out.stderr[-400:])
    took = [b.get("durationMs") for b in boundaries(rig.transcript(SESSION))]
    check("instant: the program's compaction took at most 1 s (20 s at the stub)",
          len(took) == 1 and isinstance(took[0], (int, float)) and took[0] <= 1000, str(took))
    resumed = rig.claude("-p", "Instant turn two. MARK-PROMPT-72", "--resume", SESSION)
    once, detail = sent_once(rig, "MARK-PROMPT-72", ["Instant turn one. MARK-PROMPT-71"])
    check("instant: --resume after the compaction sends each message once",
          not resumed.get("is_error") and once, f"{detail}; {str(resumed)[:300]}")
    return window


def unmatched(rig, check):
    """A `/compact` that nothing prepared covers is forwarded and waits for the model."""
    # A usage far below `--precompute-at 1` (1 % of the threshold): never prepared.
    first = rig.claude("-p", "Unmatched turn one. MARK-PROMPT-91 [[USAGE:100]]", "--session-id", UNMATCHED_SESSION)
    check("unmatched: the session's first turn runs", not first.get("is_error"), str(first)[:300])
    before = len(read(rig.log))
    forwarded_before = rig.gateway_log().count("compaction request forwarded")
    compacted = rig.claude("-p", "/compact", "--resume", UNMATCHED_SESSION)
    forwarded = [line for line in rig.gateway_log().splitlines()
                 if "compaction request forwarded" in line][forwarded_before:]
    check("unmatched: the gateway forwarded the compaction with one line saying why",
          len(forwarded) == 1 and UNMATCHED_SESSION in forwarded[0], f"{forwarded} {str(compacted)[:300]}")
    reached = rig.program_compactions(before)
    took = [m.get("durationMs") for m in boundaries(rig.transcript(UNMATCHED_SESSION))]
    check("unmatched: the stub wrote the summary, in its 20 s",
          len(reached) == 1 and len(took) == 1 and isinstance(took[0], (int, float)) and took[0] >= SLOW * 1000,
          f"{len(reached)} reached; took {took}")
    resumed = rig.claude("-p", "Unmatched turn two. MARK-PROMPT-92", "--resume", UNMATCHED_SESSION)
    once, detail = sent_once(rig, "MARK-PROMPT-92", ["Unmatched turn one. MARK-PROMPT-91"])
    check("unmatched: --resume after the compaction sends each message once",
          not resumed.get("is_error") and once, f"{detail}; {str(resumed)[:300]}")


def auto(rig, check, window):
    """An automatic compaction two turns after the preparation."""
    # Claude Code's levels for this window (BEHAVIOR.md): the effective window keeps
    # 20k for the summary's output; the default threshold is 13k below it (the
    # gateway's), the overridden one a share of it (the program's here).
    effective = window - 20_000
    gateway_threshold = effective - 13_000
    program_threshold = min(effective * AUTO_PERCENT // 100, gateway_threshold)
    usage = [gateway_threshold * 55 // 100, gateway_threshold * 56 // 100, gateway_threshold * 64 // 100]
    # Turns one and two stay under the program's threshold, turn three passes it; all
    # three stay within 10 % of the threshold of the preparation (no second one) and
    # under the gateway's 90 %.
    planned = usage[1] < program_threshold < usage[2] < usage[0] + gateway_threshold // 10
    check("auto: the usages fall around the two thresholds as planned", planned, f"{usage} {program_threshold}")
    if not planned:
        return
    override = {"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": str(AUTO_PERCENT)}
    prepared_before = rig.gateway_log().count("gateway: summary prepared")
    one = rig.claude("-p", f"Auto turn one. MARK-PROMPT-81 [[USAGE:{usage[0]}]]", "--session-id", AUTO_SESSION,
                     env=override)
    ok = not one.get("is_error") and rig.wait_log("gateway: summary prepared", prepared_before + 1)
    check("auto: the gateway prepared the idle session's summary", ok, rig.gateway_log()[-1500:])
    for n, (mark, tokens) in enumerate([("MARK-PROMPT-82", usage[1]), ("MARK-PROMPT-83", usage[2])], start=2):
        turn = rig.claude("-p", f"Auto turn {n}. {mark} [[USAGE:{tokens}]]", "--resume", AUTO_SESSION, env=override)
        check(f"auto: turn {n} after the preparation runs", not turn.get("is_error"), str(turn)[:300])
    before = len(read(rig.log))
    answered_before = rig.gateway_log().count("compaction answered from the prepared summary")
    last = rig.claude("-p", "Auto turn four. MARK-PROMPT-84", "--resume", AUTO_SESSION, env=override)
    records = rig.transcript(AUTO_SESSION)
    metadata = boundaries(records)
    check("auto: the program compacted on its own before the turn",
          not last.get("is_error") and [m.get("trigger") for m in metadata] == ["auto"], f"{metadata} {str(last)[:300]}")
    answered = [line for line in rig.gateway_log().splitlines()
                if "compaction answered from the prepared summary" in line][answered_before:]
    check("auto: the gateway answered it from the prepared summary with the newer turns folded in",
          len(answered) == 1 and "delta=0" not in answered[0], str(answered) + rig.gateway_log()[-1500:])
    reached = rig.program_compactions(before)
    check("auto: the program's compaction request never reached the stub", not reached, f"{len(reached)} reached")
    took = [m.get("durationMs") for m in metadata]
    check("auto: the program's compaction took at most 2 s (20 s at the stub)",
          len(took) == 1 and isinstance(took[0], (int, float)) and took[0] <= 2000, str(took))
    summary = json.dumps([r.get("message") for r in records if r.get("isCompactSummary")])
    missing = [m for m in ("MARK-PROMPT-81", "MARK-PROMPT-82", "MARK-PROMPT-83") if m not in summary]
    check("auto: the summary the program wrote names every user message of the session", not missing,
          f"missing {missing}: {summary[:1500]}")
    resumed = rig.claude("-p", "Auto turn five. MARK-PROMPT-85", "--resume", AUTO_SESSION)
    once, detail = sent_once(rig, "MARK-PROMPT-85", ["Auto turn four. MARK-PROMPT-84", "Auto turn one. MARK-PROMPT-81"])
    check("auto: --resume after the compaction sends each message once",
          not resumed.get("is_error") and once, f"{detail}; {str(resumed)[:300]}")
