--- Running the daemon: a `vim.lsp` client named `ctxd` attached to no buffer, restarted
--- with back-off when the daemon dies. Requests wait in a queue while the daemon starts
--- and while the sessions this editor had open are resumed after a restart.
local config_mod = require("ctxd.config")
local errors = require("ctxd.errors")
local sessions = require("ctxd.sessions")

local M = {}

--- How long a stopped daemon has to exit (then after SIGKILL), in milliseconds.
local RETIRE_GRACE_MS = 3000

---@class ctxd.ClientState
local state = {
  ---@type ctxd.Config|nil
  config = nil,
  client_id = nil, ---@type integer|nil
  ready = false, -- initialized and sessions resumed
  stopping = false,
  queue = {}, ---@type { method: string, params: table, callback: function }[]
  inflight = {}, ---@type table<integer, fun(err: table)> callbacks of sent requests, failed if the daemon exits
  capabilities = nil, ---@type table|nil capabilities.experimental.ctxd
  failures = 0,
  started_at = 0,
  starts = 0,
  restart_timer = nil,
  --- Set while the daemon is down after a failed start or an exit: why, and when the
  --- next start is due. Requests fail at once meanwhile.
  --- `cause`: the reason without the daemon's stderr, for the statusline.
  down = nil, ---@type { reason: string, cause: string, retry_at: integer }|nil
  notified = false, -- the user was told of this down period
  last_exit = nil, ---@type { code: integer, signal: integer }|nil
  log = {}, ---@type string[] the client's own log of start attempts (`:CtxdLog`)
  observing = false, -- Claude Code projects were asked for once
  --- The file the daemon's stderr goes to (its messages before its log is set up, a
  --- panic): quoted in failure messages and shown by `:CtxdLog`. Truncated at each start.
  stderr_file = nil, ---@type string|nil
}
M.state = state

--- Adds a line to the client's own log (`:CtxdLog` shows it).
---@param fmt string
function M.log(fmt, ...)
  table.insert(state.log, os.date("%H:%M:%S ") .. string.format(fmt, ...))
  if #state.log > 500 then
    table.remove(state.log, 1)
  end
end

--- Why `bin` cannot be started, or nil when it can.
---@param bin string
---@return string|nil
function M.executable_problem(bin)
  if vim.fn.executable(bin) == 1 then
    return nil
  end
  if bin:find("/", 1, true) then
    local stat = vim.uv.fs_stat(bin)
    if not stat then
      return "not found: " .. bin .. " does not exist"
    elseif stat.type == "directory" then
      return "not found: " .. bin .. " is a directory"
    end
    return "not executable: " .. bin .. " (chmod +x it, or set bin in setup())"
  end
  return string.format('not found: "%s" is not on PATH; set bin in setup()', bin)
end

--- Keeps `sessions` in step with what a request did.
local function track(method, params, err, result)
  if method == "ctx/openSession" and not err and result then
    sessions.opened(result.sessionId, params.cwd, params.model, result.usage)
  elseif method == "ctx/closeSession" and (not err or err.code == -33001) then
    sessions.closed(params.sessionId)
  elseif method == "ctx/clear" and not err and result then
    sessions.cleared(params.sessionId, result.sessionId, result.usage)
  end
end

local function send(method, params, callback)
  local client = state.client_id and vim.lsp.get_client_by_id(state.client_id)
  if not client then
    table.insert(state.queue, { method = method, params = params, callback = callback })
    return
  end
  local token = {}
  local ok = client:request(method, params, function(err, result)
    state.inflight[token] = nil
    track(method, params, err, result)
    callback(err, result)
  end)
  if ok then
    state.inflight[token] = function(err)
      callback(err, nil)
    end
  else
    callback({ message = "ctxd is not running; " .. method .. " was not sent" }, nil)
  end
end

--- Answers every request the dead daemon will never answer.
local function fail_inflight()
  local inflight = state.inflight
  state.inflight = {}
  for _, fail in pairs(inflight) do
    fail({ message = "ctxd exited before answering; retry once it has restarted" })
  end
end

local function flush_queue()
  local queued = state.queue
  state.queue = {}
  for _, q in ipairs(queued) do
    send(q.method, q.params, q.callback)
  end
end

