-- The plugin against the real ctxd binary: sessions, the statusline fed by
-- ctx/usageChanged, the context float fed by ctx/context and ctx/contextChanged, saved
-- windows, compaction (manual, automatic, and the breaker's ctx/compactFailed), the
-- commands, :checkhealth, and a daemon crash and restart.
local t = require("minitest")
local ctxd = require("ctxd")
local client = require("ctxd.client")
local records = require("records")
local render = require("ctxd.render")

local MODEL = "claude-sonnet-4-5-20250929"
local state_dir = vim.fn.tempname()
-- A working directory with no memory files and no git repository: a session opened in
-- it starts at 0 tokens (a real project's base context counts from the start).
local empty_cwd = vim.fn.tempname()
vim.fn.mkdir(empty_cwd, "p")
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

--- A throwaway project for a session's cwd: a memory file, a rule waiting for a read of
--- src/**/*.rs, and a plain file to read.
local function make_project()
  local dir = vim.fn.tempname()
  vim.fn.mkdir(dir .. "/.claude/rules", "p")
  dir = vim.uv.fs_realpath(dir)
  local project = {
    dir = dir,
    claude_md = dir .. "/CLAUDE.md",
    rule = dir .. "/.claude/rules/rust.md",
    notes = dir .. "/notes.txt",
  }
  vim.fn.writefile({ "# Project", "", "Run the tests before every commit." }, project.claude_md)
  vim.fn.writefile({ "---", 'paths: "src/**/*.rs"', "---", "Use `thiserror` for error types." }, project.rule)
  vim.fn.writefile({ "one", "two", "three" }, project.notes)
  return project
end

--- Replaces a file's content at once (write, then rename), as editors save.
local function write_atomically(path, lines)
  vim.fn.writefile(lines, path .. ".tmp")
  assert(vim.uv.fs_rename(path .. ".tmp", path))
end

--- The float line of a memory file or a pending rule, split into its columns.
local function row_of(lines, path)
  for _, line in ipairs(lines or {}) do
    if vim.startswith(line, "  " .. path .. " ") then
      return vim.split(vim.trim(line), "%s%s+")
    end
  end
end

--- The lines under a heading of the float (e.g. "Memory files"), up to the next blank line.
local function section(lines, heading)
  for i, line in ipairs(lines) do
    if line == heading then
      local rows = {}
      for j = i + 1, #lines do
        if lines[j] == "" then
          break
        end
        table.insert(rows, lines[j])
      end
      return rows
    end
  end
end

--- Runs `body`, then waits for a User autocmd `pattern` whose data passes `accept`.
local function user_event(pattern, body, accept)
  local seen
  local id = vim.api.nvim_create_autocmd("User", {
    pattern = pattern,
    callback = function(ev)
      if not seen and (not accept or accept(ev.data)) then
        seen = ev.data
      end
    end,
  })
  local ok, err = pcall(function()
    body()
    t.wait_for("User " .. pattern, function()
      return seen
    end)
  end)
  vim.api.nvim_del_autocmd(id)
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

--- Closes every session the plugin has open: each case opens its own.
local function close_all_sessions()
  for _, s in ipairs(ctxd.sessions()) do
    t.eq(nil, (request("ctx/closeSession", { sessionId = s.session_id })), "closing " .. s.session_id)
  end
  t.eq({}, ctxd.sessions(), "no session left open")
end

local function is_current(id)
  local current = require("ctxd.sessions").get()
  return current ~= nil and current.session_id == id
end

--- A session of the calling case's own in an empty directory, made the current one;
--- when `tokens` is given, a turn whose reply reported `tokens` is appended and the
--- statusline shows it. Returns the session's id and the uuid of its last record.
local function open_session(tokens)
  local err, opened = request("ctx/openSession", { cwd = empty_cwd, model = MODEL })
  t.eq(nil, err)
  local id = opened.sessionId
  t.wait_for("the new session to be the current one", function()
    return is_current(id)
  end)
  if not tokens then
    return id
  end
  local user = records.user("hello")
  local assistant = records.assistant(tokens, user.uuid)
  t.eq(nil, (request("ctx/append", { sessionId = id, records = { user, assistant } })))
  t.wait_for("the statusline at " .. tokens .. " tokens", function()
    local s = require("ctxd.sessions").get(id)
    return s and s.usage and s.usage.tokens == tokens and ctxd.status() == render.status_text(s.usage)
  end)
  return id, assistant.uuid
end

--- A project session of the calling case's own with its context float open: returns the
--- project, the session's id and the float's buffer.
local function context_float()
  local project = make_project()
  local err, opened = request("ctx/openSession", { cwd = project.dir, model = MODEL })
  t.eq(nil, err)
  local id = opened.sessionId
  t.wait_for("the project session to be the current one", function()
    return is_current(id)
  end)
  vim.cmd("CtxdContext")
  local buf = t.wait_for("the context float", function()
    return float_buffers()[1]
  end)
  return project, id, buf
end

local function start_daemon()
  ctxd.setup({
    cmd = { test_env.ctxd_bin, "serve", "--state-dir", state_dir, "--log-file", log_file },
    -- The offline summarizer: compactions never reach a provider, whatever the environment.
    settings = { autoCompactWindow = 100000, provider = "offline" },
    -- Hermetic: no Claude Code session of the directory the tests run in.
    observe_claude_code = false,
  })
  t.wait_for("the daemon to be ready", client.is_ready)
end

describe("ctxd starting on a real daemon", function()
  it("starts the daemon with setup()", function()
    t.truthy(vim.fn.executable(test_env.ctxd_bin) == 1, "no ctxd at " .. test_env.ctxd_bin .. " (set CTXD_BIN)")
    start_daemon()
    t.eq("ctxd", vim.lsp.get_client_by_id(client.state.client_id).name)
    t.eq("0.1.0", client.state.capabilities.version)
    -- The pid the daemon announced is the process Neovim started.
    local pid = t.truthy(ctxd.pid(), "the daemon's pid")
    t.eq(client.state.capabilities.processId, pid)
    t.truthy(vim.tbl_contains(vim.api.nvim_get_proc_children(vim.fn.getpid()), pid), "a child of Neovim")
    t.eq(vim.fs.basename(test_env.ctxd_bin):sub(1, 15), vim.api.nvim_get_proc(pid).name)
    t.eq("", ctxd.status(), "no session yet")
  end)
end)

-- Each case opens the sessions it needs and leaves none open: one case's failure or
-- absence changes no other's start. The daemon is the one setup() started (started
-- again here when it is not running, e.g. when a case is run on its own).
describe("ctxd on a real daemon", function()
  before_each(function()
    if not client.state.client_id then
      start_daemon()
    end
    t.wait_for("the daemon to be ready", client.is_ready)
    t.eq({}, ctxd.sessions(), "no session open before the case")
  end)
  after_each(function()
    for _, win in ipairs(vim.api.nvim_list_wins()) do
      if vim.api.nvim_win_get_config(win).relative ~= "" then
        vim.api.nvim_win_close(win, true)
      end
    end
    close_all_sessions()
  end)

  it("opens a session; the statusline shows its usage", function()
    local err, result = request("ctx/openSession", { cwd = empty_cwd, model = MODEL })
    t.eq(nil, err)
    t.eq(100000, result.usage.window, "settings reached the daemon")
    t.wait_for("the session to be the current one", function()
      return is_current(result.sessionId)
    end)
    t.eq("ctx 0.0% · 67.0k to compact", ctxd.status())
    t.eq("%#CtxdOk#ctx 0.0%% · 67.0k to compact%*", ctxd.statusline())
  end)

  it("follows ctx/usageChanged after an append", function()
    local session_id = open_session()
    local user = records.user("hello")
    local assistant = records.assistant(50060, user.uuid)
    local err, result = request("ctx/append", { sessionId = session_id, records = { user, assistant } })
    t.eq(nil, err)
    t.eq(2, result.appended)
    t.wait_for("the statusline at 50.1%", function()
      return ctxd.status() == "ctx 50.1% · 16.9k to compact"
    end)
    t.eq("CtxdWarning", ctxd.status_highlight())
    t.eq("%#CtxdWarning#ctx 50.1%% · 16.9k to compact%*", ctxd.statusline())
  end)

  it("fires User CtxdUsageChanged with the usage", function()
    local session_id, last_uuid = open_session(50060)
    local seen = user_event("CtxdUsageChanged", function()
      request("ctx/append", { sessionId = session_id, records = { records.user("more", last_uuid) } })
    end, function(data)
      return data.usage.tokens > 50060
    end)
    t.eq(session_id, seen.sessionId)
    t.truthy(seen.usage.tokens > 50060)
  end)

  it(":CtxdContext shows ctx/context in a float: memory files with their sizes, the waiting rule", function()
    local project, project_id, buf = context_float()
    t.eq("ctxd-context", vim.bo[buf].filetype)
    local lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
    local _, context = request("ctx/context", { sessionId = project_id })
    t.eq(render.context_lines(project_id, context), lines)
    t.eq("ctxd context: " .. project_id, lines[1])
    t.eq(render.status_text(context.usage), lines[3], "no note")
    local function file(path)
      for _, f in ipairs(context.memoryFiles) do
        if f.path == path then
          return f
        end
      end
    end
    local claude_md = file(project.claude_md)
    t.truthy(claude_md and claude_md.tokens > 0, vim.inspect(context.memoryFiles))
    t.eq(
      { project.claude_md, "project", render.format_count(claude_md.tokens), "loaded" },
      row_of(section(lines, "Memory files"), project.claude_md)
    )
    local rule = t.truthy(file(project.rule), vim.inspect(context.memoryFiles))
    t.eq(
      { project.rule, "rule", render.format_count(rule.tokens), "waiting" },
      row_of(section(lines, "Memory files"), project.rule)
    )
    t.eq({ project.rule, "src/**/*.rs" }, row_of(section(lines, "Pending rules"), project.rule))
    t.eq(
      { "  Files read          0", "  Changed since read  0", "  Git snapshot        no" },
      section(lines, "Files and git")
    )
  end)

  it("the float follows ctx/contextChanged (files changed on disk) and ctx/usageChanged", function()
    local project, project_id, buf = context_float()
    local err, read =
      request("ctx/fileRead", { sessionId = project_id, path = project.notes, startLine = 2, numLines = 1 })
    t.eq(nil, err)
    t.eq({ false, 1, 2, 1, 3 }, { read.alreadyRead, read.reads, read.startLine, read.numLines, read.totalLines })
    local paths = {}
    user_event("CtxdContextChanged", function()
      write_atomically(project.notes, { "uno", "dos", "tres" })
      write_atomically(project.claude_md, { "# Project", "", string.rep("Run the tests before every commit. ", 40) })
    end, function(data)
      if data.sessionId == project_id then
        vim.list_extend(paths, data.paths)
      end
      return vim.tbl_contains(paths, project.notes) and vim.tbl_contains(paths, project.claude_md)
    end)
    -- The daemon's state once both changes are in; the float asked again after each
    -- notification, so it ends on that state too.
    local function settled(c)
      for _, f in ipairs(c.memoryFiles) do
        if f.path == project.claude_md and f.tokens > 100 and type(c.staleFiles) == "table" and #c.staleFiles > 0 then
          return true
        end
      end
    end
    local context
    local deadline = vim.uv.now() + 10000
    repeat
      local _, c = request("ctx/context", { sessionId = project_id })
      if settled(c) then
        context = c
      else
        vim.wait(50)
      end
    until context or vim.uv.now() > deadline
    t.truthy(context, "the daemon's context after the changes")
    t.eq({ project.notes }, context.staleFiles)
    t.wait_for("the float to show the new state", function()
      return vim.deep_equal(render.context_lines(project_id, context), vim.api.nvim_buf_get_lines(buf, 0, -1, false))
    end)
    local lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
    t.eq({ "  " .. project.notes }, section(lines, "Changed since read"))
    t.eq("  Files read          1", section(lines, "Files and git")[1])
    -- A new usage: the float takes it from ctx/context again (memory files on their own line).
    local user = records.user("in the project")
    request("ctx/append", { sessionId = project_id, records = { user, records.assistant(10000, user.uuid) } })
    t.wait_for("the float at 10,000 tokens", function()
      return vim.api.nvim_buf_get_lines(buf, 2, 3, false)[1] == "ctx 10.0% · 57.0k to compact"
    end)
    local loaded = 0
    for _, f in ipairs(context.memoryFiles) do
      loaded = loaded + (f.status == "loaded" and f.tokens or 0)
    end
    lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
    t.truthy(
      vim.tbl_contains(section(lines, "Breakdown"), "  Memory files            " .. render.format_count(loaded)),
      vim.inspect(lines)
    )
    vim.api.nvim_win_close(vim.fn.bufwinid(buf), true)
    t.eq({}, float_buffers())
  end)

  it("follows ctx/clear to the new session, then forgets it when it closes", function()
    local session_id = open_session(50060)
    local project = make_project()
    local _, opened = request("ctx/openSession", { cwd = project.dir, model = MODEL })
    local project_id = opened.sessionId
    t.wait_for("the project session to be the current one", function()
      return is_current(project_id)
    end)
    local err, cleared = request("ctx/clear", { sessionId = project_id })
    t.eq(nil, err)
    t.truthy(cleared.sessionId ~= project_id)
    local ids = vim.tbl_map(function(s)
      return s.session_id
    end, ctxd.sessions())
    t.truthy(vim.tbl_contains(ids, cleared.sessionId) and not vim.tbl_contains(ids, project_id), vim.inspect(ids))
    t.eq(project.dir, require("ctxd.sessions").get(cleared.sessionId).cwd)
    -- Nothing but the project's memory files, which its next request carries.
    t.truthy(
      cleared.usage.tokens > 0 and cleared.usage.tokens == cleared.usage.breakdown.memoryFiles,
      vim.inspect(cleared.usage)
    )
    t.truthy(
      ctxd.status(cleared.sessionId):match("^ctx 0%.%d%% · 6%d%.%dk to compact$"),
      ctxd.status(cleared.sessionId)
    )
    t.eq(nil, (request("ctx/closeSession", { sessionId = cleared.sessionId })))
    t.eq(session_id, require("ctxd.sessions").get().session_id, "back to the first session")
    t.eq(1, #ctxd.sessions())
  end)

  it("request() hands back the daemon's error for methods it does not have", function()
    local session_id = open_session()
    local calls = { { "ctx/noSuchMethod", { sessionId = session_id } } }
    if not vim.tbl_contains(client.state.capabilities.methods, "ctx/assemble") then
      table.insert(calls, { "ctx/assemble", { sessionId = session_id, system = {}, tools = {}, maxTokens = 1000 } })
    end
    for _, call in ipairs(calls) do
      local err = request(call[1], call[2])
      t.eq(-32601, err and err.code, call[1])
      t.contains(client.describe_error(call[1], err), ": this ctxd is too old to do that. Update ctxd.")
    end
    local err = request("ctx/usage", { sessionId = "never-seen" })
    t.eq(-33001, err and err.code, "an id the store never had")
    t.eq(1, #ctxd.sessions(), "the session is kept")
  end)

  it(":CtxdAutoCompactWindow saves the window; the statusline follows; warnings and errors are shown", function()
    local session_id = open_session(50060)
    local before = ctxd.status()
    local function window_is(window)
      return function()
        local s = require("ctxd.sessions").get(session_id)
        return s.usage.window == window and ctxd.status() == render.status_text(s.usage)
      end
    end
    local seen = notifications(function()
      vim.cmd("CtxdAutoCompactWindow 200k")
    end, function(seen)
      return #seen > 0
    end)
    t.eq({
      {
        msg = "ctxd: auto-compact window for " .. MODEL .. " is 200,000 tokens (from settings).",
        level = vim.log.levels.INFO,
      },
    }, seen)
    t.wait_for("the statusline at a 200,000 window", window_is(200000))
    t.truthy(ctxd.status() ~= before)

    seen = notifications(function()
      vim.cmd("CtxdAutoCompactWindow 2M")
    end, function(seen)
      return #seen > 1
    end)
    t.eq({
      -- Capped to the model's window: the daemon's reason says so, in place of the clamp warning.
      {
        msg = "ctxd: window 200,000, not 2,000,000: the model accepts at most 200000 tokens; 2000000 is more than it can take.",
        level = vim.log.levels.WARN,
      },
      {
        msg = "ctxd: auto-compact window for " .. MODEL .. " is 200,000 tokens (from settings).",
        level = vim.log.levels.INFO,
      },
    }, seen)

    seen = notifications(function()
      vim.cmd("CtxdAutoCompactWindow auto")
    end, function(seen)
      return #seen > 0
    end)
    t.eq("ctxd: auto-compact window for " .. MODEL .. " is 100,000 tokens (from settings).", seen[1].msg)
    t.wait_for("the statusline back at a 100,000 window", window_is(100000))
    t.eq(before, ctxd.status())

    seen = notifications(function()
      vim.cmd("CtxdAutoCompactWindow lots")
    end, function(seen)
      return #seen > 0
    end)
    t.eq(vim.log.levels.ERROR, seen[1].level)
    t.contains(seen[1].msg, "a positive token count")

    local err = request("ctx/setAutoCompactWindow", { model = MODEL, window = "huge" })
    t.eq(-32602, err and err.code)

    -- A directory where the daemon saves windows: it cannot write there.
    local saved = state_dir .. "/saved-settings.json"
    vim.fn.delete(saved)
    vim.fn.mkdir(saved, "p")
    local ok, failure = pcall(notifications, function()
      vim.cmd("CtxdAutoCompactWindow 300k")
    end, function(seen)
      return #seen > 0
    end)
    vim.fn.delete(saved, "d")
    t.truthy(ok, failure)
    seen = failure
    t.eq(vim.log.levels.ERROR, seen[1].level)
    t.truthy(
      seen[1].msg:match(
        "^ctxd could not save the auto%-compact window: ctxd could not read or write its store %(.*saved%-settings%.json.*%)%. The daemon's log has more%.$"
      ),
      seen[1].msg
    )
    t.eq(before, ctxd.status(), "nothing changed")
  end)

  it(":CtxdLog shows the client's start log and the daemon's log", function()
    vim.cmd("CtxdLog")
    t.eq("ctxd://log", vim.api.nvim_buf_get_name(0))
    local text = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
    t.contains(text, "starting " .. test_env.ctxd_bin .. " serve")
    t.contains(text, "initialized (ctxd 0.1.0)")
    t.contains(text, "The daemon's own log (" .. log_file .. "), last lines:")
    t.contains(text, "ctxd starting")
    vim.cmd("close")
  end)

  it(":checkhealth ctxd reports the running daemon", function()
    local session_id = open_session()
    -- In a tab of its own (checkhealth takes over the window of an only, empty buffer).
    vim.cmd("tabnew")
    vim.cmd("checkhealth ctxd")
    local text = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
    t.contains(text, "running (pid " .. client.state.capabilities.processId .. "), ctxd 0.1.0, protocol 1")
    t.contains(text, "notifications: ctx/usageChanged")
    t.contains(text, "daemon command: " .. test_env.ctxd_bin)
    t.contains(text, session_id)
    vim.cmd("tabclose")
    if #vim.api.nvim_list_tabpages() > 1 then
      vim.cmd("tabclose")
    end
  end)

  it("restarts a crashed daemon; the statusline updates again", function()
    local session_id, last_uuid = open_session(50060)
    local before = ctxd.status()
    local old_pid = ctxd.pid()
    vim.uv.kill(old_pid, "sigkill")
    -- A request made as the daemon dies is answered: by the restarted daemon, or with an error.
    local answered = false
    ctxd.request("ctx/usage", { sessionId = session_id }, function()
      answered = true
    end)
    local seen = notifications(function() end, function(seen)
      return #seen > 0
    end)
    t.eq(
      { { msg = "ctxd was killed by signal 9; retrying in 1 s (:CtxdLog for details)", level = vim.log.levels.ERROR } },
      seen
    )
    t.eq("ctxd down: was killed by signal 9", ctxd.status())
    -- While it is down, a request fails at once (its callback runs before request() returns).
    -- Nothing has run the event loop since the statusline said so: it is still down.
    local down_err
    ctxd.request("ctx/usage", { sessionId = session_id }, function(e)
      down_err = e
    end)
    t.truthy(down_err, "no answer before request() returned")
    t.contains(down_err.message, "ctxd is down (ctxd was killed by signal 9)")
    t.wait_for("a new daemon", function()
      return client.is_ready() and ctxd.pid() ~= nil and ctxd.pid() ~= old_pid
    end)
    t.truthy(
      vim.tbl_contains(vim.api.nvim_get_proc_children(vim.fn.getpid()), ctxd.pid()),
      "the new daemon is Neovim's child"
    )
    t.eq(before, ctxd.status(), "the session resumed with its usage")
    t.wait_for("the request made during the crash to be answered", function()
      return answered
    end)
    local user = records.user("after the crash", last_uuid)
    local assistant = records.assistant(60000, user.uuid)
    local err = request("ctx/append", { sessionId = session_id, records = { user, assistant } })
    t.eq(nil, err)
    t.wait_for("the statusline at 60.0%", function()
      return ctxd.status() == "ctx 60.0% · 7.0k to compact"
    end)
  end)

  it(":CtxdCompact compacts with the focus and reports the token drop once; the statusline follows", function()
    local session_id = open_session(60000)
    local compacted
    local seen = notifications(function()
      compacted = user_event("CtxdCompacted", function()
        vim.cmd("CtxdCompact keep the failing test output")
      end)
    end, function(seen)
      return #seen > 0
    end)
    t.eq({ session_id, "manual" }, { compacted.sessionId, compacted.trigger })
    t.eq({
      {
        msg = string.format(
          "ctxd: compacted %s → %s tokens",
          render.format_count(compacted.preTokens),
          render.format_count(compacted.postTokens)
        ),
        level = vim.log.levels.INFO,
      },
    }, seen, "one message (the manual ctx/compacted is not shown again)")
    t.truthy(compacted.preTokens >= 60000 and compacted.postTokens < 5000, vim.inspect(compacted))
    t.wait_for("the statusline after the compaction", function()
      local s = require("ctxd.sessions").get(session_id)
      return s.usage.tokens < 5000 and s.usage.level == "ok" and ctxd.status() == render.status_text(s.usage)
    end)
  end)

  it(":CtxdUndoCompact brings the compacted conversation back, and says why when it cannot", function()
    local session_id = open_session(60000)
    t.eq(nil, (request("ctx/compact", { sessionId = session_id })))
    t.wait_for("the statusline after the compaction", function()
      local s = require("ctxd.sessions").get(session_id)
      return s.usage.tokens < 5000 and ctxd.status() == render.status_text(s.usage)
    end)
    local seen = notifications(function()
      vim.cmd("CtxdUndoCompact")
    end, function(seen)
      return #seen > 0
    end)
    local pre, post = seen[1].msg:match("^ctxd: compaction undone; (%S+) → (%S+) tokens$")
    t.truthy(pre and post, seen[1].msg)
    t.eq(vim.log.levels.INFO, seen[1].level)
    t.wait_for("the statusline after the undo", function()
      local s = require("ctxd.sessions").get(session_id)
      return s.usage.tokens >= 60000
        and render.format_count(s.usage.tokens) == post
        and ctxd.status() == render.status_text(s.usage)
    end)
    seen = notifications(function()
      vim.cmd("CtxdUndoCompact")
    end, function(seen)
      return #seen > 0
    end)
    t.eq(vim.log.levels.ERROR, seen[1].level)
    t.eq("ctxd could not undo the compaction: this session has no compaction to undo.", seen[1].msg)
  end)

  it("reports automatic compactions, and ctx/compactFailed when the breaker stops them", function()
    -- A session compacted once by hand: each refill to the threshold within a few turns
    -- of a compaction counts towards the breaker.
    local session_id = open_session(60000)
    t.eq(nil, (request("ctx/compact", { sessionId = session_id })))
    t.wait_for("the statusline after the compaction", function()
      local s = require("ctxd.sessions").get(session_id)
      return s.usage.tokens < 5000 and ctxd.status() == render.status_text(s.usage)
    end)
    local messages = {}
    local original = vim.notify
    vim.notify = function(msg, level)
      table.insert(messages, { msg = msg, level = level })
    end
    local ok, err = pcall(function()
      -- Refills to the threshold within a few turns of the previous compaction: two
      -- automatic compactions, then the breaker stops them.
      for i = 1, 2 do
        local compacted = user_event("CtxdCompacted", function()
          local user = records.user("turn " .. i)
          request("ctx/append", { sessionId = session_id, records = { user, records.assistant(70000, user.uuid) } })
        end)
        t.eq("auto", compacted.trigger)
        t.wait_for("the message of automatic compaction " .. i, function()
          return #messages == i
        end)
        t.eq({
          msg = string.format(
            "ctxd: compacted (auto) %s → %s tokens",
            render.format_count(compacted.preTokens),
            render.format_count(compacted.postTokens)
          ),
          level = vim.log.levels.INFO,
        }, messages[i])
        t.wait_for("the statusline after automatic compaction " .. i, function()
          local s = require("ctxd.sessions").get(session_id)
          return s.usage.tokens < 5000 and ctxd.status() == render.status_text(s.usage)
        end)
      end
      local failed = user_event("CtxdCompactFailed", function()
        local user = records.user("turn 3")
        request("ctx/append", { sessionId = session_id, records = { user, records.assistant(70000, user.uuid) } })
      end)
      t.eq(session_id, failed.sessionId)
      t.truthy(vim.startswith(failed.reason, "Autocompact is thrashing"), failed.reason)
      t.wait_for("the warning", function()
        return #messages == 3
      end)
      t.eq({ msg = "ctxd: compaction failed: " .. failed.reason, level = vim.log.levels.WARN }, messages[3])
      t.wait_for("the statusline at 70.0%", function()
        return ctxd.status():match("^ctx 70%.0%% · ") ~= nil
      end)
    end)
    vim.notify = original
    if not ok then
      error(err, 0)
    end
  end)

  it("closes the session; the statusline empties", function()
    local session_id = open_session(50060)
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
    t.contains(err.message, "ctxd is down (ctxd exited with code 1 while starting); next start in")
    ctxd.stop()
  end)

  it("names a missing binary once, fails requests at once, logs the attempt, and recovers on setup()", function()
    local seen = notifications(function()
      ctxd.setup({ bin = "/nonexistent/ctxd", restart = { initial_ms = 60000, max_ms = 60000, stable_ms = 60000 } })
    end, function(seen)
      return #seen > 0
    end)
    t.eq({
      {
        msg = "ctxd not found: /nonexistent/ctxd does not exist; retrying in 60 s (:CtxdLog for details)",
        level = vim.log.levels.ERROR,
      },
    }, seen)
    -- The request is answered before request() returns: no wait through the back-off.
    local err
    ctxd.request("ctx/usage", { sessionId = "nope" }, function(e)
      err = e
    end)
    t.truthy(err, "answered at once")
    t.contains(err.message, "ctxd is down (ctxd not found: /nonexistent/ctxd does not exist); next start in")
    t.eq("ctxd down: not found: /nonexistent/ctxd does not exist", ctxd.status())
    vim.cmd("tabnew")
    vim.cmd("checkhealth ctxd")
    local health = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
    t.contains(health, "ctxd is down (ctxd not found: /nonexistent/ctxd does not exist)")
    vim.cmd("tabclose")
    if #vim.api.nvim_list_tabpages() > 1 then
      vim.cmd("tabclose")
    end
    vim.cmd("Ctxd log")
    local text = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
    t.contains(text, "starting /nonexistent/ctxd serve --log-file")
    t.contains(text, "ctxd not found: /nonexistent/ctxd does not exist; next start in 60.0 s")
    t.truthy(not text:find("lsp.log", 1, true), "no reference to Neovim's lsp.log")
    vim.cmd("close")
    -- The fix: the right binary, and setup() again.
    ctxd.setup({
      bin = test_env.ctxd_bin,
      cmd = { test_env.ctxd_bin, "serve", "--state-dir", state_dir, "--log-file", log_file },
    })
    t.wait_for("the daemon to be ready", client.is_ready)
    t.eq("", ctxd.status())
    ctxd.stop()
  end)
end)
