--- The user commands: `:Ctxd {subcommand}` (compact, undo, context, window, sessions,
--- history, log, restart), with the older `:CtxdCompact [focus]`, `:CtxdUndoCompact`,
--- `:CtxdContext`, `:CtxdAutoCompactWindow {window} [model]`, `:CtxdLog`,
--- `:CtxdRestart` kept as aliases. Each acts on the current session (an agent plugin's
--- session whose usage changed last; with none open, the newest active Claude Code
--- session of the current directory), sends one `ctx/` request and reports the outcome;
--- a failed request, including a method the daemon does not have yet, becomes an error
--- notification.
local client = require("ctxd.client")
local config_mod = require("ctxd.config")
local errors = require("ctxd.errors")
local render = require("ctxd.render")
local sessions = require("ctxd.sessions")
local claude = require("ctxd.claude")

local M = {}

--- The observed Claude Code session commands act on: only when no agent plugin has a
--- session open.
---@return ctxd.ObservedSession|nil
local function claude_session()
  if sessions.get() then
    return nil
  end
  return claude.get()
end

local function current_session()
  local session = sessions.get()
  if not session then
    local down = client.down_text()
    vim.notify(
      down and ("ctxd: " .. down)
        or "ctxd: no session is open, and no Claude Code session was found for this directory. An agent plugin opens sessions with require('ctxd').request('ctx/openSession', …).",
      vim.log.levels.WARN
    )
  end
  return session
end

--- Sends `method` with `params` for the current session; a failure becomes an error
--- notification, a result goes to `report`; then `done`, if given, gets both.
---@param method string
---@param params table
---@param report fun(result: table)
---@param done? fun(err: table|nil, result: table|nil)
local function session_request(method, params, report, done)
  local session = current_session()
  if not session then
    return
  end
  params.sessionId = session.session_id
  client.request(method, params, function(err, result)
    if err then
      vim.notify(errors.describe(method, err), vim.log.levels.ERROR)
    else
      report(result)
    end
    if done then
      done(err, result)
    end
  end)
end

--- Compacts the current session, with optional focus instructions.
---@param focus? string
---@param done? fun(err: table|nil, result: table|nil)
function M.compact(focus, done)
  local observed = claude_session()
  if observed then
    return M.compact_claude(observed, focus, done)
  end
  local params = {}
  if focus and vim.trim(focus) ~= "" then
    params.instructions = vim.trim(focus)
  end
  session_request("ctx/compact", params, function(result)
    for _, problem in ipairs(type(result.problems) == "table" and result.problems or {}) do
      vim.notify("ctxd: " .. problem, vim.log.levels.WARN)
    end
    vim.notify(
      string.format(
        "ctxd: compacted %s → %s tokens",
        render.format_count(result.preTokens),
        render.format_count(result.postTokens)
      ),
      vim.log.levels.INFO
    )
  end, done)
end

--- Takes back the current session's latest compaction.
---@param done? fun(err: table|nil, result: table|nil)
function M.undo_compact(done)
  local observed = claude_session()
  if observed then
    return M.claude_request("ctx/claudeUndo", observed, nil, function(result)
      -- Token figures when the daemon's answer has them (older answers do not).
      local numbers = ""
      if type(result) == "table" and result.preTokens and result.postTokens then
        numbers = string.format(
          ": %s → %s tokens",
          render.format_count(result.preTokens),
          render.format_count(result.postTokens)
        )
      end
      vim.notify(
        "ctxd: the Claude Code session's last compaction is undone"
          .. numbers
          .. "; the transcript is as it was before it",
        vim.log.levels.INFO
      )
    end, done)
  end
  session_request("ctx/undoCompact", {}, function(result)
    vim.notify(
      string.format(
        "ctxd: compaction undone; %s → %s tokens",
        render.format_count(result.preTokens),
        render.format_count(result.postTokens)
      ),
      vim.log.levels.INFO
    )
  end, done)
end

---@class ctxd.ContextFloat
---@field buf integer
---@field win integer
---@field session_id string
---@field context table what is drawn: the `ctx/context` answer, or `{ usage = … }`
---@field note? string set when the daemon has no `ctx/context` (the float shows a usage only)

---@type ctxd.ContextFloat|nil the context float on screen
local shown = nil
--- Bumped at every show and refresh; an older `ctx/context` answer is dropped.
local generation = 0

