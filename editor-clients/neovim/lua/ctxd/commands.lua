--- The user commands: `:CtxdCompact [focus]`, `:CtxdContext`, `:CtxdLog`,
--- `:CtxdRestart`. Each acts on the current session (the one whose usage changed
--- last), sends one `ctx/` request and reports the outcome; a failed request, including
--- a method the daemon does not have yet, becomes an error notification.
local client = require("ctxd.client")
local config_mod = require("ctxd.config")
local errors = require("ctxd.errors")
local render = require("ctxd.render")
local sessions = require("ctxd.sessions")

local M = {}

local function current_session()
  local session = sessions.get()
  if not session then
    vim.notify("ctxd: no session is open. An agent plugin opens sessions with require('ctxd').request('ctx/openSession', …).", vim.log.levels.WARN)
  end
  return session
end

--- Compacts the current session, with optional focus instructions.
---@param focus? string
---@param done? fun(err: table|nil, result: table|nil)
function M.compact(focus, done)
  local session = current_session()
  if not session then
    return
  end
  local params = { sessionId = session.session_id }
  if focus and vim.trim(focus) ~= "" then
    params.instructions = vim.trim(focus)
  end
  client.request("ctx/compact", params, function(err, result)
    if err then
      vim.notify(errors.describe("ctx/compact", err), vim.log.levels.ERROR)
    else
      vim.notify(
        string.format("ctxd: compacted %s → %s tokens", render.format_count(result.preTokens), render.format_count(result.postTokens)),
        vim.log.levels.INFO
      )
    end
    if done then
      done(err, result)
    end
  end)
end

--- Opens (or replaces) the floating context window with `lines`.
---@param lines string[]
---@return integer buf, integer win
function M.open_float(lines)
  local buf = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.bo[buf].modifiable = false
  vim.bo[buf].bufhidden = "wipe"
  vim.bo[buf].filetype = "ctxd-context"
  local width = 0
  for _, line in ipairs(lines) do
    width = math.max(width, vim.fn.strdisplaywidth(line))
  end
  width = math.min(width + 2, math.max(20, vim.o.columns - 4))
  local height = math.min(#lines, math.max(5, vim.o.lines - 4))
  local win = vim.api.nvim_open_win(buf, true, {
    relative = "editor",
    width = width,
    height = height,
    row = math.floor((vim.o.lines - height) / 2),
    col = math.floor((vim.o.columns - width) / 2),
    style = "minimal",
    border = "rounded",
    title = " ctxd ",
  })
  vim.keymap.set("n", "q", "<cmd>close<cr>", { buffer = buf, nowait = true, desc = "Close the ctxd context window" })
  return buf, win
end

--- Shows the current session's context in a float: `ctx/context`, or the breakdown
--- from `ctx/usage` while the daemon does not have `ctx/context`.
---@param done? fun(buf: integer|nil)
function M.context(done)
  done = done or function() end
  local session = current_session()
  if not session then
    return done(nil)
  end
  local id = session.session_id
  client.request("ctx/context", { sessionId = id }, function(err, result)
    if not err then
      return done((M.open_float(render.context_lines(id, result))))
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
      local note = "This ctxd has no ctx/context yet; the breakdown is from ctx/usage."
      done((M.open_float(render.context_lines(id, { usage = usage_result.usage }, note))))
    end)
  end)
end

--- Opens the daemon's log file in a split.
function M.log()
  local state = client.state
  if not state.config then
    return vim.notify("ctxd is not set up", vim.log.levels.WARN)
  end
  local path = config_mod.log_path(state.config, state.capabilities and state.capabilities.stateDir)
  if not path then
    return vim.notify("ctxd: the log file is not known until the daemon has started", vim.log.levels.WARN)
  end
  if vim.fn.filereadable(path) == 0 then
    return vim.notify("ctxd: no log at " .. path, vim.log.levels.WARN)
  end
  vim.cmd.split(vim.fn.fnameescape(path))
  vim.bo.readonly = true
  vim.bo.autoread = true
  vim.cmd.normal({ "G", bang = true })
end

function M.register()
  local command = vim.api.nvim_create_user_command
  command("CtxdCompact", function(args)
    M.compact(args.args)
  end, { nargs = "?", desc = "ctxd: compact the current session, with optional focus instructions" })
  command("CtxdContext", function()
    M.context()
  end, { desc = "ctxd: show the current session's context breakdown" })
  command("CtxdLog", M.log, { desc = "ctxd: open the daemon's log" })
  command("CtxdRestart", function()
    require("ctxd").restart()
  end, { desc = "ctxd: restart the daemon" })
end

return M
