-- The plugin against the real ctxd binary: sessions, the statusline fed by
-- ctx/usageChanged, the commands, :checkhealth, and a daemon crash and restart.
local t = require("minitest")
local ctxd = require("ctxd")
local client = require("ctxd.client")
local records = require("records")

local MODEL = "claude-sonnet-4-5-20250929"
local state_dir = vim.fn.tempname()
vim.fn.mkdir(state_dir, "p")
local log_file = state_dir .. "/ctxd.log"

--- Calls `ctxd.request` and waits for its answer.
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

--- Captures vim.notify while `body` runs and until `until_probe` sees a message.
local function notifications(body, until_probe)
  local seen = {}
  local original = vim.notify
  vim.notify = function(msg, level)
    table.insert(seen, { msg = msg, level = level })
  end
  local ok, err = pcall(function()
    body()
    t.wait_for("a notification", function()
      return until_probe(seen)
    end)
  end)
  vim.notify = original
  if not ok then
    error(err, 0)
  end
  return seen
end

local function float_buffers()
  local bufs = {}
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_config(win).relative ~= "" then
      table.insert(bufs, vim.api.nvim_win_get_buf(win))
    end
  end
  return bufs
end

local session_id
local last_uuid

describe("ctxd on a real daemon", function()
  it("starts the daemon with setup()", function()
    t.truthy(vim.fn.executable(test_env.ctxd_bin) == 1, "no ctxd at " .. test_env.ctxd_bin .. " (set CTXD_BIN)")
    ctxd.setup({
      cmd = { test_env.ctxd_bin, "serve", "--state-dir", state_dir, "--log-file", log_file },
      settings = { autoCompactWindow = 100000 },
    })
    t.wait_for("the daemon to be ready", client.is_ready)
    t.eq("ctxd", vim.lsp.get_client_by_id(client.state.client_id).name)
    t.eq("0.1.0", client.state.capabilities.version)
    t.truthy(ctxd.pid(), "the daemon's pid")
    t.eq("", ctxd.status(), "no session yet")
  end)

  it("opens a session; the statusline shows its usage", function()
    local err, result = request("ctx/openSession", { cwd = vim.fn.getcwd(), model = MODEL })
    t.eq(nil, err)
    session_id = result.sessionId
    t.eq(100000, result.usage.window, "settings reached the daemon")
    t.eq("ctx 0.0% · 67.0k to compact", ctxd.status())
    t.eq("%#CtxdOk#ctx 0.0%% · 67.0k to compact%*", ctxd.statusline())
  end)

  it("follows ctx/usageChanged after an append", function()
    local user = records.user("hello")
    local assistant = records.assistant(50060, user.uuid)
    last_uuid = assistant.uuid
    local err, result = request("ctx/append", { sessionId = session_id, records = { user, assistant } })
    t.eq(nil, err)
    t.eq(2, result.appended)
    t.wait_for("the statusline at 62.6%", function()
      return ctxd.status() == "ctx 62.6% · 16.9k to compact"
    end)
    t.eq("CtxdWarning", ctxd.status_highlight())
    t.eq("%#CtxdWarning#ctx 62.6%% · 16.9k to compact%*", ctxd.statusline())
  end)

  it("fires User CtxdUsageChanged with the usage", function()
    local seen
    vim.api.nvim_create_autocmd("User", {
      pattern = "CtxdUsageChanged",
      once = true,
      callback = function(ev)
        seen = ev.data
      end,
    })
    local user = records.user("more", last_uuid)
    last_uuid = user.uuid
    request("ctx/append", { sessionId = session_id, records = { user } })
    t.wait_for("the autocmd", function()
      return seen
    end)
    t.eq(session_id, seen.sessionId)
    t.truthy(seen.usage.tokens > 50060)
  end)

  it(":CtxdContext shows the breakdown the daemon gives in a float", function()
    local _, usage_result = request("ctx/usage", { sessionId = session_id })
    local u = usage_result.usage
    vim.cmd("CtxdContext")
    local buf = t.wait_for("the context float", function()
      return float_buffers()[1]
    end)
    t.eq("ctxd-context", vim.bo[buf].filetype)
    local lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
    local render = require("ctxd.render")
    t.eq("ctxd context: " .. session_id, lines[1])
    -- Until the daemon has ctx/context, the float says so and shows ctx/usage.
    t.eq("This ctxd has no ctx/context yet; the breakdown is from ctx/usage.", lines[3])
    t.eq(render.status_text(u), lines[5])
    t.eq(string.format("  Window            %s (effective %s)", render.format_count(u.window), render.format_count(u.effectiveWindow)), lines[10])
    t.truthy(vim.tbl_contains(lines, "Breakdown"))
    t.truthy(vim.tbl_contains(lines, "  Free space              " .. render.format_count(u.breakdown.freeSpace)), vim.inspect(lines))
    t.truthy(vim.tbl_contains(lines, "  Autocompact buffer      33,000"), vim.inspect(lines))
    t.eq(render.context_lines(session_id, { usage = u }, lines[3]), lines)
    vim.api.nvim_win_close(vim.fn.bufwinid(buf), true)
  end)

  it(":CtxdCompact shows -32601 as an error and keeps working", function()
    local seen = notifications(function()
      vim.cmd("CtxdCompact keep the failing test output")
    end, function(seen)
      return #seen > 0
    end)
    t.eq(vim.log.levels.ERROR, seen[1].level)
    t.contains(seen[1].msg, "ctxd does not support ctx/compact yet (error -32601: ")
    local err = request("ctx/usage", { sessionId = session_id })
    t.eq(nil, err, "the daemon still answers")
  end)

  it("request() hands back the daemon's error for methods it does not have", function()
    for _, call in ipairs({
      { "ctx/clear", { sessionId = session_id } },
      { "ctx/setAutoCompactWindow", { model = MODEL, window = 200000 } },
      { "ctx/context", { sessionId = session_id } },
    }) do
      local err = request(call[1], call[2])
      if err then
        t.eq(-32601, err.code, call[1])
      end
    end
    t.eq(1, #ctxd.sessions(), "the session is kept")
  end)

  it(":CtxdLog opens the daemon's log", function()
    vim.cmd("CtxdLog")
    t.eq(log_file, vim.api.nvim_buf_get_name(0))
    local text = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
    t.contains(text, "ctxd starting")
    vim.cmd("close")
  end)

  it(":checkhealth ctxd reports the running daemon", function()
    vim.cmd("checkhealth ctxd")
    local text = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
    t.contains(text, "running (pid " .. ctxd.pid() .. "), ctxd 0.1.0, protocol 1")
    t.contains(text, "daemon command: " .. test_env.ctxd_bin)
    t.contains(text, session_id)
    vim.cmd("tabclose")
  end)

  it("restarts a crashed daemon; the statusline updates again", function()
    local before = ctxd.status()
    local old_pid = ctxd.pid()
    vim.uv.kill(old_pid, "sigkill")
    -- A request made as the daemon dies is answered: by the restarted daemon, or with an error.
    local answered = false
    ctxd.request("ctx/usage", { sessionId = session_id }, function()
      answered = true
    end)
    t.wait_for("the statusline to say the daemon is down", function()
      return ctxd.status() == "ctxd restarting"
    end)
    t.wait_for("a new daemon", function()
      return client.is_ready() and ctxd.pid() ~= nil and ctxd.pid() ~= old_pid
    end)
    t.eq(before, ctxd.status(), "the session resumed with its usage")
    t.wait_for("the request made during the crash to be answered", function()
      return answered
    end)
    local user = records.user("after the crash", last_uuid)
    local assistant = records.assistant(60000, user.uuid)
    local err = request("ctx/append", { sessionId = session_id, records = { user, assistant } })
    t.eq(nil, err)
    t.wait_for("the statusline at 75.0%", function()
      return ctxd.status() == "ctx 75.0% · 7.0k to compact"
    end)
  end)

  it("closes the session; the statusline empties", function()
    local err = request("ctx/closeSession", { sessionId = session_id })
    t.eq(nil, err)
    t.eq("", ctxd.status())
  end)
end)

describe("ctxd that cannot start", function()
  it("answers queued requests with an error instead of leaving them waiting", function()
    local stopped = false
    ctxd.stop(function()
      stopped = true
    end)
    t.wait_for("the daemon to stop", function()
      return stopped
    end)
    ctxd.setup({ cmd = { "/bin/false" }, restart = { initial_ms = 60000, max_ms = 60000, stable_ms = 60000 } })
    local err = request("ctx/usage", { sessionId = "nope" })
    t.contains(err.message, "ctxd could not start")
    ctxd.stop()
  end)
end)
