--- ctxd for Neovim: a thin client of the ctxd daemon.
---
--- ```lua
--- require("ctxd").setup({ cmd = { "ctxd", "serve" } })
--- require("ctxd").request("ctx/openSession", { cwd = vim.fn.getcwd(), model = "claude-sonnet-4-5-20250929" },
---   function(err, result) … end)
--- vim.o.statusline = "%f %= %{%v:lua.require'ctxd'.statusline()%}"
--- ```
local client = require("ctxd.client")
local config_mod = require("ctxd.config")
local render = require("ctxd.render")
local sessions = require("ctxd.sessions")

local M = {}

local function define_highlights()
  local links = {
    CtxdOk = "DiagnosticOk",
    CtxdWarning = "DiagnosticWarn",
    CtxdCompacting = "DiagnosticInfo",
    CtxdBlocked = "DiagnosticError",
  }
  for group, target in pairs(links) do
    vim.api.nvim_set_hl(0, group, { link = target, default = true })
  end
end

--- Starts the daemon and defines the commands and highlight groups.
---@param opts? ctxd.Config|table
function M.setup(opts)
  if vim.fn.has("nvim-0.11") == 0 then
    vim.notify("ctxd needs Neovim 0.11 or newer", vim.log.levels.ERROR)
    return
  end
  local config = config_mod.resolve(opts)
  define_highlights()
  require("ctxd.commands").register()
  -- A later `:cd` (or `:tcd`, `:lcd`) into a project shows its Claude Code sessions.
  vim.api.nvim_create_autocmd("DirChanged", {
    group = vim.api.nvim_create_augroup("ctxd.directory", { clear = true }),
    callback = function()
      local current = client.state.config
      if current and current.observe_claude_code and client.state.observing then
        require("ctxd.claude").moved_to(client.request, vim.fn.getcwd())
      end
    end,
  })
  client.start(config)
end

--- Sends any `ctx/` method. `callback(err, result)`; `err` is the JSON-RPC error
--- (`code`, `message`), e.g. code -32601 for a method the daemon does not have.
--- Sessions opened, cleared and closed through here are tracked: their usage feeds
--- `status()`, and they are resumed when the daemon restarts.
---@param method string
---@param params table
---@param callback? fun(err: table|nil, result: any)
function M.request(method, params, callback)
  client.request(method, params, callback)
end

--- Sends new daemon settings (`workspace/didChangeConfiguration`) and keeps them for restarts.
---@param settings table
function M.update_settings(settings)
  if client.state.config then
    client.state.config.settings = settings
  end
  client.notify("workspace/didChangeConfiguration", { settings = settings })
end

--- An observed Claude Code session's status: `ctx 45.0% · 77.0k to compact · 90.0k · claude-opus-4-6`,
--- and once its prompt cache went cold what that costs and the fix (`render.cache_text`).
---@param observed ctxd.ObservedSession
---@return string
function M.observed_status(observed)
  if not observed.usage then
    return "ctx"
  end
  local model = observed.model and (" · " .. observed.model:gsub("%-%d%d%d%d%d%d%d%d$", "")) or ""
  local cache = render.cache_text(observed.usage.cache)
  return render.status_text(observed.usage)
    .. " · "
    .. render.format_tokens(observed.usage.tokens)
    .. model
    .. (cache ~= "" and (" · " .. cache) or "")
end

--- The status of a session (default: the one whose usage changed last; with no agent
--- plugin's session open, the newest active Claude Code session of the current
--- directory), e.g. `ctx 50.1% · 16.9k to compact`; while the daemon is down after a
--- failure, why; `""` when there is nothing to show.
---@param session_id? string
---@return string
function M.status(session_id)
  local session = sessions.get(session_id)
  local down = client.state.down and ("ctxd down: " .. client.state.down.cause:gsub("^ctxd ", "")) or nil
  if not session then
    local observed = not session_id and require("ctxd.claude").get() or nil
    if down then
      return down
    end
    return observed and client.is_ready() and M.observed_status(observed) or ""
  end
  if down then
    return down
  end
  if not client.is_ready() then
    return render.DAEMON_DOWN_TEXT
  end
  return session.usage and render.status_text(session.usage) or ""
end

--- Highlight group for `status()`: `CtxdOk`, `CtxdWarning`, `CtxdCompacting`, `CtxdBlocked`.
---@param session_id? string
---@return string
function M.status_highlight(session_id)
  if client.state.down then
    return "CtxdBlocked"
  end
  local session = sessions.get(session_id) or (not session_id and require("ctxd.claude").get() or nil)
  if not session or not session.usage or not client.is_ready() then
    return "CtxdOk"
  end
  return render.level_highlight(session.usage.level)
end

--- `status()` coloured and escaped for 'statusline' (use with `%{% … %}`).
---@param session_id? string
---@return string
function M.statusline(session_id)
  local text = M.status(session_id)
  if text == "" then
    return ""
  end
  return "%#" .. M.status_highlight(session_id) .. "#" .. text:gsub("%%", "%%%%") .. "%*"
end

--- Open sessions with their latest usage.
---@return ctxd.Session[]
function M.sessions()
  return sessions.list()
end

--- Restarts the daemon (sessions are resumed).
function M.restart()
  assert(client.state.config, "ctxd: setup() was not called")
  client.start(client.state.config)
end

--- Stops the daemon for good (until `setup()` or `restart()`).
---@param on_stopped? fun()
function M.stop(on_stopped)
  client.stop(on_stopped)
end

--- Pid of the running daemon, or nil.
function M.pid()
  return client.pid()
end

return M