local function float_config(lines)
  local width = 0
  for _, line in ipairs(lines) do
    width = math.max(width, vim.fn.strdisplaywidth(line))
  end
  width = math.min(width + 2, math.max(20, vim.o.columns - 4))
  local height = math.min(#lines, math.max(5, vim.o.lines - 4))
  return {
    relative = "editor",
    width = width,
    height = height,
    row = math.floor((vim.o.lines - height) / 2),
    col = math.floor((vim.o.columns - width) / 2),
  }
end

--- Opens (or replaces) the floating context window with `lines`.
---@param lines string[]
---@return integer buf, integer win
function M.open_float(lines)
  if shown and vim.api.nvim_win_is_valid(shown.win) then
    vim.api.nvim_win_close(shown.win, true)
  end
  shown = nil
  local buf = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.bo[buf].modifiable = false
  vim.bo[buf].bufhidden = "wipe"
  vim.bo[buf].filetype = "ctxd-context"
  local config = float_config(lines)
  config.style, config.border, config.title = "minimal", "rounded", " ctxd "
  local win = vim.api.nvim_open_win(buf, true, config)
  vim.keymap.set("n", "q", "<cmd>close<cr>", { buffer = buf, nowait = true, desc = "Close the ctxd context window" })
  vim.api.nvim_create_autocmd("BufWipeout", {
    buffer = buf,
    once = true,
    callback = function()
      if shown and shown.buf == buf then
        shown = nil
      end
    end,
  })
  return buf, win
end

--- Opens the float for `session_id` showing `context` (and `note`), and remembers it so
--- that it follows the daemon's notifications.
local function show(session_id, context, note)
  generation = generation + 1
  local buf, win = M.open_float(render.context_lines(session_id, context, note))
  shown = { buf = buf, win = win, session_id = session_id, context = context, note = note }
  return buf
end

--- Redraws the float on screen from `context`.
local function redraw(float, context)
  if shown ~= float or not vim.api.nvim_win_is_valid(float.win) then
    return
  end
  float.context = context
  local lines = render.context_lines(float.session_id, context, float.note)
  vim.bo[float.buf].modifiable = true
  vim.api.nvim_buf_set_lines(float.buf, 0, -1, false, lines)
  vim.bo[float.buf].modifiable = false
  local config = float_config(lines)
  vim.api.nvim_win_set_config(float.win, config)
end

--- The daemon said the float's session changed: a new usage (`usage`), or memory files
--- or read files changed on disk. A `ctx/context` float asks again (the pushed usage has
--- no memory-file split) and draws the latest answer, or `usage` if that fails; a
--- usage-only float draws `usage`.
---@param session_id string
---@param usage? ctxd.Usage
function M.refresh(session_id, usage)
  local float = shown
  if not float or float.session_id ~= session_id or not vim.api.nvim_win_is_valid(float.win) then
    return
  end
  if float.note then
    if usage then
      redraw(float, { usage = usage })
    end
    return
  end
  generation = generation + 1
  local mine = generation
  client.request("ctx/context", { sessionId = session_id }, function(err, result)
    if mine ~= generation then
      return
    end
    if not err then
      redraw(float, result)
    elseif usage then
      redraw(float, vim.tbl_extend("force", float.context, { usage = usage }))
    end
  end)
end

--- Shown above the breakdown when the daemon is too old to give the whole context view.
M.OLD_DAEMON_NOTE =
  "This ctxd is too old to list memory files, rules and files read: the breakdown below is all it reports. Update ctxd for the whole view."

--- Shows the current session's context in a float: `ctx/context` (memory files with
--- their sizes, rules waiting for a read, read files), or the breakdown from
--- `ctx/usage` with a note when the daemon does not have `ctx/context`. The float
--- follows `ctx/usageChanged` and `ctx/contextChanged` of its session.
---@param done? fun(buf: integer|nil)
function M.context(done)
  done = done or function() end
  local observed = claude_session()
  if observed and observed.usage then
    local note = string.format(
      "Claude Code session %s (%s%s), observed by ctxd.",
      observed.claude_session_id or observed.session_id,
      observed.transcript or observed.project_dir,
      observed.model and (", model " .. observed.model) or ""
    )
    return done(show(observed.session_id, { usage = observed.usage }, note))
  end
  local session = current_session()
  if not session then
    return done(nil)
  end
  local id = session.session_id
  client.request("ctx/context", { sessionId = id }, function(err, result)
    if not err then
      return done(show(id, result))
    end
    if not errors.is_method_not_found(err) then
      vim.notify(errors.describe("ctx/context", err), vim.log.levels.ERROR)
      return done(nil)
    end
    client.request("ctx/usage", { sessionId = id }, function(usage_err, usage_result)
      if usage_err then
        vim.notify(errors.describe("ctx/usage", usage_err), vim.log.levels.ERROR)
        return done(nil)
      end
      local note = M.OLD_DAEMON_NOTE
      done(show(id, { usage = usage_result.usage }, note))
    end)
  end)
