#!/usr/bin/env python3
"""`ctxd claude setup` adds `ctxd mcp` as the real program's user MCP server, and
`--undo` takes it out (issue 36), checked with the real Claude Code program.

    mcp_setup.run(w, check)                                   (from prove.py)
    mcp_setup.py --claude BIN --ctxd BIN --work DIR           (alone; inside `unshare -n`)

Setup must go through the program's own `claude mcp add -s user` (found on PATH) and
never write `~/.claude.json` itself. Checks, in a home of its own whose `~/.claude.json`
already holds a user MCP server of the user's:

1. after setup, the program's `claude mcp get ctxd` shows ctxd's server in the user
   scope with the command `<ctxd> mcp`, and connects to it;
2. after `--undo`, the program knows no `ctxd` server, the file's `mcpServers` member is
   exactly what it was before setup, and the other members that changed (the program's
   own bookkeeping) are printed;
3. a `ctxd` server the user added (`claude mcp add -s user ctxd -- …`) is left alone by
   setup and by `--undo`.

No model request is made; every `claude` run here stays inside the network namespace.
Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys


def run(w, check):
    home = os.path.join(w.work, "home-mcp")
    proj = os.path.join(w.work, "proj-mcp")
    bin_dir = os.path.join(w.work, "bin-mcp")
    for d in (home, proj, bin_dir):
        os.makedirs(d)
    # The program as users have it: `claude` on PATH.
    os.symlink(os.path.abspath(w.claude), os.path.join(bin_dir, "claude"))
    env = {**w.env, "HOME": home, "PATH": f"{bin_dir}:{w.env['PATH']}"}
    env = {k: v for k, v in env.items() if not k.startswith("ANTHROPIC_")}
    ctxd = os.path.realpath(w.ctxd)
    config_path = os.path.join(home, ".claude.json")
    notes = {"type": "stdio", "command": "/bin/cat", "args": [], "env": {}}
    with open(config_path, "w") as f:
        json.dump({"hasCompletedOnboarding": True, "numStartups": 5, "theme": "dark",
                   "mcpServers": {"notes": notes},
                   "projects": {proj: {"hasTrustDialogAccepted": True, "allowedTools": []}}}, f, indent=2)

    def config():
        with open(config_path) as f:
            return json.load(f)

    def claude(*args):
        return subprocess.run([w.claude, *args], cwd=proj, env=env, capture_output=True, text=True, timeout=120)

    def ctxd_setup(*args):
        # No --state-dir: the one ctxd finds by itself, so the server is plainly `<ctxd> mcp`.
        args = args or ("--no-shell",)
        return subprocess.run([ctxd, "claude", "setup", *args], cwd=proj, env=env,
                              capture_output=True, text=True, timeout=120)

    before = config()
    out = ctxd_setup()
    said = out.stdout + out.stderr
    check("mcp setup: ctxd claude setup adds its MCP server through `claude mcp add -s user`",
          out.returncode == 0 and "added `ctxd` for you in every project" in said, said[-1500:])
    got = claude("mcp", "get", "ctxd")
    shown = got.stdout + got.stderr
    check("mcp setup: the program's `claude mcp get ctxd` shows ctxd's server, user scope, `<ctxd> mcp`, connected",
          got.returncode == 0 and "Scope: User config" in shown and f"Command: {ctxd}\n" in shown
          and "Args: mcp\n" in shown and "Connected" in shown, shown[-1500:])
    entry = config().get("mcpServers", {}).get("ctxd")
    check("mcp setup: the program keeps it as a stdio server running `<ctxd> mcp`",
          entry == {"type": "stdio", "command": ctxd, "args": ["mcp"], "env": {}}, str(entry))

    out = ctxd_setup("--undo")
    said = out.stdout + out.stderr
    check("mcp setup: --undo removes it through `claude mcp remove -s user`",
          out.returncode == 0 and "removed (`claude mcp remove -s user`)" in said, said[-1500:])
    got = claude("mcp", "get", "ctxd")
    check("mcp setup: after --undo the program knows no `ctxd` server",
          got.returncode != 0 and 'No MCP server named "ctxd"' in got.stdout + got.stderr,
          (got.stdout + got.stderr)[-800:])
    after = config()
    check("mcp setup: after --undo the file's mcpServers is exactly what it was before setup",
          after.get("mcpServers") == before["mcpServers"], json.dumps(after.get("mcpServers")))
    changed = sorted(k for k in set(before) | set(after) if k != "mcpServers" and before.get(k) != after.get(k))
    print(f"info: members of ~/.claude.json the program changed between before setup and after --undo: "
          f"{changed or 'none'}", flush=True)
    # (2.1.332 drops a `theme` that is its default on its first run, with or without ctxd.)
    check("mcp setup: the user's own members are as they were (onboarding, start-ups, the project's trust)",
          all(after.get(k) == before[k] for k in ("hasCompletedOnboarding", "numStartups"))
          and after.get("projects", {}).get(proj) == before["projects"][proj],
          json.dumps({k: after.get(k) for k in changed})[:1500])

    # A `ctxd` server of the user's own: setup and --undo leave it.
    own = claude("mcp", "add", "-s", "user", "ctxd", "--", "/usr/local/bin/ctxd", "--state-dir", "/srv/mine", "mcp")
    theirs = config().get("mcpServers", {}).get("ctxd")
    out = ctxd_setup()
    said = out.stdout + out.stderr
    undone = ctxd_setup("--undo")
    kept = config().get("mcpServers", {}).get("ctxd")
    check("mcp setup: a user `ctxd` server setup did not add is left alone by setup and --undo",
          own.returncode == 0 and theirs and out.returncode == 0 and "that setup did not add" in said
          and undone.returncode == 0 and kept == theirs,
          f"{own.stderr[-300:]} {said[-800:]} {undone.stdout[-400:]} {kept}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--claude", required=True)
    p.add_argument("--ctxd", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    results = []

    def check(name, ok, detail=""):
        results.append(bool(ok))
        print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""), flush=True)

    class World:
        claude, ctxd = args.claude, args.ctxd
        work = os.path.abspath(args.work)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}

    os.makedirs(World.work, exist_ok=True)
    run(World, check)
    print(f"mcp setup: {sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
