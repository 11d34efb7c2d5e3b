#!/usr/bin/env python3
"""Proof of the history search (issue 36) with the real Claude Code program.

    recall.run(claude=BIN, ctxd=BIN, work=DIR, check_with=FUNCTION)    (from prove.py)

Inside `unshare -n`, like the rest of prove.py. `ctxd mcp` is added as the program's
MCP server with `claude mcp add` (the command the README gives), and a scripted model
(a Messages API stand-in on 127.0.0.1, run on a thread here) drives it:

1. A prompt with `[[SAY:PHRASE]]` is answered with a long reply that holds PHRASE in its
   middle and RECALL-END-OF-RECORD at its end, farther from the phrase than a snippet
   reaches.
2. `/compact`: the program's own compaction (the model's summary is a canned line that
   names neither), so the phrase stands only before the compact boundary; checked on the
   transcript.
3. A prompt with `[[RECALL:PHRASE]]` is answered with a call of
   `mcp__ctxd__search_history` (before_compaction_only), its result with a call of
   `mcp__ctxd__read_history` on the first hit that is the model's reply (the prompt of
   step 1 names the phrase too), and that result with text. (Should the
   program defer the MCP tools behind its ToolSearch tool, the model first selects them
   there, as a real model must.)

Checks: the MCP server connects; the search's result reaches the model in the next
request with the phrase, the hit's uuid and `before_compaction: true`, but not the end
of the record; the read's result reaches it in the request after that with the
record's full text, end marker included.

Standard library only.
"""
import json
import os
import re
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PHRASE = "VIOLET-HERON-4471"
END = "RECALL-END-OF-RECORD"
SEARCH = "mcp__ctxd__search_history"
READ = "mcp__ctxd__read_history"


def long_reply(phrase):
    """A reply with the phrase in its middle and the end marker far after it."""
    before = " ".join(f"Opening remark {i} about the build." for i in range(40))
    after = " ".join(f"Closing remark {i} about the tests." for i in range(60))
    return f"{before} The phrase to remember is {phrase}. {after} {END}"


def blocks_of(message):
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def reply_hit(text):
    """The first hit of a search result that is the model's own reply (the prompt that
    asked for the phrase names it too)."""
    try:
        hits = json.loads(text)["hits"]
    except (ValueError, KeyError, TypeError):
        return None
    return next((h for h in hits if isinstance(h, dict) and h.get("role") == "assistant"), None)


def last_user(messages):
    """The newest user message (the program may put system messages after it)."""
    return next((m for m in reversed(messages) if m.get("role") == "user"), {})


def result_text(block):
    """The text of a tool_result block."""
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


class Model:
    """What the scripted model answers, from the request's messages."""

    def __init__(self):
        self.calls = {}  # tool_use id -> tool name
        self.n = 0

    def reply(self, body):
        """Content blocks of the reply to `body`."""
        self.n += 1
        messages = body.get("messages") or []
        last = last_user(messages)
        results = [b for b in blocks_of(last) if b.get("type") == "tool_result"]
        tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        for block in results:
            called = self.calls.get(block.get("tool_use_id"))
            if called == "ToolSearch":
                return self.search(tools | {SEARCH, READ}, messages)
            if called == SEARCH:
                hit = reply_hit(result_text(block))
                if not hit:
                    return [{"type": "text", "text": "RECALL-NO-HIT"}]
                return [self.call(READ, {"session": hit["session"], "uuid": hit["uuid"], "before": 0, "after": 0})]
            if called == READ:
                return [{"type": "text", "text": "RECALL-READ-DONE."}]
        text = " ".join(b.get("text", "") for b in blocks_of(last) if isinstance(b.get("text"), str))
        said = re.search(r"\[\[SAY:([^\]]+)\]\]", text)
        if said:
            return [{"type": "text", "text": long_reply(said.group(1))}]
        if re.search(r"\[\[RECALL:([^\]]+)\]\]", text):
            return self.search(tools, messages)
        return [{"type": "text", "text": f"RECALL-STUB-{self.n}. Done."}]

    def search(self, tools, messages):
        phrase = None
        for m in reversed(messages):
            for b in blocks_of(m):
                found = re.search(r"\[\[RECALL:([^\]]+)\]\]", b.get("text", "") if isinstance(b.get("text"), str) else "")
                if found:
                    phrase = found.group(1)
                    break
            if phrase:
                break
        if SEARCH not in tools and "ToolSearch" in tools:
            return [self.call("ToolSearch", {"query": f"select:{SEARCH},{READ}", "max_results": 5})]
        return [self.call(SEARCH, {"query": f'"{phrase}"', "before_compaction_only": True})]

    def call(self, name, arguments):
        tool_id = f"toolu_recall_{self.n:04d}"
        self.calls[tool_id] = name
        return {"type": "tool_use", "id": tool_id, "name": name, "input": arguments}