--- The daemon is initialized and the sessions resumed: requests go out from now on, and
--- the Claude Code projects are observed (again).
local function became_ready()
  state.ready = true
  if state.down then
    M.log("ctxd is running again")
  end
  state.down, state.notified = nil, false
  flush_queue()
  if state.config.observe_claude_code then
    require("ctxd.claude").observe(M.request, not state.observing and vim.fn.getcwd() or nil)
    state.observing = true
  else
    -- Turned off by a later setup(): what was shown before goes.
    require("ctxd.claude").forget({})
    state.observing = false
  end
  vim.cmd.redrawstatus({ bang = true })
end

--- Resumes every tracked session on a (re)started daemon, then sends what was queued.
local function resume_sessions()
  local list = sessions.list()
  local pending = #list
  if pending == 0 then
    became_ready()
    return
  end
  for _, s in ipairs(list) do
    send("ctx/openSession", { cwd = s.cwd, model = s.model, sessionId = s.session_id }, function()
      pending = pending - 1
      if pending == 0 then
        became_ready()
      end
    end)
  end
end

local function notify(message, level)
  if state.config and state.config.notify_compaction then
    vim.notify(message, level)
  end
end

local handlers = {
  ["ctx/usageChanged"] = function(_, params)
    if require("ctxd.claude").is_observed_id(params.sessionId) then
      require("ctxd.claude").set_usage(params.sessionId, params.usage)
    else
      sessions.set_usage(params.sessionId, params.usage)
    end
  end,
  ["ctx/compacted"] = function(_, params)
    -- A manual compaction was asked for with ctx/compact, whose caller reports it
    -- (:CtxdCompact does); the daemon compacting on its own is news.
    if params.trigger ~= "manual" then
      notify(
        string.format(
          "ctxd: compacted (%s) %s → %s tokens",
          params.trigger,
          require("ctxd.render").format_count(params.preTokens),
          require("ctxd.render").format_count(params.postTokens)
        ),
        vim.log.levels.INFO
      )
    end
    vim.api.nvim_exec_autocmds("User", { pattern = "CtxdCompacted", data = params })
  end,
  ["ctx/compactFailed"] = function(_, params)
    notify("ctxd: compaction failed: " .. params.reason, vim.log.levels.WARN)
    vim.api.nvim_exec_autocmds("User", { pattern = "CtxdCompactFailed", data = params })
  end,
  ["ctx/contextChanged"] = function(_, params)
    vim.api.nvim_exec_autocmds("User", { pattern = "CtxdContextChanged", data = params })
  end,
}

local start

--- The delay before the next start: doubling, reset after a stable run.
local function next_delay()
  local r = state.config.restart
  if vim.uv.now() - state.started_at >= r.stable_ms then
    state.failures = 0
  end
  local delay = math.min(r.max_ms, r.initial_ms * 2 ^ state.failures)
  state.failures = state.failures + 1
  return delay
end

--- The daemon is down for `reason`: requests fail at once, the user is told once, and
--- the next start is scheduled with back-off.
local function went_down(reason, cause)
  state.client_id, state.ready, state.capabilities = nil, false, nil
  fail_inflight()
  local queued = state.queue
  state.queue = {}
  if state.stopping then
    state.down = nil
    for _, q in ipairs(queued) do
      q.callback({ message = "ctxd was stopped" }, nil)
    end
    vim.cmd.redrawstatus({ bang = true })
    return
  end
  local delay = next_delay()
  state.down = { reason = reason, cause = cause or reason, retry_at = vim.uv.now() + delay }
  M.log("%s; next start in %.1f s", reason, delay / 1000)
  for _, q in ipairs(queued) do
    q.callback({ message = M.down_text() }, nil)
  end
  if not state.notified then
    state.notified = true
    vim.notify(
      string.format("%s; retrying in %d s (:CtxdLog for details)", reason, math.ceil(delay / 1000)),
      vim.log.levels.ERROR
    )
  end
  vim.cmd.redrawstatus({ bang = true })
  state.restart_timer = vim.defer_fn(function()
    state.restart_timer = nil
    if not state.stopping and not state.client_id then
      start()
    end
  end, delay)
end

--- How many of the daemon's last stderr lines a failure message quotes.
local STDERR_LINES = 5

--- The daemon's last stderr lines (none when it wrote nothing there).
---@param count? integer default: the lines a failure message quotes
---@return string[]
function M.stderr_tail(count)
  count = count or STDERR_LINES
  local file = state.stderr_file and io.open(state.stderr_file, "r")
  if not file then
    return {}
  end
  local lines = {}
  for line in file:lines() do
    if line ~= "" then
      table.insert(lines, line)
      if #lines > count then
        table.remove(lines, 1)
      end
    end
  end
  file:close()
  return lines
end

