#!/usr/bin/env python3
"""Proof of ctxd's Claude Code support with the real Claude Code program.

    prove.py --claude BIN --ctxd BIN --work DIR [--bench [--mb 100]]

Meant to run inside a network namespace with only loopback up (`unshare -n`, see
`tests/claude-code/run`): the program talks to `stub.py` on 127.0.0.1 and nothing else.

Checks (each prints "ok" or "FAIL", then a closing "N passed, N failed" line):

1. status line: for each turn of a scripted session, `ctxd statusline` given the
   program's own window (its `modelUsage.contextWindow`) shows that window and the
   program's last reported usage.
2. `ctxd claude compact` appends only (`--offline`: no request to the stub), `ctxd
   claude undo` restores the file byte for byte, and, compacted again through the
   provider (the stub answers ctxd's summary request), the real program resumes the
   session: its first request carries the provider's summary, the kept last reply
   right after it, and every message once, and is smaller than the session's last
   request before the compaction (a 60 KB log the session read is named, not carried).
3. a transcript exported by ctxd (after `ctxd import`) is resumed by the program.
4. the program run interactively (in a pseudo-terminal) with `ctxd statusline` as its
   `statusLine` command: every time the program calls it, across turns and a
   `/compact`, ctxd's line shows the window, usage and percentage in the JSON the
   program piped to it, and the "just compacted" mark after the compaction, with the
   tokens the compaction kept where the program's usage is all zeros.
5. a session the program rewound (`--resume-session-at` an earlier reply, then a new
   prompt) is compacted by `ctxd claude compact`: the program resumes the new branch,
   and nothing of the branch left behind comes back in its request.
6. a session whose TUI is running is left alone by idle compaction, and compacted once
   the TUI quits (`live.py`).
7. the history search (`recall.py`): with `ctxd mcp` added as its MCP server, the
   program's model finds a phrase from before a compaction and reads its record whole.
8. behind `ctxd gateway` (gateway.py): identical request bodies with and without it,
   `/ctxd/sessions` figures equal to the stub's usage, and the 1M window.
9. `ctxd claude setup --no-shell` in a fresh home: the program runs the status line it
   set and shows ctxd's line with the 1M window; `--undo` takes it out again.
10. setup adds `ctxd mcp` as the program's user MCP server through `claude mcp add`,
   `--undo` removes it and leaves the rest of `~/.claude.json` to the program, and a
   user's own `ctxd` server is left alone (`mcp_setup.py`).

6. instant compaction behind `ctxd gateway` (instant.py): a summary prepared through a
   fork of the idle session's last request answers the program's `/compact` at once
   (the stub would take 20 s), and `--resume` sends each message once.

With --bench: a session of about --mb megabytes from `ctxd-gen-session` is resumed
untouched and after the daemon compacted it while idle (`claudeIdleCompaction`, observed
with `ctx/observe`); the time from launch to the first request reaching the stub and
that request's size are printed (measurements), and the compacted request is checked to
be at most 256 KB and to hold every user message of the session.

Standard library only.
"""
import argparse
import json
import os
import pty
import select
import signal
import shutil
import subprocess
import sys
import time
import uuid

import gateway  # the program behind `ctxd gateway`
import live
import mcp_setup
import recall

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""), flush=True)


class World:
    def __init__(self, args):
        self.claude = args.claude
        self.ctxd = args.ctxd
        self.work = os.path.abspath(args.work)
        shutil.rmtree(self.work, ignore_errors=True)
        self.home = os.path.join(self.work, "home")
        self.proj = os.path.join(self.work, "proj")
        os.makedirs(self.home)
        os.makedirs(self.proj)
        with open(os.path.join(self.proj, "CLAUDE.md"), "w") as f:
            f.write("# Proof project\nctxd proof run.\n")
        self.log = os.path.join(self.work, "requests.jsonl")
        open(self.log, "w").close()
        self.port = 48000 + os.getpid() % 1000
        self.stub = subprocess.Popen([sys.executable, os.path.join(HERE, "stub.py"), str(self.port), self.log])
        for _ in range(100):
            try:
                import socket
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.home,
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{self.port}",
            "ANTHROPIC_API_KEY": "sk-ant-test-0000",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }

    def close(self):
        self.stub.kill()
        self.stub.wait()

    def requests(self):
        with open(self.log) as f:
            return [json.loads(l) for l in f if l.strip()]

    def claude_p(self, prompt, resume=None):
        cmd = [self.claude, "-p", prompt, "--output-format", "json"]
        if resume:
            cmd += ["--resume", resume]
        started = time.time()
        out = subprocess.run(cmd, cwd=self.proj, env=self.env, capture_output=True, text=True, timeout=300)
        try:
            result = json.loads(out.stdout)
        except ValueError:
            result = {"is_error": True, "raw": out.stdout[-2000:], "stderr": out.stderr[-2000:]}
        result["_rc"] = out.returncode
        result["_started"] = started
        return result

    def ctxd_cmd(self, *args):
        cmd = [self.ctxd, "--state-dir", os.path.join(self.work, "ctxd-state"), "--log-stderr", *args]
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=300)

    def transcript(self, session_id):
        root = os.path.join(self.home, ".claude", "projects")
        for folder in os.listdir(root):
            path = os.path.join(root, folder, f"{session_id}.jsonl")
            if os.path.exists(path):
                return path
        raise FileNotFoundError(session_id)


