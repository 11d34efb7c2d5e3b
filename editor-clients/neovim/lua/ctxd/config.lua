--- Options of `require("ctxd").setup()`, their defaults, and what the daemon is started
--- with.
local M = {}

---@class ctxd.Config
---@field cmd? string[]|function Command that runs the daemon on stdio. Default: `{ bin, "serve", "--log-file", log_file }` (plus `--state-dir` when set). A function is passed to `vim.lsp.start` as is (an in-process server, e.g. in tests).
---@field bin string The `ctxd` executable, used when `cmd` is not given.
---@field log_file string Where the default `cmd` logs; what `:CtxdLog` opens.
---@field state_dir? string The daemon's store directory (sent as `initializationOptions.stateDir`).
---@field settings table Daemon settings (`initializationOptions.settings`), e.g. `{ autoCompactWindow = 200000 }`.
---@field cmd_env? table Extra environment for the daemon, e.g. `{ CTXD_LOG = "debug" }`.
---@field restart { initial_ms: integer, max_ms: integer, stable_ms: integer } Back-off when the daemon dies: doubling from `initial_ms` to `max_ms`, reset after `stable_ms` of uptime.
---@field notify_compaction boolean Show `ctx/compacted` and `ctx/compactFailed` with `vim.notify`.
---@field observe_claude_code boolean Show the Claude Code sessions of the current directory (the daemon observes `~/.claude/projects/<cwd>`, or under `$CLAUDE_CONFIG_DIR`).
M.defaults = {
  cmd = nil,
  bin = "ctxd",
  log_file = vim.fs.joinpath(vim.fn.stdpath("log"), "ctxd.log"),
  state_dir = nil,
  settings = {},
  cmd_env = nil,
  restart = { initial_ms = 500, max_ms = 30000, stable_ms = 60000 },
  notify_compaction = true,
  observe_claude_code = true,
}

--- Merges `opts` over the defaults and fills in `cmd`.
---@param opts? table
---@return ctxd.Config
function M.resolve(opts)
  local config = vim.tbl_deep_extend("force", vim.deepcopy(M.defaults), opts or {})
  if opts and opts.settings then
    config.settings = opts.settings -- replace, do not merge list-like tables
  end
  if not config.cmd then
    config.cmd = { config.bin, "serve", "--log-file", config.log_file }
    if config.state_dir then
      vim.list_extend(config.cmd, { "--state-dir", config.state_dir })
    end
  end
  return config
end

--- `initializationOptions`: empty tables are left out (they would encode as `[]`).
---@param config ctxd.Config
---@return table|nil
function M.init_options(config)
  local options = {}
  if config.state_dir then
    options.stateDir = config.state_dir
  end
  if config.settings and next(config.settings) ~= nil then
    options.settings = config.settings
  end
  return next(options) ~= nil and options or nil
end

--- The log file a `ctxd` command line names (`--log-file FILE` or `--log-file=FILE`).
---@param args string[]
---@return string|nil
function M.log_file_arg(args)
  for i, arg in ipairs(args) do
    if arg == "--log-file" and args[i + 1] then
      return args[i + 1]
    end
    local value = arg:match("^%-%-log%-file=(.+)$")
    if value then
      return value
    end
  end
  return nil
end

--- The daemon's log file: `--log-file` of `cmd` (or `log_file` for the default
--- command), else `<stateDir>/logs/ctxd.log` as the daemon announced its state dir.
---@param config ctxd.Config
---@param state_dir? string the `stateDir` from the daemon's capabilities
---@return string|nil
function M.log_path(config, state_dir)
  local named = M.log_file_arg(type(config.cmd) == "table" and config.cmd or {})
  if named then
    return named
  end
  if state_dir then
    return vim.fs.joinpath(state_dir, "logs", "ctxd.log")
  end
  return nil
end

return M
