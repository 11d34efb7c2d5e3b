#!/usr/bin/env python3
"""Proof with the real Claude Code program that ctxd leaves a live session alone.

Called by prove.py (check 5), or on its own, inside `unshare -n` as prove.py runs:

    live.py --claude BIN --ctxd BIN --work DIR

The program's TUI runs in tmux in a project, started plain (no session id in its
arguments: only its working directory ties it to the session), and answers two prompts
against stub.py. ctxd's daemon observes the transcript with idle compaction on (idle
after 2 s, from 1 % of the threshold, offline summary). Then:

1. while the TUI sits idle past the idle time, the daemon logs that it left the session
   alone because Claude Code (the TUI's pid) is running, at least twice, and the
   transcript is byte for byte as the program left it;
2. a third prompt typed into the TUI is answered, its request carrying each earlier
   prompt once and no summary of ctxd's;
3. after the TUI quits, the daemon compacts the session at its next idle time;
4. `claude -p --resume` then sends ctxd's summary once, every prompt of the session
   (nothing lost), what was summarized not again, and no message twice.

Standard library only; needs tmux.
"""
import json
import os
import shlex
import shutil
import subprocess
import time

IDLE_SECONDS = 2
SUMMARY_MARK = "This session picks up where an earlier conversation left off"


class Tmux:
    """The program's TUI in a tmux pane of its own server."""

    def __init__(self, w, env, cwd):
        # Its socket in the work folder, which the run removes.
        self.socket = os.path.join(w.work, "tmux-live.sock")
        self.env = {**env, "TERM": "xterm-256color"}
        command = " ".join(shlex.quote(a) for a in ["exec", w.claude])
        self.tmux("new-session", "-d", "-s", "live", "-x", "160", "-y", "50", "-c", cwd, command)

    def tmux(self, *args):
        return subprocess.run(["tmux", "-S", self.socket, "-f", "/dev/null", *args], env=self.env,
                              capture_output=True, text=True, timeout=30)

    def screen(self):
        return self.tmux("capture-pane", "-p", "-t", "live").stdout

    def pid(self):
        out = self.tmux("list-panes", "-t", "live", "-F", "#{pane_pid}").stdout.strip()
        return int(out) if out.isdigit() else None

    def type(self, text):
        self.tmux("send-keys", "-t", "live", "-l", text)
        wait(10, lambda: text[-20:] in self.screen().replace("\n", ""))
        self.tmux("send-keys", "-t", "live", "Enter")

    def close(self):
        self.tmux("kill-server")


def wait(seconds, until, step=0.1):
    """Polls `until` until it holds or `seconds` pass; says whether it held."""
    end = time.time() + seconds
    while time.time() < end:
        if until():
            return True
        time.sleep(step)
    return bool(until())


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def replies(path):
    """The program's answers in the transcript (the stub's canned texts)."""
    out = []
    for r in records(path):
        if r.get("type") == "assistant":
            for block in r["message"].get("content") or []:
                if isinstance(block, dict) and "STUB-REPLY-" in str(block.get("text", "")):
                    out.append(block["text"])
    return out