end

--- Reads a window: a positive token count (`200000`, `200k`, `1.5m`, `200_000`,
--- `200,000`) or `auto`; nil for anything else. The range is the daemon's to judge: it
--- clamps and says so in the answer's `warnings`.
---@param input string
---@return integer|"auto"|nil
function M.parse_window(input)
  local text = (vim.trim(input or ""):lower():gsub("[,_]", ""))
  if text == "auto" then
    return "auto"
  end
  local number, suffix = text:match("^(%d+)([km]?)$")
  if not number then
    number, suffix = text:match("^(%d+%.%d+)([km]?)$")
  end
  if not number then
    return nil
  end
  local scale = suffix == "k" and 1000 or suffix == "m" and 1000000 or 1
  local value = math.floor(tonumber(number) * scale + 0.5)
  return value > 0 and value or nil
end

--- Saves the auto-compact window for the current session's model (or `model`):
--- `ctx/setAutoCompactWindow`. The model's open sessions follow at once (their
--- statusline changes); the answer's warnings are shown too.
---@param input string tokens or `auto`
---@param model? string default: the current session's model
---@param done? fun(err: table|nil, result: table|nil)
function M.auto_compact_window(input, model, done)
  done = done or function() end
  local window = M.parse_window(input)
  if not window then
    vim.notify(
      "ctxd: the window is a positive token count (e.g. 200000 or 200k) or auto, not " .. vim.inspect(input),
      vim.log.levels.ERROR
    )
    return done({ message = "invalid window" }, nil)
  end
  if not model or model == "" then
    local observed = claude_session()
    if observed and observed.model then
      model = observed.model
    else
      local session = current_session()
      if not session then
        return done({ message = "no session" }, nil)
      end
      model = session.model
    end
  end
  client.request("ctx/setAutoCompactWindow", { model = model, window = window }, function(err, result)
    if err then
      vim.notify(errors.describe("ctx/setAutoCompactWindow", err), vim.log.levels.ERROR)
    else
      if type(result.reason) == "string" then
        vim.notify(render.window_reason_text(result), vim.log.levels.WARN)
      else
        for _, warning in ipairs(type(result.warnings) == "table" and result.warnings or {}) do
          vim.notify("ctxd: " .. warning, vim.log.levels.WARN)
        end
      end
      vim.notify(render.window_result_text(result), vim.log.levels.INFO)
    end
    done(err, result)
  end)
end