def sse(message):
    """A whole message as the Messages API streams it."""
    content = message["content"]
    shell = dict(message, content=[])
    events = [("message_start", {"type": "message_start", "message": shell})]
    for i, block in enumerate(content):
        if block["type"] == "text":
            start, delta = dict(block, text=""), {"type": "text_delta", "text": block["text"]}
        else:
            start, delta = dict(block, input={}), {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [("content_block_start", {"type": "content_block_start", "index": i, "content_block": start}),
                   ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}),
                   ("content_block_stop", {"type": "content_block_stop", "index": i})]
    events += [("message_delta", {"type": "message_delta", "usage": {"output_tokens": 8},
                                  "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None}}),
               ("message_stop", {"type": "message_stop"})]
    return "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events).encode()


def serve(model, log, log_path):
    """The scripted Messages API on a free port of 127.0.0.1; returns (server, port)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, status, kind, data):
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.send(200, "application/json", b"{}")

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            if not self.path.split("?")[0].endswith("/v1/messages") or not isinstance(body, dict):
                answer = {"input_tokens": max(1, len(raw) // 4)} if "count_tokens" in self.path else {}
                self.send(200, "application/json", json.dumps(answer).encode())
                return
            content = model.reply(body)
            log.append(body)
            with open(log_path, "a") as f:
                f.write(json.dumps({"body": body, "reply": content}) + "\n")
            stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
            message = {"id": f"msg_recall_{model.n:04d}", "type": "message", "role": "assistant",
                       "model": body.get("model", "claude-opus-5-5"), "content": content,
                       "stop_reason": stop, "stop_sequence": None,
                       "usage": {"input_tokens": max(1, len(raw) // 4), "output_tokens": 8,
                                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
            if body.get("stream"):
                self.send(200, "text/event-stream", sse(message))
            else:
                self.send(200, "application/json", json.dumps(message).encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def tool_results(body, tool_id_prefix="toolu_recall_"):
    """(tool_use_id, text) of the tool results the last message of a request carries."""
    return [(b.get("tool_use_id"), result_text(b)) for b in blocks_of(last_user(body.get("messages") or []))
            if b.get("type") == "tool_result" and str(b.get("tool_use_id", "")).startswith(tool_id_prefix)]


def run(claude, ctxd, work, check_with):
    def check(name, ok, detail=""):
        # prove.py counts the values given: a truthy list or id must count as one.
        check_with(name, bool(ok), detail)

    shutil.rmtree(work, ignore_errors=True)
    home, proj, state = (os.path.join(work, d) for d in ("home", "proj", "ctxd-state"))
    for d in (home, proj):
        os.makedirs(d)
    model, log = Model(), []
    server, port = serve(model, log, os.path.join(work, "requests.jsonl"))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
        "ANTHROPIC_API_KEY": "sk-ant-test-0000",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }

    def claude_run(*args, timeout=300):
        return subprocess.run([claude, *args], cwd=proj, env=env, capture_output=True, text=True, timeout=timeout)

    def claude_p(prompt, resume=None, extra=()):
        out = claude_run("-p", prompt, "--output-format", "json", *(["--resume", resume] if resume else []), *extra)
        try:
            return json.loads(out.stdout) | {"_rc": out.returncode}
        except ValueError:
            return {"is_error": True, "_rc": out.returncode, "raw": out.stdout[-1500:], "stderr": out.stderr[-1500:]}

    try:
        added = claude_run("mcp", "add", "ctxd", "--", ctxd, "--state-dir", state, "mcp")
        check("recall: `claude mcp add ctxd -- ctxd mcp` is accepted", added.returncode == 0,
              added.stdout[-500:] + added.stderr[-500:])
        listed = claude_run("mcp", "list", timeout=120)
        check("recall: the program connects to ctxd mcp", "ctxd" in listed.stdout and "Connected" in listed.stdout,
              listed.stdout[-800:] + listed.stderr[-500:])

        first = claude_p(f"Remember this for later: [[SAY:{PHRASE}]]")
        sid = first.get("session_id")
        check("recall: the first turn is answered", first.get("_rc") == 0 and sid, str(first)[:800])
        if not sid:
            return
        claude_p("Another turn before the compaction.", resume=sid)
        compacted = claude_p("/compact", resume=sid)
        transcript = next((os.path.join(root, f) for root, _, files in os.walk(os.path.join(home, ".claude", "projects"))
                           for f in files if f == f"{sid}.jsonl"), None)
        lines = open(transcript).read().splitlines() if transcript else []
        boundaries = [i for i, l in enumerate(lines) if '"compact_boundary"' in l]
        where = [i for i, l in enumerate(lines) if PHRASE in l]
        check("recall: the phrase stands only before the program's compact boundary",
              boundaries and where and max(where) < boundaries[-1],
              f"compact: {str(compacted)[:400]} boundaries at {boundaries}, phrase at {where}")

        seen = len(log)
        allowed = ["--allowedTools", f"{SEARCH},{READ},ToolSearch"]
        recalled = claude_p(f"What was the phrase? [[RECALL:{PHRASE}]]", resume=sid, extra=allowed)
        check("recall: the turn that searches is answered", recalled.get("_rc") == 0 and not recalled.get("is_error"),
              str(recalled)[:1500])
        bodies = log[seen:]
        searched = [(body, text) for body in bodies for tid, text in tool_results(body)
                    if model.calls.get(tid) == SEARCH]
        check("recall: the model called search_history and its result came back",
              len(searched) == 1, f"{len(bodies)} requests; calls {model.calls}")
        if searched:
            text = searched[0][1]
            hit = reply_hit(text) or {}
            check("recall: the search result carries the phrase, the record and its place before the compaction",
                  PHRASE in hit.get("snippet", "") and hit.get("before_compaction") is True and hit.get("session") == sid
                  and hit.get("role") == "assistant", text[:1500])
            check("recall: the search result is a snippet, not the whole record", END not in text, text[:1500])
        read = [text for body in bodies for tid, text in tool_results(body) if model.calls.get(tid) == READ]
        check("recall: read_history's result brings the record's full text to the model",
              len(read) == 1 and long_reply(PHRASE) in read[0] and "[before compaction]" in read[0],
              (read[0][:1500] if read else f"no read result; calls {model.calls}"))
        check("recall: the model's last word after reading", "RECALL-READ-DONE" in str(recalled.get("result")),
              str(recalled)[:800])
    finally:
        server.shutdown()