def texts(message):
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    out = []
    for block in content or []:
        if isinstance(block, dict):
            if isinstance(block.get("text"), str):
                out.append(block["text"])
            elif block.get("type") == "tool_result":
                out.append(json.dumps(block.get("content")))
    return out


def short(n):
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1e3:.1f}k"
    return f"{n / 1e6:.2f}M"


def last_usage(path):
    usage = None
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "assistant" and not r.get("isSidechain") and r["message"].get("usage"):
                u = r["message"]["usage"]
                usage = sum(u.get(k, 0) for k in ("input_tokens", "cache_creation_input_tokens",
                                                   "cache_read_input_tokens", "output_tokens"))
    return usage


SUMMARY_MARK = "This session picks up where an earlier conversation left off"
# The system prompt of ctxd's summary requests (stub.py recognizes them by it too).
CTXD_SUMMARY_SYSTEM = "You write handoff summaries of software engineering sessions"


def scripted_session(w):
    """Four turns; returns the session id and the program's window."""
    first = w.claude_p("Turn one: say hello. MARK-PROMPT-1")
    check("the program answers against the stub", first.get("_rc") == 0 and not first.get("is_error"), str(first)[:500])
    sid = first.get("session_id")
    window = next(iter(first.get("modelUsage", {}).values()), {}).get("contextWindow")
    results = [first]
    if sid:
        turn_statusline(w, sid, window, 1)
    with open(os.path.join(w.proj, "notes.txt"), "w") as f:
        f.write("MARK-FILE-CONTENT: the notes of the proof project.\n")
    # A build log of about 60 KB (15k tokens): more than a compaction restores of one
    # file, so after one the session is smaller than before it.
    with open(os.path.join(w.proj, "build.log"), "w") as f:
        f.writelines(f"[{n:04d}] compiling unit {n * 7919 % 10007:05d} of the proof project: ok\n" for n in range(1000))
    for k in range(2, 5):
        # Turns 2 and 3 read a file with the Read tool, as a real session does.
        read = {2: f" [[READ:{os.path.join(w.proj, 'notes.txt')}]]",
                3: f" [[READ:{os.path.join(w.proj, 'build.log')}]]"}.get(k, "")
        results.append(w.claude_p(f"Turn {k}: go on. MARK-PROMPT-{k}{read}", resume=sid))
        if sid:
            turn_statusline(w, sid, window, k)
    return sid, window, results


def turn_statusline(w, sid, window, turn):
    """After a turn: the window the program reported and the usage it wrote last."""
    path = w.transcript(sid)
    want = last_usage(path)
    payload = {"transcript_path": path, "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"},
               "context_window": {"context_window_size": window}}
    out = subprocess.run([w.ctxd, "statusline"], input=json.dumps(payload), capture_output=True, text=True,
                         env=w.env, timeout=60)
    line = out.stdout.strip()
    check(f"turn {turn}: status line has the program's window and last usage",
          f"/ {short(window or 0)}" in line and want is not None and f"ctx {short(want)} /" in line,
          f"{window} {want} {line}")