--- Why the daemon is down and when it starts again, in one line (nil while it is not down).
---@return string|nil
function M.down_text()
  if not state.down then
    return nil
  end
  local seconds = math.max(0, math.ceil((state.down.retry_at - vim.uv.now()) / 1000))
  return string.format("ctxd is down (%s); next start in %d s", state.down.reason, seconds)
end

local function on_exit(client_id)
  if client_id ~= state.client_id then
    return
  end
  local exit = state.last_exit or { code = 0, signal = 0 }
  state.last_exit = nil
  local how = exit.signal ~= 0 and ("was killed by signal " .. exit.signal) or ("exited with code " .. exit.code)
  local cause = state.ready and ("ctxd " .. how) or ("ctxd " .. how .. " while starting")
  local tail = M.stderr_tail()
  went_down(#tail > 0 and (cause .. ": " .. table.concat(tail, " | ")) or cause, cause)
end

--- `cmd` for `vim.lsp.start`: the command, run so that its exit status is kept here and
--- Neovim's own exit warning (which points at an lsp.log the user may not have) is not
--- shown; the reason goes to one message of ours instead. Its stderr goes to a file of
--- this editor's (`vim.lsp` would put it in lsp.log only): `sh` opens the file and
--- `exec`s the daemon, which keeps the process id.
local function lsp_cmd(config)
  if type(config.cmd) ~= "table" then
    return config.cmd
  end
  state.stderr_file = state.stderr_file or vim.fn.tempname()
  local cmd = { "/bin/sh", "-c", 'f=$1; shift; exec "$@" 2>"$f"', "sh", state.stderr_file }
  vim.list_extend(cmd, config.cmd)
  return function(dispatchers)
    local mine = setmetatable({
      on_exit = function(code, signal)
        state.last_exit = { code = code, signal = signal }
        dispatchers.on_exit(0, 0)
      end,
    }, { __index = dispatchers })
    return vim.lsp.rpc.start(cmd, mine, { env = config.cmd_env })
  end
end

start = function()
  local config = assert(state.config, "ctxd: setup() was not called")
  state.ready, state.capabilities = false, nil
  state.started_at = vim.uv.now()
  state.starts = state.starts + 1
  if type(config.cmd) == "table" then
    M.log("starting %s", table.concat(config.cmd, " "))
    local problem = M.executable_problem(config.cmd[1])
    if problem then
      return went_down("ctxd " .. problem)
    end
  end
  local client_id = vim.lsp.start({
    name = "ctxd",
    cmd = lsp_cmd(config),
    init_options = config_mod.init_options(config),
    handlers = handlers,
    on_init = function(_, result)
      state.capabilities = vim.tbl_get(result or {}, "capabilities", "experimental", "ctxd")
      M.log("initialized (ctxd %s)", vim.tbl_get(result or {}, "serverInfo", "version") or "?")
      resume_sessions()
    end,
    on_exit = function(_, _, id)
      vim.schedule(function()
        on_exit(id)
      end)
    end,
  }, { attach = false, silent = true })
  state.client_id = client_id
  if not client_id then
    went_down("ctxd could not be started (vim.lsp.start failed)")
  end
end

--- Starts the daemon with `config` (stopping one already running).
---@param config ctxd.Config
function M.start(config)
  state.config = config
  state.stopping = false
  state.failures = 0
  state.notified = false
  if state.restart_timer then
    state.restart_timer:stop()
    state.restart_timer = nil
  end
  if state.client_id then
    M.stop(function()
      state.stopping = false
      start()
    end)
  else
    start()
  end
end

--- Sends `method` with `params`; `callback(err, result)` gets the answer. Requests wait
--- while the daemon starts or restarts.
---@param method string
---@param params table
---@param callback? fun(err: table|nil, result: any)
function M.request(method, params, callback)
  callback = callback or function() end
  if not state.config then
    callback({ code = -32099, message = "ctxd is not set up: call require('ctxd').setup()" }, nil)
    return
  end
  if not state.ready then
    if state.down then
      -- Down after a failure: say so now rather than after the back-off.
      callback({ message = M.down_text() }, nil)
      return
    end
    table.insert(state.queue, { method = method, params = params, callback = callback })
    return
  end
  send(method, params, callback)
end

--- Sends a notification (e.g. `workspace/didChangeConfiguration`) if the daemon runs.
function M.notify(method, params)
  local client = state.client_id and vim.lsp.get_client_by_id(state.client_id)
  return client ~= nil and client:notify(method, params)
end

--- Stops the daemon without restarting it; `on_stopped` runs once it exited.
---@param on_stopped? fun()
function M.stop(on_stopped)
  state.stopping = true
  if state.restart_timer then
    state.restart_timer:stop()
    state.restart_timer = nil
  end
  local client = state.client_id and vim.lsp.get_client_by_id(state.client_id)
  if not client then
    state.client_id = nil
    if on_stopped then
      on_stopped()
    end
    return
  end
  -- The next daemon must not start before this one has exited: it would find the store
  -- still locked and refuse. The process gets RETIRE_GRACE_MS, then SIGKILL and as long.
  local pid = M.pid()
  local deadline, killed = vim.uv.now() + RETIRE_GRACE_MS, false
  client:stop()
  local timer = assert(vim.uv.new_timer())
  timer:start(
    50,
    50,
    vim.schedule_wrap(function()
      local alive = pid ~= nil and vim.uv.kill(pid, 0) == 0
      if alive and not killed and vim.uv.now() >= deadline then
        vim.uv.kill(pid, "sigkill")
        deadline, killed = vim.uv.now() + RETIRE_GRACE_MS, true
      end
      local stopped = client:is_stopped() or not vim.lsp.get_client_by_id(client.id)
      if stopped and (not alive or (killed and vim.uv.now() >= deadline)) then
        timer:stop()
        timer:close()
        state.client_id = nil
        if on_stopped then
          on_stopped()
        end
      end
    end)
  )
end

--- True when the daemon is initialized and the sessions resumed.
function M.is_ready()
  return state.ready
end

--- Pid of the daemon process: the `processId` it announced in `initialize`, else (a
--- daemon too old to announce it) found among Neovim's children by the command's name.
---@return integer|nil
function M.pid()
  if not state.config or not state.client_id then
    return nil
  end
  if state.capabilities and type(state.capabilities.processId) == "number" then
    return state.capabilities.processId
  end
  if type(state.config.cmd) ~= "table" then
    return nil
  end
  -- The kernel keeps the first 15 characters of a process name.
  local name = vim.fs.basename(state.config.cmd[1]):sub(1, 15)
  for _, pid in ipairs(vim.api.nvim_get_proc_children(vim.fn.getpid())) do
    local proc = vim.api.nvim_get_proc(pid)
    if proc and proc.name == name then
      return pid
    end
  end
  return nil
end

--- The daemon's log file named on a process's command line (`--log-file`), read from
--- `/proc` (nil elsewhere, or when it logs to stderr or to its default file).
---@param pid integer
---@return string|nil path, boolean|nil to_stderr
local function log_of_process(pid)
  local file = io.open("/proc/" .. pid .. "/cmdline", "rb")
  if not file then
    return nil
  end
  local args = vim.split(file:read("*a") or "", "\0", { plain = true })
  file:close()
  return config_mod.log_file_arg(args), vim.tbl_contains(args, "--log-stderr")
end

---@class ctxd.StoreHolder
---@field pid integer the daemon holding the store
---@field log? string its log file, when known
---@field log_to_stderr? boolean it logs to the editor that started it

--- When this editor's `ctxd serve` relays to a daemon another editor started on the same
--- store (the store's lock is held by another process): that daemon. Its pid comes from
--- `<state dir>/ctxd.lock`, else from the relay's log line; its log from its command line.
---@return ctxd.StoreHolder|nil
function M.store_holder()
  local caps = state.capabilities
  if not caps or type(caps.stateDir) ~= "string" then
    return nil
  end
  local mine = type(caps.processId) == "number" and caps.processId or M.pid()
  local holder
  local lock = io.open(vim.fs.joinpath(caps.stateDir, "ctxd.lock"), "r")
  if lock then
    holder = tonumber(vim.trim(lock:read("*a") or ""))
    lock:close()
  end
  if not holder then
    local log = config_mod.log_path(state.config, caps.stateDir)
    for _, line in ipairs(log and vim.fn.filereadable(log) == 1 and vim.fn.readfile(log) or {}) do
      holder = tonumber(
        line:match("relaying to it.*holder=Some%((%d+)%)") or line:match("holder=Some%((%d+)%).*relaying to it") or ""
      ) or holder
    end
  end
  if not holder or holder == mine then
    return nil
  end
  local log, to_stderr = log_of_process(holder)
  if not log and not to_stderr and vim.uv.fs_stat("/proc/" .. holder) then
    log = vim.fs.joinpath(caps.stateDir, "logs", "ctxd.log") -- its default
  end
  return { pid = holder, log = log, log_to_stderr = to_stderr }
end

M.describe_error = errors.describe

return M
