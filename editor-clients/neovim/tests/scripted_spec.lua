-- The plugin against a scripted server (tests/fake_server.lua), for answers the real
-- daemon does not give: an older daemon without ctx/context or ctx/setAutoCompactWindow,
-- and a ctx/context answer with every section (read files changed, problems).
local t = require("minitest")
local ctxd = require("ctxd")
local client = require("ctxd.client")
local render = require("ctxd.render")
local sessions = require("ctxd.sessions")
local fake_server = require("fake_server")

local cases = vim.json.decode(table.concat(vim.fn.readfile(test_env.fixtures .. "/render-cases.json"), "\n"))
local MODEL = "claude-sonnet-4-5-20250929"

local function usage_at(level)
  for _, c in ipairs(cases.usageCases) do
    if c.usage.level == level then
      return c.usage
    end
  end
end

local function request(method, params)
  local done, err, result = false, nil, nil
  ctxd.request(method, params, function(e, r)
    done, err, result = true, e, r
  end)
  t.wait_for(method .. " to answer", function()
    return done
  end)
  return err, result
end

local function float_buffer()
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_config(win).relative ~= "" then
      return vim.api.nvim_win_get_buf(win)
    end
  end
end

local function methods(fake)
  return vim.tbl_map(function(m)
    return m.method
  end, fake.sent)
end

--- Starts the plugin on a scripted server with `answers` and opens session s-1.
local function start(answers)
  local stopped = false
  ctxd.stop(function()
    stopped = true
  end)
  t.wait_for("the previous daemon to stop", function()
    return stopped
  end)
  sessions.reset()
  answers["ctx/openSession"] = answers["ctx/openSession"]
    or function(p)
      return { sessionId = p.sessionId or "s-1", resumed = false, records = 0, usage = usage_at("warning") }
    end
  local fake = fake_server.new(answers)
  ctxd.setup({
    cmd = fake.cmd,
    observe_claude_code = false,
    restart = { initial_ms = 60000, max_ms = 60000, stable_ms = 60000 },
  })
  t.wait_for("the scripted server to be ready", client.is_ready)
  t.eq(nil, (request("ctx/openSession", { cwd = "/w", model = MODEL })))
  return fake
end

local function stop()
  local buf = float_buffer()
  if buf then
    vim.api.nvim_win_close(vim.fn.bufwinid(buf), true)
  end
  local stopped = false
  ctxd.stop(function()
    stopped = true
  end)
  t.wait_for("the scripted server to stop", function()
    return stopped
  end)
  sessions.reset()
end