def statusline_checks(w, sid, window, results):
    path = w.transcript(sid)
    want = last_usage(path)
    payload = {"transcript_path": path, "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"},
               "context_window": {"context_window_size": window}}
    out = subprocess.run([w.ctxd, "statusline"], input=json.dumps(payload), capture_output=True, text=True,
                         env=w.env, timeout=60)
    line = out.stdout.strip()
    check("status line shows the program's window", window == 1_000_000 and f"/ {short(window)}" in line, f"{window} {line}")
    check("status line shows the program's last usage", want is not None and f"ctx {short(want)} /" in line, f"{want} {line}")
    # Before the first turn of a new session in the same project: the baseline the
    # program reported for the session before (its first request, less its prompt).
    payload["transcript_path"] = os.path.join(os.path.dirname(path), "not-yet.jsonl")
    out = subprocess.run([w.ctxd, "statusline"], input=json.dumps(payload), capture_output=True, text=True,
                         env=w.env, timeout=60)
    first = first_request_tokens(path)
    shown = {f"ctx {short(first - cut)} /" for cut in range(0, 501)}
    check("status line before the first turn: the project's baseline, marked as a new session",
          first is not None and any(s in out.stdout for s in shown) and "new session" in out.stdout,
          f"{first} {out.stdout}")
    # In a project with no earlier session: a zero state, never an error.
    empty = os.path.join(w.work, "empty-project")
    os.makedirs(empty, exist_ok=True)
    payload["transcript_path"] = os.path.join(empty, "not-yet.jsonl")
    out = subprocess.run([w.ctxd, "statusline"], input=json.dumps(payload), capture_output=True, text=True,
                         env=w.env, timeout=60)
    check("status line before the first turn of a new project", "ctx 0 /" in out.stdout, out.stdout)


def first_request_tokens(path):
    """What the first main-chain response of a transcript reported reading."""
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            u = r.get("message", {}).get("usage") if r.get("type") == "assistant" else None
            if u and not r.get("isSidechain"):
                return sum(u.get(k, 0) for k in ("input_tokens", "cache_creation_input_tokens",
                                                   "cache_read_input_tokens"))
    return None


def program_request(requests, mark):
    """The largest request of the program's own (ctxd's summary requests left out) whose
    messages carry `mark`: the turn's model request with the whole conversation."""
    carrying = [r for r in requests
                if not is_summary_request(r) and mark in json.dumps(r["body"].get("messages"))]
    return max(carrying, key=lambda r: r["bytes"]) if carrying else None


def is_summary_request(request):
    system = request["body"].get("system")
    return CTXD_SUMMARY_SYSTEM in json.dumps(system)


def repeated_messages(messages):
    """Messages (system ones left out) sent more than once in one request, whatever their
    length, with how often."""
    bodies = [json.dumps(m, sort_keys=True) for m in messages if m["role"] != "system"]
    return {b[:300]: bodies.count(b) for b in bodies if bodies.count(b) > 1}


def compact_and_resume(w, sid, last_reply):
    path = w.transcript(sid)
    original = open(path, "rb").read()
    # The program's own request of the last turn before the compaction, to compare with.
    uncompacted = program_request(w.requests(), "MARK-PROMPT-4")
    # Offline first: no request reaches the stub, though a provider is configured (the
    # environment's ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL).
    asked = len(w.requests())
    out = w.ctxd_cmd("claude", "compact", sid, "--instructions", "the turns so far", "--offline")
    check("ctxd claude compact --offline succeeds", out.returncode == 0 and "summary by offline" in out.stdout,
          out.stdout[-500:] + out.stderr[-1500:])
    check("--offline asks no provider", len(w.requests()) == asked, str(len(w.requests()) - asked))
    after = open(path, "rb").read()
    check("compact only appends", after[: len(original)] == original and len(after) > len(original))
    out = w.ctxd_cmd("claude", "undo", sid)
    check("ctxd claude undo restores the bytes", out.returncode == 0 and open(path, "rb").read() == original,
          out.stderr[-1500:])
    # Then through the provider (the stub): one summary request in ctxd's form,
    # carrying the session's prompts.
    asked = len(w.requests())
    out = w.ctxd_cmd("claude", "compact", sid)
    check("compact again, through the provider", out.returncode == 0 and "summary by anthropic" in out.stdout,
          out.stdout[-500:] + out.stderr[-1500:])
    summary_requests = w.requests()[asked:]
    carried = json.dumps(summary_requests[0]["body"]["messages"]) if summary_requests else ""
    check("one summary request with the session's prompts",
          len(summary_requests) == 1 and all(f"MARK-PROMPT-{k}" in carried for k in (1, 2, 3)),
          str(len(summary_requests)) + carried[:800])
    seen = len(w.requests())
    resumed = w.claude_p("After the compaction: MARK-PROMPT-5", resume=sid)
    check("the program resumes the compacted session", resumed.get("_rc") == 0 and not resumed.get("is_error"),
          str(resumed)[:800])
    new = w.requests()[seen:]
    if not new:
        check("a request after the resume", False)
        return
    messages = new[0]["body"]["messages"]
    flat = [" ".join(texts(m)) for m in messages]
    summary_at = [i for i, t in enumerate(flat) if SUMMARY_MARK in t]
    check("the request carries ctxd's summary once", len(summary_at) == 1, json.dumps(flat)[:1500])
    check("the summary is the provider's", summary_at and "STUB-PROVIDER-SUMMARY" in flat[summary_at[0]],
          json.dumps(flat)[:1500])
    kept = [i for i, t in enumerate(flat) if last_reply in t and SUMMARY_MARK not in t]
    check("the kept last reply once, right after the summary",
          len(kept) == 1 and summary_at and kept[0] > summary_at[0]
          and all(messages[j]["role"] != "assistant" for j in range(summary_at[0] + 1, kept[0])),
          json.dumps([m["role"] for m in messages]) + json.dumps(flat)[:1500])
    before = [i for i, t in enumerate(flat) if SUMMARY_MARK not in t and any(
        f"MARK-PROMPT-{k}" in t or f"STUB-REPLY-{k}." in t for k in (1, 2, 3, 4))]
    check("nothing summarized is sent again", not before, json.dumps([flat[i][:200] for i in before]))
    repeated = repeated_messages(messages)
    check("each message once", not repeated, json.dumps(repeated)[:800])
    everything = json.dumps(messages)
    check("the file read before is re-attached once", everything.count("MARK-FILE-CONTENT") == 1,
          str(everything.count("MARK-FILE-CONTENT")))
    check("the compacted request is smaller than the last one before the compaction",
          uncompacted is not None and new[0]["bytes"] < uncompacted["bytes"],
          f"{new[0]['bytes']} bytes after, {uncompacted and uncompacted['bytes']} before")


