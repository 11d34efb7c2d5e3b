#!/usr/bin/env python3
"""A local stand-in for the Anthropic Messages API, for running the real Claude Code
program against ctxd's transcripts without any network.

    stub.py PORT LOG

Listens on 127.0.0.1:PORT only. Every POST to /v1/messages is appended to LOG as one
JSON line ({"path", "body", "bytes", "at"}) and answered with a short canned reply,
streamed as server-sent events when the request asks for a stream. The reply reports
usage as the request's size in bytes / 4, so the program's own context figures move.
A user prompt that contains `[[READ:PATH]]` is answered with a call of the Read tool
on PATH (then, once its result comes back, with text), so the session reads files as
a real one does. A user prompt that contains `[[USAGE:N]]` is answered with a
usage of N input tokens, so the program's context can be put near its threshold. A
summary request in ctxd's own form (its summary system prompt)
is answered with a `<summary>` that starts with STUB-PROVIDER-SUMMARY and names the
MARK-PROMPT-n markers the request carried, as a model's summary would. Other paths get
an empty JSON object. Standard library only.

A summary request whose last message carries ctxd's own summary instruction (the
gateway's preparation fork, which keeps the session's system prompt) is answered the
same way, at once; with STUB_SLOW_COMPACT=N in the environment, the program's own
compaction request (its instruction appended) is answered so too, after N seconds, as a
model takes its time to write a summary.
"""
import os
import re
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
LOG = sys.argv[2]
COUNT = [0]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._json(200, {})

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        at = time.time()
        path = self.path.split("?")[0]
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not path.endswith("/v1/messages") or not isinstance(body, dict):
            if path.endswith("/count_tokens"):
                self._json(200, {"input_tokens": max(1, length // 4)})
            else:
                self._json(200, {})
            return
        with open(LOG, "a") as f:
            f.write(json.dumps({"path": path, "body": body, "bytes": length, "at": at}) + "\n")
        COUNT[0] += 1
        n = COUNT[0]
        text = f"STUB-REPLY-{n}. Done."
        if is_program_compaction(body):
            time.sleep(float(os.environ.get("STUB_SLOW_COMPACT") or 0))
        if is_ctxd_summary_request(body) or is_ctxd_fork(body) or is_program_compaction(body):
            marks = sorted(set(re.findall(r"MARK-PROMPT-\d+", json.dumps(body.get("messages")))))
            text = ("<analysis>stub</analysis><summary>1. Primary Request and Intent:\n"
                    f"   STUB-PROVIDER-SUMMARY of the prompts {', '.join(marks)}.\n</summary>")
        read = wants_read(body.get("messages") or [])
        usage = {"input_tokens": asked_usage(body.get("messages") or []) or max(1, length // 4), "output_tokens": 8,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        message = {"id": f"msg_stub_{n:04d}", "type": "message", "role": "assistant",
                   "model": body.get("model", "claude-opus-5-5"), "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": usage}
        if read:
            call = {"type": "tool_use", "id": f"toolu_stub_{n:04d}", "name": "Read", "input": {"file_path": read}}
            if not body.get("stream"):
                message["content"] = [call]
                message["stop_reason"] = "tool_use"
                self._json(200, message)
                return
            events = [
                ("message_start", {"type": "message_start", "message": message}),
                ("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {**call, "input": {}}}),
                ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                         "delta": {"type": "input_json_delta",
                                                   "partial_json": json.dumps(call["input"])}}),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                ("message_delta", {"type": "message_delta",
                                   "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                   "usage": {"output_tokens": 8}}),
                ("message_stop", {"type": "message_stop"}),
            ]
            self._events(events)
            return
        if not body.get("stream"):
            message["content"] = [{"type": "text", "text": text}]
            message["stop_reason"] = "end_turn"
            self._json(200, message)
            return
        events = [
            ("message_start", {"type": "message_start", "message": message}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": text}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                               "usage": {"output_tokens": 8}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        self._events(events)

    def _events(self, events):
        data = "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events).encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


CTXD_SUMMARY_SYSTEM = "You write handoff summaries of software engineering sessions"


def is_ctxd_summary_request(body):
    """ctxd's summary request carries its own system prompt (the program's own
    `/compact` does not), so the program's requests keep their canned replies."""
    system = body.get("system")
    blocks = system if isinstance(system, list) else [{"text": system or ""}]
    return any(isinstance(b, dict) and CTXD_SUMMARY_SYSTEM in str(b.get("text", "")) for b in blocks)


CTXD_FORK_INSTRUCTION = "This conversation is about to be replaced by a written summary"
PROGRAM_INSTRUCTION = "CRITICAL: Respond with TEXT ONLY"


def last_texts(body):
    """The text blocks of the request's last message."""
    messages = body.get("messages") or [{}]
    content = messages[-1].get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
    return [b.get("text", "") for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)]


def is_ctxd_fork(body):
    return any(CTXD_FORK_INSTRUCTION in t for t in last_texts(body))


def is_program_compaction(body):
    return os.environ.get("STUB_SLOW_COMPACT") is not None and any(
        t.lstrip().startswith(PROGRAM_INSTRUCTION) for t in last_texts(body))


def asked_usage(messages):
    """The N of a `[[USAGE:N]]` in the messages since the last assistant message (the
    program may put a message of its own context after the prompt), else None."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return None
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"text": content or ""}]
        for b in blocks:
            if isinstance(b, dict) and isinstance(b.get("text"), str):
                found = re.search(r"\[\[USAGE:(\d+)\]\]", b["text"])
                if found:
                    return int(found.group(1))
    return None


def wants_read(messages):
    """The path a `[[READ:PATH]]` in the last user prompt asks for, unless the last
    message already brings a tool result (the read is done)."""
    if not messages:
        return None
    last = messages[-1]
    content = last.get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
    if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks):
        return None
    for b in reversed(blocks):
        if isinstance(b, dict) and isinstance(b.get("text"), str):
            found = re.search(r"\[\[READ:([^\]]+)\]\]", b["text"])
            if found:
                return found.group(1)
    return None


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