--- The lines `:CtxdLog` shows: the client's own log of start attempts, then the end of
--- the daemon's log file when there is one.
---@return string[]
function M.log_lines()
  local state = client.state
  local lines = { "ctxd client (start attempts, exits, observed projects):" }
  for _, line in ipairs(state.log) do
    table.insert(lines, "  " .. line)
  end
  local down = client.down_text()
  if down then
    table.insert(lines, "  now: " .. down)
  end
  local path = state.config and config_mod.log_path(state.config, state.capabilities and state.capabilities.stateDir)
  table.insert(lines, "")
  if not path then
    table.insert(lines, "The daemon's own log: not known (give --log-file in cmd).")
  elseif vim.fn.filereadable(path) == 0 then
    table.insert(lines, "The daemon's own log: none at " .. path .. " (the daemon has not written one).")
  else
    local content = vim.fn.readfile(path)
    table.insert(lines, string.format("The daemon's own log (%s), last lines:", path))
    vim.list_extend(lines, vim.list_slice(content, math.max(1, #content - 199)))
  end
  local stderr = client.stderr_tail(50)
  if #stderr > 0 then
    table.insert(lines, "")
    table.insert(lines, "The daemon's stderr (what it said before its log was open, and panics), last lines:")
    vim.list_extend(lines, stderr)
  end
  local holder = client.is_ready() and client.store_holder() or nil
  if holder then
    table.insert(lines, "")
    if holder.log and vim.fn.filereadable(holder.log) == 1 then
      local content = vim.fn.readfile(holder.log)
      table.insert(
        lines,
        string.format(
          "This editor's ctxd relays to the daemon that holds the store (pid %d); its log (%s), last lines:",
          holder.pid,
          holder.log
        )
      )
      vim.list_extend(lines, vim.list_slice(content, math.max(1, #content - 199)))
    else
      table.insert(
        lines,
        string.format(
          "This editor's ctxd relays to the daemon that holds the store (pid %d), which logs to the editor that started it.",
          holder.pid
        )
      )
    end
  end
  return lines
end

--- Shows `log_lines()` in a scratch buffer in a split.
---@return integer buf
function M.log()
  local buf = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, M.log_lines())
  vim.bo[buf].modifiable = false
  vim.bo[buf].bufhidden = "wipe"
  vim.bo[buf].filetype = "ctxd-log"
  pcall(vim.api.nvim_buf_set_name, buf, "ctxd://log")
  vim.cmd.split()
  vim.api.nvim_win_set_buf(0, buf)
  vim.cmd.normal({ "G", bang = true })
  return buf
end

--- Sends a Claude Code compaction method for an observed session; a daemon without it
--- gets a clear message.
function M.claude_request(method, observed, instructions, report, done)
  done = done or function() end
  local params = { transcript = observed.transcript, sessionId = observed.claude_session_id }
  if instructions and vim.trim(instructions) ~= "" then
    params.instructions = vim.trim(instructions)
  end
  client.request(method, params, function(err, result)
    if err then
      vim.notify(errors.describe(method, err), vim.log.levels.ERROR)
    else
      report(result)
    end
    done(err, result)
  end)
end

--- Compacts an observed Claude Code session after a confirmation that says what is written.
function M.compact_claude(observed, focus, done)
  done = done or function() end
  local prompt = string.format(
    "Compact the Claude Code session %s? ctxd appends a compact boundary and a summary to %s; Claude Code continues from the summary when resumed. Nothing is removed: :Ctxd undo takes it back until the next turn.",
    observed.claude_session_id or observed.session_id,
    observed.transcript or observed.project_dir
  )
  vim.ui.select({ "Compact", "Cancel" }, { prompt = prompt }, function(choice)
    if choice ~= "Compact" then
      return done(nil, nil)
    end
    M.claude_request("ctx/claudeCompact", observed, focus, function(result)
      local numbers = ""
      if type(result) == "table" and result.preTokens and result.postTokens then
        numbers = string.format(
          " %s → %s tokens",
          render.format_count(result.preTokens),
          render.format_count(result.postTokens)
        )
      end
      -- Who wrote the summary, and why the configured provider did not when it fell back.
      local by = ""
      if type(result) == "table" and type(result.summarizer) == "string" then
        by = ", summary by " .. result.summarizer
      end
      vim.notify("ctxd: Claude Code session compacted" .. numbers .. by, vim.log.levels.INFO)
      if type(result) == "table" and type(result.problems) == "table" then
        for _, problem in ipairs(result.problems) do
          vim.notify("ctxd: " .. problem, vim.log.levels.WARN)
        end
      end
    end, done)
  end)
end

--- The picker's entry that unpins the statusline.
M.FOLLOW_NEWEST = "Follow the session that changed last"

--- Picks one of the Claude Code sessions of the current directory (every transcript of
--- its project folder, newest written first: the files on disk, so every editor lists the
--- same), pins it to the statusline and shows its context. A session the daemon does not
--- follow yet is followed first. When one is pinned, the first entry unpins.
---@param done? fun(buf: integer|nil)
function M.pick_session(done)
  done = done or function() end
  local listed = claude.listed()
  if #listed == 0 then
    vim.notify("ctxd: no Claude Code session found for this directory yet", vim.log.levels.INFO)
    return done(nil)
  end
  local shown = claude.get()
  local pinned = claude.pinned()
  local items = {}
  if pinned then
    table.insert(items, { follow_newest = true })
  end
  vim.list_extend(items, listed)
  vim.ui.select(items, {
    prompt = "Claude Code session (shown in the statusline from now on)",
    format_item = function(item)
      if item.follow_newest then
        return M.FOLLOW_NEWEST
      end
      local text = item.session and item.session.usage and require("ctxd").observed_status(item.session)
        or "not followed yet"
      local here = shown and item.session and item.session.session_id == shown.session_id
      return text .. "  " .. item.claude_session_id .. (here and (pinned and "  (pinned)" or "  (shown)") or "")
    end,
  }, function(choice)
    if not choice then
      return done(nil)
    end
    if choice.follow_newest then
      claude.pin(nil)
      return done(nil)
    end
    claude.follow(client.request, choice, function(err, session)
      if err or not session then
        vim.notify(errors.describe("ctx/observe", err or {}), vim.log.levels.ERROR)
        return done(nil)
      end
      claude.pin(session.session_id)
      local note = string.format(
        "Claude Code session %s (%s), observed by ctxd.",
        session.claude_session_id or session.session_id,
        session.transcript or session.project_dir
      )
      done(show(session.session_id, { usage = session.usage }, note))
    end)
  end)
end

local SUBCOMMANDS = {
  compact = {
    run = function(rest)
      M.compact(rest)
    end,
    desc = "compact the current session [focus]",
  },
  undo = {
    run = function()
      M.undo_compact()
    end,
    desc = "undo the latest compaction",
  },
  context = {
    run = function()
      M.context()
    end,
    desc = "show the context",
  },
  window = {
    run = function(_, fargs)
      M.auto_compact_window(fargs[2], fargs[3])
    end,
    desc = "save the auto-compact window {tokens|auto} [model]",
    complete = { "auto", "200k", "500k", "1M" },
  },
  sessions = {
    run = function()
      M.pick_session()
    end,
    desc = "pick a Claude Code session of this directory",
  },
  history = {
    run = function(rest)
      require("ctxd.history").search(rest)
    end,
    desc = "search the current session's history [query]",
  },
  log = {
    run = function()
      M.log()
    end,
    desc = "the client's start log and the daemon's log",
  },
  restart = {
    run = function()
      require("ctxd").restart()
    end,
    desc = "restart the daemon",
  },
}

--- The usage line `:Ctxd` with no argument prints.
---@return string
function M.usage()
  local names = vim.tbl_keys(SUBCOMMANDS)
  table.sort(names)
  local lines = { "Usage: :Ctxd {" .. table.concat(names, "|") .. "}" }
  for _, name in ipairs(names) do
    table.insert(lines, string.format("  %-9s %s", name, SUBCOMMANDS[name].desc))
  end
  return table.concat(lines, "\n")
end

--- `:Ctxd` completion: the subcommands, then the windows after `window`.
function M.complete(lead, line)
  local words = vim.split(line, "%s+", { trimempty = true })
  local at = #words + (line:match("%s$") and 1 or 0)
  local candidates = {}
  if at <= 2 then
    candidates = vim.tbl_keys(SUBCOMMANDS)
    table.sort(candidates)
  elseif at == 3 and SUBCOMMANDS[words[2]] and SUBCOMMANDS[words[2]].complete then
    candidates = SUBCOMMANDS[words[2]].complete
  end
  return vim.tbl_filter(function(c)
    return vim.startswith(c, lead)
  end, candidates)
end

function M.register()
  local command = vim.api.nvim_create_user_command
  command("Ctxd", function(args)
    local name = args.fargs[1]
    local sub = name and SUBCOMMANDS[name]
    if not name then
      return vim.notify(M.usage(), vim.log.levels.INFO)
    elseif not sub then
      return vim.notify("ctxd: no subcommand " .. name .. ". " .. M.usage(), vim.log.levels.ERROR)
    end
    sub.run(vim.trim(args.args:sub(#name + 1)), args.fargs)
  end, {
    nargs = "*",
    complete = M.complete,
    desc = "ctxd: compact, undo, context, window, sessions, history, log, restart",
  })
  command("CtxdCompact", function(args)
    M.compact(args.args)
  end, { nargs = "?", desc = "ctxd: compact the current session, with optional focus instructions" })
  command("CtxdUndoCompact", function()
    M.undo_compact()
  end, { desc = "ctxd: undo the current session's latest compaction" })
  command("CtxdContext", function()
    M.context()
  end, { desc = "ctxd: show the current session's context: breakdown, memory files, read files" })
  command("CtxdAutoCompactWindow", function(args)
    M.auto_compact_window(args.fargs[1], args.fargs[2])
  end, {
    nargs = "+",
    complete = function(lead, line)
      if #vim.split(line, "%s+", { trimempty = true }) <= 2 then
        return vim.tbl_filter(function(c)
          return vim.startswith(c, lead)
        end, { "auto", "200k", "500k", "1M" })
      end
      return {}
    end,
    desc = "ctxd: save the auto-compact window (tokens, or auto) for the current session's model",
  })
  command("CtxdLog", function()
    M.log()
  end, { desc = "ctxd: the client's start log and the daemon's log" })
  command("CtxdRestart", function()
    require("ctxd").restart()
  end, { desc = "ctxd: restart the daemon" })

  local group = vim.api.nvim_create_augroup("ctxd.context_float", { clear = true })
  vim.api.nvim_create_autocmd("User", {
    group = group,
    pattern = { "CtxdUsageChanged", "CtxdContextChanged" },
    callback = function(ev)
      local data = ev.data or {}
      if data.sessionId then
        M.refresh(data.sessionId, ev.match == "CtxdUsageChanged" and data.usage or nil)
      end
    end,
  })
end

return M
