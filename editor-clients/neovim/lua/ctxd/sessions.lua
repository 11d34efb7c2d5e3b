--- The sessions this editor opened on ctxd and the latest usage the daemon sent for each.
---
--- **Invariant:** a usage stored here is exactly what the daemon sent
--- (`ctx/usageChanged`, or the `ctx/openSession` / `ctx/clear` answer that starts a
--- session); nothing here computes levels or thresholds.
local M = {}

---@class ctxd.Session
---@field session_id string
---@field cwd string
---@field model string
---@field usage? ctxd.Usage

---@type table<string, ctxd.Session>
local open = {}
---@type string|nil the session whose usage changed last
local current = nil

local function changed(event, data)
  vim.schedule(function()
    vim.api.nvim_exec_autocmds("User", { pattern = event, modeline = false, data = data })
    vim.cmd.redrawstatus({ bang = true })
  end)
end

---@param session_id string
---@param cwd string
---@param model string
---@param usage? ctxd.Usage
function M.opened(session_id, cwd, model, usage)
  local known = open[session_id]
  open[session_id] = { session_id = session_id, cwd = cwd, model = model, usage = known and known.usage }
  if usage then
    M.set_usage(session_id, usage)
  end
end

---@param session_id string
function M.closed(session_id)
  open[session_id] = nil
  if current == session_id then
    current = next(open)
  end
  changed("CtxdSessionsChanged", { sessionId = session_id })
end

--- `ctx/clear` started `new_id` (with `usage`) in place of `old_id`, which the daemon closed.
---@param old_id string
---@param new_id string
---@param usage? ctxd.Usage
function M.cleared(old_id, new_id, usage)
  local old = open[old_id]
  if not old then
    return
  end
  open[old_id] = nil
  open[new_id] = { session_id = new_id, cwd = old.cwd, model = old.model }
  if current == old_id then
    current = new_id
  end
  changed("CtxdSessionsChanged", { sessionId = new_id })
  if usage then
    M.set_usage(new_id, usage)
  end
end

--- Stores a usage the daemon sent. Usage of sessions this editor did not open is ignored.
---@param session_id string
---@param usage ctxd.Usage
function M.set_usage(session_id, usage)
  local session = open[session_id]
  if not session then
    return
  end
  session.usage = usage
  current = session_id
  changed("CtxdUsageChanged", { sessionId = session_id, usage = usage })
end

---@param session_id? string default: the session whose usage changed last
---@return ctxd.Session|nil
function M.get(session_id)
  return open[session_id or current or ""]
end

---@return ctxd.Session[]
function M.list()
  local list = vim.tbl_values(open)
  table.sort(list, function(a, b)
    return a.session_id < b.session_id
  end)
  return list
end

--- Forgets everything (tests).
function M.reset()
  open, current = {}, nil
end

return M