def live_session(w, check, Lsp, texts):
    if shutil.which("tmux") is None:
        check("live: tmux is installed (Debian's tmux; .ci/run installs it)", False)
        return
    home = os.path.join(w.work, "home-live")
    proj = os.path.join(w.work, "proj-live")
    os.makedirs(os.path.join(home, ".claude"))
    os.makedirs(proj)
    # A user who has been through the first-run screens, trusts this folder and
    # approved the key.
    with open(os.path.join(home, ".claude.json"), "w") as f:
        json.dump({"hasCompletedOnboarding": True, "numStartups": 5, "theme": "dark",
                   "customApiKeyResponses": {"approved": [w.env["ANTHROPIC_API_KEY"][-20:]], "rejected": []},
                   "projects": {proj: {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}}}, f)
    env = {**w.env, "HOME": home}
    folder = os.path.join(home, ".claude", "projects")

    def transcripts():
        if not os.path.isdir(folder):
            return []
        return [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names
                if name.endswith(".jsonl")]

    tui = Tmux(w, env, proj)
    daemon = None
    log_path = os.path.join(w.work, "live-daemon.log")
    try:
        ready = wait(30, lambda: "❯" in tui.screen())
        check("live: the TUI starts", ready, tui.screen()[-800:])
        if not ready:
            return
        for turn in (1, 2):
            tui.type(f"Live turn {turn}: say hello. MARK-LIVE-{turn}")
            answered = wait(60, lambda: len(transcripts()) == 1 and len(replies(transcripts()[0])) >= turn)
            check(f"live: the TUI answers turn {turn}", answered, tui.screen()[-800:])
            if not answered:
                return
        path = transcripts()[0]
        sid = os.path.basename(path)[:-len(".jsonl")]
        tui_pid = tui.pid()
        check("live: the TUI is the real program", tui_pid is not None
              and os.path.realpath(f"/proc/{tui_pid}/exe") == os.path.realpath(w.claude), str(tui_pid))

        # The daemon observes the session while the TUI sits idle.
        before = open(path, "rb").read()
        settings = {"claudeIdleCompaction": True, "claudeIdleCompactAfterSeconds": IDLE_SECONDS,
                    "claudeIdleCompactPercent": 1, "provider": "offline"}
        daemon_env = {k: v for k, v in env.items() if not k.startswith("ANTHROPIC_")}
        log = open(log_path, "w")
        daemon = Lsp([w.ctxd, "--state-dir", os.path.join(w.work, "live-state"), "--log-stderr", "serve"],
                     daemon_env, log)
        daemon.request("initialize", {"capabilities": {}, "initializationOptions": {"settings": settings}})
        daemon.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        observed = daemon.request("ctx/observe", {"transcript": path})
        check("live: the daemon observes the TUI's session", "result" in observed, str(observed)[:500])
        observed_at = time.time()
        running = f"Claude Code (pid {tui_pid}) is running for this session"

        def skips():
            with open(log_path) as f:
                return sum(1 for line in f if "observed Claude Code session idle, but" in line and running in line)

        def grew():
            return os.path.getsize(path) != len(before)

        # Two idle times pass: the daemon says each time that it left the session alone;
        # it writes nothing over that window (4 s and more).
        wait(60, lambda: skips() >= 2 or grew())
        check("live: idle past the idle time, the daemon leaves the running TUI's session alone",
              skips() >= 2, f"{skips()} skips after {time.time() - observed_at:.1f} s; "
              f"{os.path.getsize(path) - len(before)} bytes written")
        check("live: nothing written under the running TUI", open(path, "rb").read() == before,
              f"{os.path.getsize(path) - len(before)} bytes more")

        # A new prompt in the TUI: its request carries the session as the program has it.
        asked = len(w.requests())
        tui.type("Live turn 3: after the idle time. MARK-LIVE-3")
        answered = wait(60, lambda: len(replies(path)) >= 3)
        check("live: the TUI answers turn 3", answered, tui.screen()[-800:])
        turn3 = [r for r in w.requests()[asked:] if "MARK-LIVE-3" in json.dumps(r["body"].get("messages"))]
        flat = " ".join(" ".join(texts(m)) for m in (turn3[0]["body"]["messages"] if turn3 else []))
        check("live: turn 3's request carries each earlier prompt once and no summary of ctxd's",
              turn3 and all(flat.count(f"MARK-LIVE-{k}") == 1 for k in (1, 2, 3)) and SUMMARY_MARK not in flat,
              flat[:1500])

        # Quit: the session is no longer live, and the daemon compacts it.
        tui.type("/exit")
        gone = wait(30, lambda: not os.path.exists(f"/proc/{tui_pid}"))
        check("live: the TUI quits", gone, tui.screen()[-800:])
        after_tui = open(path, "rb").read()
        compacted = wait(60, lambda: b'"compact_boundary"' in open(path, "rb").read()[len(after_tui):])
        check("live: once the TUI has quit, the daemon compacts the session", compacted,
              open(log_path).read()[-1500:])
        check("live: appended only", open(path, "rb").read()[:len(after_tui)] == after_tui)
        daemon.close()
        daemon = None

        # Resumed: ctxd's summary once, every prompt there, nothing summarized sent again,
        # each message once.
        seen = len(w.requests())
        out = subprocess.run([w.claude, "-p", "After the TUI: MARK-LIVE-4", "--output-format", "json",
                              "--resume", sid], cwd=proj, env=env, capture_output=True, text=True, timeout=300)
        check("live: the program resumes the session", out.returncode == 0, out.stdout[-500:] + out.stderr[-500:])
        new = [r for r in w.requests()[seen:] if "MARK-LIVE-4" in json.dumps(r["body"].get("messages"))]
        if not new:
            check("live: a request after the resume", False)
            return
        messages = new[0]["body"]["messages"]
        flat = [" ".join(texts(m)) for m in messages]
        summaries = [i for i, t in enumerate(flat) if SUMMARY_MARK in t]
        check("live: the resumed request carries ctxd's summary once", len(summaries) == 1, json.dumps(flat)[:1500])
        everything = " ".join(flat)
        check("live: every prompt of the session is in it",
              all(f"MARK-LIVE-{k}" in everything for k in (1, 2, 3, 4)), json.dumps(flat)[:1500])
        resent = [t[:200] for t in flat if SUMMARY_MARK not in t and ("MARK-LIVE-1" in t or "MARK-LIVE-2" in t)]
        check("live: nothing summarized is sent again", not resent, json.dumps(resent))
        bodies = [json.dumps(m, sort_keys=True) for m in messages]
        doubled = sorted({b[:200] for b in bodies if bodies.count(b) > 1})
        check("live: each message once", not doubled, json.dumps(doubled))
    finally:
        tui.close()
        if daemon is not None:
            daemon.close()


def main():
    import argparse
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import prove
    p = argparse.ArgumentParser()
    p.add_argument("--claude", required=True)
    p.add_argument("--ctxd", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    w = prove.World(args)
    try:
        live_session(w, prove.check, prove.Lsp, prove.texts)
    finally:
        w.close()
    passed = sum(prove.RESULTS)
    print(f"claude-code live: {passed} passed, {len(prove.RESULTS) - passed} failed")
    sys.exit(0 if passed == len(prove.RESULTS) else 1)


if __name__ == "__main__":
    main()