def export_and_resume(w, sid):
    path = w.transcript(sid)
    out = w.ctxd_cmd("import", path, "--session-id", "proof-export")
    check("ctxd import of the program's transcript", out.returncode == 0, out.stderr[-800:])
    out = w.ctxd_cmd("export", "proof-export")
    check("ctxd export", out.returncode == 0, out.stderr[-800:])
    # Line for line, less ctxd's own bookkeeping fields (`ctxd*`), which stay home.
    def plain(text):
        out = []
        for line in text.splitlines():
            r = json.loads(line)
            for obj in (r, r.get("compactMetadata") or {}):
                for k in [k for k in obj if k.startswith("ctxd")]:
                    del obj[k]
            out.append(r)
        return out
    original = open(path).read()
    check("the export is the transcript line for line", plain(out.stdout) == plain(original))
    with open(path, "w") as f:
        f.write(out.stdout)
    resumed = w.claude_p("After the export: MARK-PROMPT-6", resume=sid)
    check("the program resumes the exported transcript", resumed.get("_rc") == 0 and not resumed.get("is_error"),
          str(resumed)[:800])


class Daemon:
    """`ctxd serve` over pipes, as an editor drives it (LSP framing, JSON-RPC)."""

    def __init__(self, w):
        self.proc = subprocess.Popen(
            [w.ctxd, "--state-dir", os.path.join(w.work, "ctxd-state"), "--log-stderr", "serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=w.env)
        self.next = 0

    def request(self, method, params):
        self.next += 1
        body = json.dumps({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params}).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()
        while True:
            length = None
            while True:
                line = self.proc.stdout.readline()
                if not line:
                    raise EOFError(method)
                if line in (b"\r\n", b"\n"):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            message = json.loads(self.proc.stdout.read(length))
            if message.get("id") == self.next and "method" not in message:
                return message

    def stop(self):
        self.request("shutdown", None)
        body = json.dumps({"jsonrpc": "2.0", "method": "exit"}).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def rewound_compact_and_resume(w):
    """Three turns, a rewind to turn 1's reply with a new prompt, ctxd's compaction, a resume."""
    first = w.claude_p("Rewind check, turn 1: MARK-RW-1")
    sid = first.get("session_id")
    for k in (2, 3):
        w.claude_p(f"Rewind check, turn {k}: MARK-RW-{k}", resume=sid)
    records = [json.loads(l) for l in open(w.transcript(sid)) if l.strip()]
    turn2 = next(i for i, r in enumerate(records) if "MARK-RW-2" in json.dumps(r.get("message")))
    reply1 = next(r["uuid"] for r in reversed(records[:turn2]) if r.get("type") == "assistant")
    cmd = [w.claude, "-p", "Rewind check, instead of turn 2: MARK-RW-BRANCH", "--output-format", "json",
           "--resume", sid, "--resume-session-at", reply1]
    rewound = subprocess.run(cmd, cwd=w.proj, env=w.env, capture_output=True, text=True, timeout=300)
    out = w.ctxd_cmd("claude", "compact", sid, "--offline")
    check("rewound: ctxd claude compact succeeds", rewound.returncode == 0 and out.returncode == 0,
          rewound.stderr[-500:] + out.stderr[-1500:])
    seen = len(w.requests())
    resumed = w.claude_p("After the rewind and the compaction: MARK-RW-AFTER", resume=sid)
    sent = json.dumps(w.requests()[seen]["body"]["messages"]) if len(w.requests()) > seen else ""
    check("rewound: the resumed request carries ctxd's summary of the new branch",
          resumed.get("_rc") == 0 and SUMMARY_MARK in sent and "MARK-RW-1" in sent and "MARK-RW-BRANCH" in sent,
          sent[:1500])
    check("rewound: nothing of the branch left behind comes back",
          "MARK-RW-2" not in sent and "MARK-RW-3" not in sent, sent[:3000])


def daemon_compaction_exported(w, sid):
    """ctxd's own compaction (the daemon's, after importing the session), exported over
    the program's transcript: the program resumes it and sends each message once."""
    path = w.transcript(sid)
    d = Daemon(w)
    d.request("initialize", {"capabilities": {}})
    opened = d.request("ctx/openSession", {"cwd": w.proj, "model": "claude-opus-5-5", "sessionId": "proof-own",
                                           "import": path})
    check("the daemon imports the program's transcript", "result" in opened, str(opened)[:500])
    compacted = d.request("ctx/compact", {"sessionId": "proof-own"})
    check("the daemon compacts it", "result" in compacted, str(compacted)[:500])
    d.stop()
    out = w.ctxd_cmd("export", "proof-own")
    check("ctxd exports its own compaction", out.returncode == 0, out.stderr[-800:])
    with open(path, "w") as f:
        f.write(out.stdout)
    seen = len(w.requests())
    resumed = w.claude_p("After ctxd's own compaction: MARK-PROMPT-7", resume=sid)
    check("the program resumes ctxd's own compaction", resumed.get("_rc") == 0 and not resumed.get("is_error"),
          str(resumed)[:800])
    new = w.requests()[seen:]
    if not new:
        check("a request after that resume", False)
        return
    messages = new[0]["body"]["messages"]
    flat = [" ".join(texts(m)) for m in messages]
    check("ctxd's newest summary once", sum(1 for t in flat if SUMMARY_MARK in t) == 1, json.dumps(flat)[:1500])
    repeated = repeated_messages(messages)
    check("each message once after ctxd's own compaction", not repeated, json.dumps(repeated)[:800])
    replies = [t for t in flat if "STUB-REPLY-" in t and SUMMARY_MARK not in t]
    check("the kept reply once", len(replies) == len(set(replies)) and len(replies) >= 1, json.dumps(replies)[:800])


def generated_session(w, folder, megabytes):
    """A session of about `megabytes` MB from ctxd's own generator (realistic prompts,
    tool calls and results, on the program's default model), written into the project's
    transcript folder under a new id. Returns the id and the user prompts in order."""
    gen = os.path.join(os.path.dirname(w.ctxd), "ctxd-gen-session")
    raw = os.path.join(w.work, "generated.jsonl")
    subprocess.run([gen, "--target-bytes", str(megabytes * 1_000_000), "--seed", "1", "--model", "claude-opus-5-5",
                    "--cwd", w.proj, "--out", raw], check=True)
    sid = str(uuid.uuid4())
    prompts = []
    with open(raw) as src, open(os.path.join(folder, f"{sid}.jsonl"), "w") as dst:
        generated_id = None
        for line in src:
            record = json.loads(line)
            generated_id = generated_id or record.get("sessionId")
            dst.write(line.replace(generated_id, sid))
            if record.get("type") != "user" or record.get("isMeta") or record.get("isCompactSummary"):
                continue
            content = record["message"]["content"]
            if isinstance(content, list):
                if any(b.get("type") == "tool_result" for b in content):
                    continue
                content = " ".join(b.get("text", "") for b in content if b.get("type") == "text")
            prompts.append(content)
    os.remove(raw)
    return sid, prompts


class Lsp:
    """`ctxd serve` over its stdin and stdout, as an editor client drives it."""

    def __init__(self, cmd, env, log):
        import threading
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env)
        self.replies = {}
        self.cond = threading.Condition()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        out = self.proc.stdout
        while True:
            length = None
            while True:
                header = out.readline()
                if not header:
                    return
                if header in (b"\r\n", b"\n"):
                    break
                name, _, value = header.decode().partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            message = json.loads(out.read(length))
            if "id" in message and "method" not in message:
                with self.cond:
                    self.replies[message["id"]] = message
                    self.cond.notify_all()

    def send(self, message):
        body = json.dumps(message).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def request(self, method, params, timeout=60):
        self.next_id += 1
        rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        with self.cond:
            self.cond.wait_for(lambda: rid in self.replies, timeout)
            return self.replies.get(rid, {"error": "no reply"})

    def close(self):
        try:
            self.request("shutdown", None, timeout=10)
            self.send({"jsonrpc": "2.0", "method": "exit"})
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def idle_compact(w, path):
    """The daemon observes the transcript and compacts it once it has been idle for a
    second (offline summary). Returns the seconds from observing to the compaction, or
    None when it did not happen within five minutes."""
    env = {k: v for k, v in w.env.items() if not k.startswith("ANTHROPIC_")}
    with open(os.path.join(w.work, "idle-daemon.log"), "w") as log:
        lsp = Lsp([w.ctxd, "--state-dir", os.path.join(w.work, "idle-state"), "--log-stderr", "serve"], env, log)
        try:
            settings = {"claudeIdleCompaction": True, "claudeIdleCompactAfterSeconds": 1,
                        "claudeIdleCompactPercent": 1, "provider": "offline"}
            lsp.request("initialize", {"capabilities": {}, "initializationOptions": {"settings": settings}})
            lsp.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
            before = os.path.getsize(path)
            started = time.time()
            observed = lsp.request("ctx/observe", {"transcript": path})
            if "result" not in observed:
                check("bench: the daemon observes the generated session", False, str(observed)[:500])
                return None
            # By its size: reading the file would hold it open, and the daemon leaves
            # alone a transcript another process has open.
            while time.time() - started < 300:
                if os.path.getsize(path) > before:
                    return time.time() - started
                time.sleep(0.1)
            return None
        finally:
            lsp.close()


def held_in_order(prompts, text):
    """How many of `prompts` appear in `text`, in order, by their first words."""
    held, at = 0, 0
    for prompt in prompts:
        head = prompt[:24]
        found = text.find(head, at)
        if found >= 0:
            held += 1
            at = found + len(head)
    return held


def bench(w, sid, megabytes):
    folder = os.path.dirname(w.transcript(sid))
    started = time.time()
    untouched, prompts = generated_session(w, folder, megabytes)
    path = os.path.join(folder, f"{untouched}.jsonl")
    size = os.path.getsize(path)
    print(f"bench: generated {size / 1e6:.1f} MB, {len(prompts)} user messages, in {time.time() - started:.1f} s")

    def copy(to):
        with open(path) as src, open(os.path.join(folder, f"{to}.jsonl"), "w") as dst:
            for line in src:
                dst.write(line.replace(untouched, to))

    # A copy under another id, left idle under the daemon's watch.
    twin = str(uuid.uuid4())
    copy(twin)
    twin_path = os.path.join(folder, f"{twin}.jsonl")
    idle_s = idle_compact(w, twin_path)
    check("bench: the daemon compacts the idle session in place", idle_s is not None)
    with open(twin_path, "rb") as f:
        check("bench: appended only", f.read(size) == open(path, "rb").read().replace(
            untouched.encode(), twin.encode()))
    # Once more through the provider (the stub on loopback): what the summary request
    # costs ctxd on top (the view assembled, the request built and sent).
    third = str(uuid.uuid4())
    copy(third)
    asked = len(w.requests())
    started = time.time()
    out = w.ctxd_cmd("claude", "compact", third)
    provider_s = time.time() - started
    check("bench: ctxd compacts it through the provider", out.returncode == 0 and "summary by anthropic" in out.stdout,
          out.stdout[-300:] + out.stderr[-800:])
    summary_bytes = sum(r["bytes"] for r in w.requests()[asked:])
    # The provider's summary as installed: its text, with what the fidelity check added.
    with open(os.path.join(folder, f"{third}.jsonl"), "rb") as f:
        f.seek(size)
        added = [json.loads(line) for line in f.read().splitlines() if line.strip()]
    installed = " ".join(" ".join(texts(r["message"])) for r in added if r.get("isCompactSummary"))
    provider_held = held_in_order(prompts, installed)
    print(f"bench: the provider's installed summary holds {provider_held} of {len(prompts)} user messages "
          f"({len(installed.encode()) / 1e3:.1f} KB)")
    check("bench: the provider's installed summary holds every user message", provider_held == len(prompts),
          f"{provider_held} of {len(prompts)}")
    rows = []
    for label, target in (("untouched", untouched), ("idle-compacted", twin)):
        seen = len(w.requests())
        result = w.claude_p(f"Bench {label}", resume=target)
        new = w.requests()[seen:]
        first = new[0] if new else None
        rows.append((label, result, first))
        check(f"bench: the program resumes the {label} session", result.get("_rc") == 0 and first is not None,
              str(result)[:500])
    print(f"bench: the daemon compacted the idle session {idle_s or 0:.2f} s after observing it (1 s idle wait "
          f"included); ctxd claude compact through the stub provider took {provider_s:.2f} s "
          f"({summary_bytes / 1e6:.1f} MB of summary requests)")
    for label, result, first in rows:
        if first is None:
            continue
        ttfr = first["at"] - result["_started"]
        print(f"bench: {label}: first request after {ttfr:.2f} s, {first['bytes'] / 1e3:.1f} KB, "
              f"{len(first['body']['messages'])} messages")
    compacted = rows[1][2]
    if compacted:
        check("bench: the compacted session's first request is at most 256 KB", compacted["bytes"] <= 256_000,
              f"{compacted['bytes']} bytes")
        flat = " ".join(" ".join(texts(m)) for m in compacted["body"]["messages"])
        held = held_in_order(prompts, flat)
        print(f"bench: the compacted request holds {held} of {len(prompts)} user messages (by their first words)")
        check("bench: the compacted request holds every user message", held == len(prompts),
              f"{held} of {len(prompts)}")


STATUSLINE_WRAPPER = """#!{python}
# Runs ctxd statusline on what the program pipes in; logs both as one JSON line.
import json, os, subprocess, sys
given = sys.stdin.read()
out = subprocess.run([{ctxd!r}, "statusline"], input=given, capture_output=True, text=True).stdout
sys.stdout.write(out)
fd = os.open({log!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
os.write(fd, (json.dumps({{"in": given, "out": out}}) + "\\n").encode())
os.close(fd)
"""


class Terminal:
    """The program in a pseudo-terminal, as a user runs it."""

    def __init__(self, w, cwd, home):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.chdir(cwd)
            os.execve(w.claude, [w.claude], {**w.env, "HOME": home, "TERM": "xterm-256color"})
        self.screen = b""

    def pump(self, seconds, until=lambda: False):
        end = time.time() + seconds
        while time.time() < end and not until():
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    self.screen += os.read(self.fd, 65536)
                except OSError:
                    return

    def type(self, text):
        os.write(self.fd, text.encode())
        self.pump(0.8)
        os.write(self.fd, b"\r")

    def close(self):
        os.kill(self.pid, signal.SIGTERM)
        os.waitpid(self.pid, 0)


def onboarded(w, home, proj):
    """A user who has been through the first-run screens, trusts `proj` and approved the key."""
    with open(os.path.join(home, ".claude.json"), "w") as f:
        json.dump({"hasCompletedOnboarding": True, "numStartups": 5, "theme": "dark",
                   "customApiKeyResponses": {"approved": [w.env["ANTHROPIC_API_KEY"][-20:]], "rejected": []},
                   "projects": {proj: {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}}}, f)


def plain(screen):
    """A terminal's bytes without escape sequences."""
    import re
    return re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07", "", screen.decode("utf-8", "replace"))


def setup_statusline(w):
    """Check 8: `ctxd claude setup` sets the program's status line; the program runs it and
    shows ctxd's line with its 1M window; `--undo` leaves the home as it was."""
    home = os.path.join(w.work, "home-setup")
    proj = os.path.join(w.work, "proj-setup")
    os.makedirs(home)
    os.makedirs(proj)
    onboarded(w, home, proj)
    before = sorted(os.listdir(home))
    state = os.path.join(w.work, "setup-state")
    env = {**w.env, "HOME": home}
    out = subprocess.run([w.ctxd, "--state-dir", state, "claude", "setup", "--no-shell"], env=env,
                         capture_output=True, text=True, timeout=60)
    settings = os.path.join(home, ".claude", "settings.json")
    check("setup: ctxd claude setup sets the status line", out.returncode == 0 and os.path.exists(settings),
          out.stdout + out.stderr)
    term = Terminal(w, proj, home)
    try:
        term.pump(30, until=lambda: "to compact" in plain(term.screen))
        term.type("Setup turn: say hello.")
        term.pump(60, until=lambda: "STUB-REPLY" in plain(term.screen) and "ctx 0 /" not in plain(term.screen)[-400:])
        term.pump(3)
    finally:
        term.close()
    screen = plain(term.screen)
    check("setup: the program shows ctxd's status line, with the 1M window",
          "to compact" in screen and "/ 1.00M" in screen, screen[-800:])
    out = subprocess.run([w.ctxd, "--state-dir", state, "claude", "setup", "--undo"], env=env,
                         capture_output=True, text=True, timeout=60)
    # What the program itself wrote meanwhile (its own files under ~/.claude) stays.
    settings_gone = not os.path.exists(settings)
    check("setup --undo takes the status line out", out.returncode == 0 and settings_gone,
          out.stdout + out.stderr + str(sorted(os.listdir(home))) + str(before))


def interactive_statusline(w):
    """Check 4: the program's own statusLine calls, answered by ctxd."""
    home = os.path.join(w.work, "home-tty")
    proj = os.path.join(w.work, "proj-tty")
    os.makedirs(os.path.join(home, ".claude"))
    os.makedirs(proj)
    log = os.path.join(w.work, "statusline-calls.jsonl")
    wrapper = os.path.join(w.work, "statusline-wrapper")
    with open(wrapper, "w") as f:
        f.write(STATUSLINE_WRAPPER.format(python=sys.executable, ctxd=w.ctxd, log=log))
    os.chmod(wrapper, 0o755)
    with open(os.path.join(home, ".claude", "settings.json"), "w") as f:
        json.dump({"statusLine": {"type": "command", "command": wrapper}}, f)
    onboarded(w, home, proj)

    def calls():
        if not os.path.exists(log):
            return []
        with open(log) as f:
            return [json.loads(line) for line in f if line.strip()]

    def with_usage():
        return [c for c in calls() if (json.loads(c["in"]).get("context_window") or {}).get("current_usage")]

    term = Terminal(w, proj, home)
    try:
        term.pump(20, until=lambda: len(calls()) >= 1)
        for turn in (1, 2):
            want = len(with_usage()) + 1
            term.type(f"Interactive turn {turn}: say hello.")
            term.pump(60, until=lambda: len(with_usage()) >= want)
        before = len(calls())
        term.type("/compact")
        term.pump(60, until=lambda: any("just compacted" in c["out"] for c in calls()[before:]))
        after = len(calls())
        term.type("Interactive turn 3: after the compaction.")
        term.pump(60, until=lambda: any((json.loads(c["in"]).get("context_window") or {}).get("total_input_tokens")
                                        for c in calls()[after:]))
    finally:
        term.close()
    seen = calls()
    check("interactive: the program calls ctxd statusline on every turn", len(with_usage()) >= 3,
          f"{len(seen)} calls; screen tail: {term.screen[-600:]!r}")
    wrong = []
    compacted_lines = []
    for call in seen:
        given = json.loads(call["in"])
        cw = given.get("context_window") or {}
        usage = cw.get("current_usage") or {}
        total = sum(usage.get(k, 0) for k in ("input_tokens", "cache_creation_input_tokens",
                                              "cache_read_input_tokens", "output_tokens"))
        line = call["out"].strip()
        if total == 0 and usage and "just compacted" in line:
            # Right after /compact the program sends zeros; ctxd shows what the
            # boundary kept instead.
            ok = f"/ {short(cw.get('context_window_size') or 0)}" in line and "ctx 0 /" not in line
            compacted_lines.append(line)
        else:
            ok = f"ctx {short(total)} / {short(cw.get('context_window_size') or 0)}" in line
        if cw.get("used_percentage") is not None:
            shown = float(line.split("(")[1].split("%")[0]) if "(" in line else -1
            ok = ok and abs(shown - cw["used_percentage"]) <= 1
        if not ok:
            wrong.append((cw, line))
    check("interactive: each status line shows the program's own window, usage and percentage",
          seen and not wrong, str(wrong[:3]))
    check("interactive: the status line marks the compaction", any("just compacted" in c["out"] for c in seen),
          str([c["out"] for c in seen]))
    check("interactive: right after /compact (the program's usage all zeros) the line shows what was kept, not 0",
          bool(compacted_lines), str([c["out"] for c in seen]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--claude", required=True)
    p.add_argument("--ctxd", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--bench", action="store_true")
    p.add_argument("--mb", type=int, default=100)
    args = p.parse_args()
    w = World(args)
    try:
        sid, window, results = scripted_session(w)
        if sid:
            if args.bench:
                bench(w, sid, args.mb)
            else:
                statusline_checks(w, sid, window, results)
                compact_and_resume(w, sid, results[-1].get("result") or "?")
                export_and_resume(w, sid)
                daemon_compaction_exported(w, sid)
                rewound_compact_and_resume(w)
                interactive_statusline(w)
                setup_statusline(w)
                mcp_setup.run(w, check)
                live.live_session(w, check, Lsp, texts)
                recall.run(w.claude, w.ctxd, os.path.join(w.work, "recall"), check)
                gateway.run(w, check)
                import instant  # tests/claude-code/instant.py: `/compact` answered by the gateway
                instant.run(w, check)
    finally:
        w.close()
    passed = sum(RESULTS)
    print(f"claude-code: {passed} passed, {len(RESULTS) - passed} failed")
    sys.exit(0 if passed == len(RESULTS) else 1)


if __name__ == "__main__":
    main()
