--- `:checkhealth ctxd`: Neovim version, the daemon command, the running daemon and
--- what it supports, the log file, open sessions.
local M = {}

--- The methods the commands use (:CtxdCompact, :CtxdUndoCompact, :CtxdContext,
--- :CtxdAutoCompactWindow).
local WANTED_METHODS = { "ctx/compact", "ctx/undoCompact", "ctx/context", "ctx/setAutoCompactWindow" }

function M.check()
  local health = vim.health
  local client = require("ctxd.client")
  local config_mod = require("ctxd.config")

  health.start("ctxd: editor")
  if vim.fn.has("nvim-0.11") == 1 then
    health.ok("Neovim " .. tostring(vim.version()))
  else
    health.error("Neovim 0.11 or newer is needed (vim.lsp client API)")
  end

  local state = client.state
  if not state.config then
    health.error("setup() was not called", { "require('ctxd').setup({ cmd = { 'ctxd', 'serve' } })" })
    return
  end
  if type(state.config.cmd) ~= "table" then
    health.info("daemon command: a function (in-process server)")
  elseif vim.fn.executable(state.config.cmd[1]) == 1 then
    health.ok("daemon command: " .. table.concat(state.config.cmd, " "))
  else
    health.error(
      state.config.cmd[1] .. " is not executable",
      { "install ctxd or pass cmd = { '/path/to/ctxd', 'serve' } to setup()" }
    )
  end

  health.start("ctxd: daemon")
  local caps = state.capabilities
  local holder = client.is_ready() and client.store_holder() or nil
  if client.is_ready() and caps and holder then
    -- Another editor's daemon holds the store: this one only relays to it.
    health.ok(
      string.format(
        "running: this editor's ctxd (pid %s) relays to the daemon that holds the store, pid %d (started by another editor), ctxd %s, protocol %s",
        tostring(client.pid()),
        holder.pid,
        caps.version,
        caps.protocol
      )
    )
    health.info(
      holder.log and ("that daemon's log: " .. holder.log .. " (:CtxdLog shows its end)")
        or "that daemon logs to the editor that started it (VS Code: the ctxd output channel)"
    )
    health.info("state dir: " .. caps.stateDir)
  elseif client.is_ready() and caps then
    health.ok(
      string.format("running (pid %s), ctxd %s, protocol %s", tostring(client.pid()), caps.version, caps.protocol)
    )
    health.info("state dir: " .. caps.stateDir)
    health.info("methods: " .. table.concat(caps.methods, ", "))
    health.info("notifications: " .. table.concat(caps.notifications or {}, ", "))
    local missing = vim.tbl_filter(function(m)
      return not vim.tbl_contains(caps.methods, m)
    end, WANTED_METHODS)
    if #missing > 0 then
      health.warn(
        "this ctxd does not answer " .. table.concat(missing, ", ") .. " yet; the commands using them report an error"
      )
    end
  else
    local down = client.down_text()
    if down then
      health.error(
        down,
        { ":CtxdLog shows each start attempt", "fix the cause, then call setup() again or :Ctxd restart" }
      )
    else
      health.warn(string.format("not running (started %d times); it restarts with back-off", state.starts))
    end
  end
  local log = config_mod.log_path(state.config, caps and caps.stateDir)
  if log and vim.fn.filereadable(log) == 1 then
    health.ok((holder and "the relay's log: " or "log: ") .. log .. " (:CtxdLog)")
  else
    health.warn("no log file found" .. (log and (" at " .. log) or ""))
  end

  health.start("ctxd: sessions")
  local list = require("ctxd.sessions").list()
  if #list == 0 then
    health.info("no session open")
  end
  for _, s in ipairs(list) do
    local text = s.usage and require("ctxd.render").status_text(s.usage) or "no usage yet"
    health.info(string.format("%s  %s  (%s)", s.session_id, text, s.model))
  end
  local claude = require("ctxd.claude")
  for _, s in ipairs(claude.list()) do
    health.info(
      string.format("Claude Code %s  %s", s.claude_session_id or s.session_id, require("ctxd").observed_status(s))
    )
  end
  for _, w in ipairs(claude.waiting()) do
    health.info(string.format("Claude Code project of %s: %s", w.folder, w.reason))
  end
end

return M