describe("ctxd against a scripted daemon", function()
  after_each(stop)

  it(":Ctxd undo on a Claude Code session gives the token figures when the answer has them", function()
    local undone = { transcript = "", offset = 10, removedBytes = 5 }
    start({
      ["ctx/claudeUndo"] = function(p)
        return vim.tbl_extend("force", undone, { transcript = p.transcript })
      end,
    })
    -- No agent plugin's session: the command acts on the Claude Code session shown.
    sessions.reset()
    local claude = require("ctxd.claude")
    claude.reset()
    local folder = vim.fn.tempname()
    vim.fn.mkdir(folder, "p")
    local project = claude.project_dir(folder)
    vim.fn.mkdir(project, "p")
    local transcript = project .. "/t.jsonl"
    vim.fn.writefile({}, transcript)
    claude.observe(function(_, _, callback)
      callback(nil, { sessionId = claude.observe_id(transcript), usage = usage_at("ok") })
    end, folder)
    t.eq(transcript, claude.get().transcript)
    local function undo()
      local seen, done = {}, false
      local notify = vim.notify
      vim.notify = function(msg, level)
        table.insert(seen, { msg = msg, level = level })
      end
      local ok, err = pcall(function()
        require("ctxd.commands").undo_compact(function()
          done = true
        end)
        t.wait_for("the answer", function()
          return done
        end)
      end)
      vim.notify = notify
      t.truthy(ok, err)
      return seen
    end
    undone.preTokens, undone.postTokens = 12000, 110700
    t.eq({
      {
        msg = "ctxd: the Claude Code session's last compaction is undone: 12,000 → 110,700 tokens; the transcript is as it was before it",
        level = vim.log.levels.INFO,
      },
    }, undo())
    -- An answer without them (today's daemon) says what happened all the same.
    undone.preTokens, undone.postTokens = nil, nil
    t.eq({
      {
        msg = "ctxd: the Claude Code session's last compaction is undone; the transcript is as it was before it",
        level = vim.log.levels.INFO,
      },
    }, undo())
    claude.reset()
  end)

  it(":CtxdContext falls back to the ctx/usage breakdown and says why (a daemon without ctx/context)", function()
    local warning = usage_at("warning")
    local fake = start({
      ["ctx/usage"] = function(p)
        return { sessionId = p.sessionId, usage = warning }
      end,
    })
    vim.cmd("CtxdContext")
    local buf = t.wait_for("the context float", float_buffer)
    local lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
    local note = require("ctxd.commands").OLD_DAEMON_NOTE
    t.eq(note, lines[3])
    t.eq("ctx 50.1% · 16.9k to compact", lines[5])
    t.eq(render.context_lines("s-1", { usage = warning }, note), lines)
    t.truthy(vim.tbl_contains(lines, "  Free space              16,940"), vim.inspect(lines))
    t.truthy(not vim.tbl_contains(lines, "Memory files"))
    t.eq({ "initialize", "ctx/openSession", "ctx/context", "ctx/usage" }, methods(fake))
    -- It redraws from the pushed usage, without asking for ctx/context again.
    fake.notify("ctx/usageChanged", { sessionId = "s-1", usage = usage_at("blocked") })
    t.wait_for("the float at the blocked level", function()
      return vim.api.nvim_buf_get_lines(buf, 4, 5, false)[1] == "ctx 89.3% · blocked"
    end)
    t.eq(note, vim.api.nvim_buf_get_lines(buf, 2, 3, false)[1])
    t.eq({ "initialize", "ctx/openSession", "ctx/context", "ctx/usage" }, methods(fake))
  end)

  it(":CtxdContext shows every section of a ctx/context answer and asks again on ctx/contextChanged", function()
    local context = vim.deepcopy(cases.contextCase.context)
    local fake = start({
      ["ctx/context"] = function()
        return context
      end,
    })
    vim.cmd("CtxdContext")
    local buf = t.wait_for("the context float", float_buffer)
    local lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
    t.eq(render.context_lines("s-1", context), lines)
    for _, expected in ipairs({
      "  /home/dev/project/CLAUDE.md              project  1,428  loaded",
      "  /home/dev/project/.claude/rules/rust.md  rule     236    waiting",
      "  /home/dev/project/.claude/rules/rust.md  src/**/*.rs, daemon/**/*.rs",
      "  Git snapshot        yes",
      "Changed since read",
      "  /home/dev/project/src/lib.rs",
      "Problems",
      "  /home/dev/project/CLAUDE.md: @docs/missing.md: no such file",
    }) do
      t.truthy(vim.tbl_contains(lines, expected), expected .. " in " .. vim.inspect(lines))
    end
    -- Another session's change is not this float's; its own is asked for again.
    local asked = #fake.sent
    fake.notify("ctx/contextChanged", { sessionId = "other", paths = { "/elsewhere/CLAUDE.md" } })
    context = vim.deepcopy(context)
    context.memoryFiles[2].tokens = 2000
    context.staleFiles = {}
    fake.notify("ctx/contextChanged", { sessionId = "s-1", paths = { "/home/dev/project/CLAUDE.md" } })
    t.wait_for("the float with the new answer", function()
      return vim.tbl_contains(
        vim.api.nvim_buf_get_lines(buf, 0, -1, false),
        "  /home/dev/project/CLAUDE.md              project  2,000  loaded"
      )
    end)
    t.eq(asked + 1, #fake.sent, "one more ctx/context")
    t.truthy(not vim.tbl_contains(vim.api.nvim_buf_get_lines(buf, 0, -1, false), "Changed since read"))
  end)

  it(":CtxdContext shows a failing ctx/context as an error", function()
    start({
      ["ctx/context"] = function(p)
        error({ code = -33007, message = string.format("session %q closed before answering", p.sessionId) })
      end,
    })
    local seen = {}
    local original = vim.notify
    vim.notify = function(msg, level)
      table.insert(seen, { msg = msg, level = level })
    end
    local ok, err = pcall(function()
      vim.cmd("CtxdContext")
      t.wait_for("a notification", function()
        return #seen > 0
      end)
    end)
    vim.notify = original
    if not ok then
      error(err, 0)
    end
    t.eq(nil, float_buffer())
    t.eq({ { msg = "ctxd could not show the context: the session was closed.", level = vim.log.levels.ERROR } }, seen)
  end)

  it(":CtxdAutoCompactWindow shows -32601 from a daemon without it", function()
    local fake = start({})
    local seen = {}
    local original = vim.notify
    vim.notify = function(msg, level)
      table.insert(seen, { msg = msg, level = level })
    end
    local ok, err = pcall(function()
      vim.cmd("CtxdAutoCompactWindow 1.5m")
      t.wait_for("a notification", function()
        return #seen > 0
      end)
    end)
    vim.notify = original
    if not ok then
      error(err, 0)
    end
    t.eq({ method = "ctx/setAutoCompactWindow", params = { model = MODEL, window = 1500000 } }, fake.sent[#fake.sent])
    t.eq(vim.log.levels.ERROR, seen[1].level)
    t.eq("ctxd could not save the auto-compact window: this ctxd is too old to do that. Update ctxd.", seen[1].msg)
  end)
end)
