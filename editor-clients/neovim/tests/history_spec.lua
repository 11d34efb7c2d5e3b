-- `:Ctxd history` against the real ctxd: the current directory's Claude Code session
-- (the project's real 2.1.332 transcript, with a compaction in it) searched, a hit from
-- before the compaction picked and its record read whole; nothing found and a failed
-- request each said once.
local t = require("minitest")
local ctxd = require("ctxd")
local claude = require("ctxd.claude")
local client = require("ctxd.client")
local history = require("ctxd.history")

local SESSION = "b7d55388-c9ad-4169-a8d1-459fc6bdb46f"
local fixture =
  vim.fs.normalize(test_env.plugin_root .. "/../../tests/fixtures/transcripts/claude-code-2.1.332/manual-compact.jsonl")

local scratch = vim.uv.fs_realpath(vim.fn.tempname()) or vim.fn.tempname()
vim.fn.mkdir(scratch, "p")
scratch = vim.uv.fs_realpath(scratch)
local folder = scratch .. "/proj"
local config_dir = scratch .. "/claude"
local old_cwd = vim.fn.getcwd()

--- Runs `body(done)` with vim.ui.select answering `pick(items)` and vim.notify
--- captured, until `done` is called; gives what was offered, said and done with.
local function drive(pick, body)
  local offered, said, finished, result = nil, {}, false, nil
  local select, notify = vim.ui.select, vim.notify
  vim.ui.select = function(items, opts, on_choice)
    offered = vim.tbl_map(opts.format_item, items)
    on_choice(pick(items))
  end
  vim.notify = function(msg, level)
    table.insert(said, { msg = msg, level = level })
  end
  local ok, err = pcall(function()
    body(function(r)
      finished, result = true, r
    end)
    t.wait_for("the command to finish", function()
      return finished
    end)
  end)
  vim.ui.select, vim.notify = select, notify
  if not ok then
    error(err, 0)
  end
  return offered, said, result
end

describe(":Ctxd history", function()
  it("finds what the Claude Code session read before its compaction and opens the record whole", function()
    vim.fn.mkdir(folder, "p")
    vim.fn.chdir(folder)
    vim.env.CLAUDE_CONFIG_DIR = config_dir
    local project_dir = claude.project_dir(folder)
    vim.fn.mkdir(project_dir, "p")
    vim.fn.writefile(vim.fn.readfile(fixture, "b"), project_dir .. "/" .. SESSION .. ".jsonl", "b")
    -- An earlier spec's daemon observed another directory: start afresh in this one.
    claude.reset()
    client.state.observing = false
    ctxd.setup({
      cmd = { test_env.ctxd_bin, "serve", "--state-dir", scratch .. "/state", "--log-file", scratch .. "/ctxd.log" },
      settings = { autoCompactWindow = 100000, provider = "offline" },
    })
    t.wait_for("the daemon to be ready", client.is_ready)
    t.wait_for("the Claude Code session observed", function()
      return claude.get() ~= nil
    end)
    t.eq(SESSION, history.target())
    local offered, said, buf = drive(function(items)
      return items[1]
    end, function(done)
      history.search("MARKER-BIG", done)
    end)
    t.eq({}, said)
    t.eq(1, #offered)
    t.truthy(vim.startswith(offered[1], "tool result · before compaction  [tool_result] 1 def f0(x):"), offered[1])
    local text = table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), "\n")
    t.contains(text, "(before compaction, the record found)")
    t.contains(text, "267\tdef f133(x):")
    t.eq("ctxd://history/" .. SESSION, vim.api.nvim_buf_get_name(buf):match("ctxd://history/[^/]+"))
    vim.cmd("close")
  end)

  it("asks for the words when none are given, and says when nothing is found", function()
    local input = vim.ui.input
    vim.ui.input = function(_, on_confirm)
      on_confirm("albatross")
    end
    local _, said = drive(function(items)
      return items[1]
    end, function(done)
      history.search("", done)
    end)
    vim.ui.input = input
    t.eq({ { msg = 'ctxd: nothing found for "albatross".', level = vim.log.levels.INFO } }, said)
  end)

  it("turns a failed request into one error", function()
    local _, said, buf = drive(function(items)
      return items[1]
    end, function(done)
      history.open({ sessionId = SESSION, uuid = "no-such-record" }, done)
    end)
    t.eq(nil, buf)
    t.eq(1, #said)
    t.eq(vim.log.levels.ERROR, said[1].level)
    t.truthy(vim.startswith(said[1].msg, "ctxd could not read the history record: "), said[1].msg)
  end)

  it("renders a read, the record found marked and a cut said", function()
    local lines = history.render({
      sessionId = "s",
      transcript = "/t.jsonl",
      truncated = "text cut",
      records = {
        { uuid = "a", role = "assistant", text = "call", target = false, beforeCompaction = false },
        {
          uuid = "b",
          role = "tool_result",
          text = "one\ntwo",
          target = true,
          beforeCompaction = true,
          timestamp = "T",
        },
      },
    })
    t.eq({
      "# History of s",
      "",
      "`/t.jsonl`",
      "",
      "## assistant",
      "`a`",
      "",
      "call",
      "",
      "## ▶ tool result · T",
      "`b` (before compaction, the record found)",
      "",
      "one",
      "two",
      "",
      "> text cut",
    }, lines)
  end)

  it("stops", function()
    local stopped = false
    ctxd.stop(function()
      stopped = true
    end)
    t.wait_for("the daemon to stop", function()
      return stopped
    end)
    claude.reset()
    client.state.observing = false
    vim.env.CLAUDE_CONFIG_DIR = nil
    vim.fn.chdir(old_cwd)
  end)
end)
