--- Claude Code sessions of the current directory, with no agent plugin: the daemon is
--- asked to observe the Claude Code project folder of the working directory
--- (`ctx/observe` with a `projectDir`) and publishes `ctx/usageChanged` for its newest
--- transcript and every one that appears later, under ids `observe-…`.
---
--- This module knows where Claude Code keeps a folder's transcripts, which observed id
--- is which transcript, and which observed session is the newest active one.
local M = {}

---@class ctxd.ObservedSession
---@field session_id string
---@field folder string
---@field project_dir string
---@field transcript? string
---@field claude_session_id? string
---@field model? string
---@field usage? ctxd.Usage
---@field seen integer order of the latest usage: the highest is the newest active

---@type table<string, ctxd.ObservedSession>
local observed = {}
---@type table<string, string> project dir → folder
local folders = {}
---@type table<string, { folder: string, project_dir: string, reason: string }>
local waiting = {}
---@type table<string, uv.uv_fs_event_t>
local watchers = {}
local counter = 0

--- Claude Code's configuration folder: `$CLAUDE_CONFIG_DIR`, else `~/.claude`.
---@return string
function M.config_dir()
  local configured = vim.env.CLAUDE_CONFIG_DIR
  if configured and configured ~= "" then
    return configured
  end
  return vim.fs.joinpath(vim.uv.os_homedir(), ".claude")
end

--- Where Claude Code writes the transcripts of sessions started in `cwd`: the path with
--- every character that is not an ASCII letter or digit replaced by `-`.
---@param cwd string
---@param config_dir? string
---@return string
function M.project_dir(cwd, config_dir)
  -- One `-` per character (not per byte) of a non-ASCII name.
  local name = cwd:gsub("[%z\1-\127\194-\244][\128-\191]*", function(c)
    return c:match("^%w$") and c or "-"
  end)
  return vim.fs.joinpath(config_dir or M.config_dir(), "projects", name)
end

--- The id the daemon publishes an observed transcript under: FNV-1a (64-bit) of its path.
---@param path string
---@return string
function M.observe_id(path)
  local ffi = require("ffi")
  local hash = ffi.new("uint64_t", 0xcbf29ce484222325ULL)
  local prime = ffi.new("uint64_t", 0x100000001b3ULL)
  for i = 1, #path do
    hash = bit.bxor(hash, path:byte(i)) * prime
  end
  return "observe-" .. bit.tohex(hash, 16)
end

---@param session_id string
---@return boolean
function M.is_observed_id(session_id)
  return vim.startswith(session_id, "observe-")
end

--- The model of the latest assistant record in the last 256 KB of `transcript`.
---@param transcript string
---@return string|nil
function M.transcript_model(transcript)
  local file = io.open(transcript, "rb")
  if not file then
    return nil
  end
  local size = file:seek("end")
  file:seek("set", math.max(0, size - 256 * 1024))
  local text = file:read("*a") or ""
  file:close()
  local lines = vim.split(text, "\n", { plain = true })
  for i = #lines, 1, -1 do
    local line = lines[i]
    if line:find('"assistant"', 1, true) then
      local ok, record = pcall(vim.json.decode, line)
      local model = ok and type(record) == "table" and type(record.message) == "table" and record.message.model
      if type(model) == "string" and model:sub(1, 1) ~= "<" then
        return model
      end
    end
  end
  return nil
end

local function transcripts(dir)
  local found = {}
  for name, kind in vim.fs.dir(dir) do
    if kind == "file" and name:match("%.jsonl$") then
      table.insert(found, name)
    end
  end
  return found
end

local function changed()
  vim.schedule(function()
    vim.api.nvim_exec_autocmds("User", { pattern = "CtxdSessionsChanged", modeline = false, data = {} })
    vim.cmd.redrawstatus({ bang = true })
  end)
end

--- Finds which project of this editor holds the transcript published as `session_id`.
local function locate(session_id)
  for project_dir, folder in pairs(folders) do
    for _, name in ipairs(transcripts(project_dir)) do
      local transcript = vim.fs.joinpath(project_dir, name)
      if M.observe_id(transcript) == session_id then
        return {
          session_id = session_id,
          folder = folder,
          project_dir = project_dir,
          transcript = transcript,
          claude_session_id = name:gsub("%.jsonl$", ""),
          seen = 0,
        }
      end
    end
  end
  return nil
end

--- A usage the daemon sent for an observed transcript (other projects' are ignored).
---@param session_id string
---@param usage ctxd.Usage
function M.set_usage(session_id, usage)
  local session = observed[session_id]
  if not session then
    session = locate(session_id)
    if not session then
      return
    end
    observed[session_id] = session
  end
  counter = counter + 1
  session.usage, session.seen = usage, counter
  if session.transcript then
    session.model = M.transcript_model(session.transcript) or session.model
  end
  changed()
end

local observe_folder

local function stop_watching(project_dir)
  local watcher = watchers[project_dir]
  if watcher then
    watcher:stop()
    watcher:close()
    watchers[project_dir] = nil
  end
end

--- Watches the project folder (or the nearest folder above it that exists) and observes
--- the project once a transcript is there.
local function watch_for_transcript(request, project_dir, folder)
  if watchers[project_dir] then
    return
  end
  local target = project_dir
  while not vim.uv.fs_stat(target) and vim.fs.dirname(target) ~= target do
    target = vim.fs.dirname(target)
  end
  local watcher = vim.uv.new_fs_event()
  if not watcher then
    return
  end
  local function look()
    if #transcripts(project_dir) > 0 then
      stop_watching(project_dir)
      observe_folder(request, folder)
    elseif target ~= project_dir and vim.uv.fs_stat(project_dir) then
      stop_watching(project_dir)
      watch_for_transcript(request, project_dir, folder)
    end
  end
  local ok = watcher:start(target, {}, vim.schedule_wrap(look))
  if ok ~= 0 then
    watcher:close()
    return
  end
  watchers[project_dir] = watcher
  look()
end

--- Asks the daemon to observe the Claude Code project of `folder`.
---@param request fun(method: string, params: table, callback: fun(err: table|nil, result: any))
---@param folder string
---@param retried? boolean whether this is the one retry after a failure with a transcript there
observe_folder = function(request, folder, retried)
  local project_dir = M.project_dir(folder)
  folders[project_dir] = folder
  request("ctx/observe", { projectDir = project_dir }, function(err, result)
    if err then
      local reason = err.message or vim.inspect(err)
      waiting[project_dir] = { folder = folder, project_dir = project_dir, reason = reason }
      changed()
      local log = require("ctxd.client").log
      if #transcripts(project_dir) == 0 then
        log("no Claude Code session for %s yet: %s", folder, reason)
        watch_for_transcript(request, project_dir, folder)
      elseif not retried then
        -- The transcript may have appeared just after the daemon looked: once more.
        observe_folder(request, folder, true)
      else
        -- Watching a folder whose transcript exists would ask again at once, without
        -- end: the next daemon start (`observe` of every known folder) tries again.
        log("cannot observe the Claude Code sessions of %s: %s", folder, reason)
      end
      return
    end
    waiting[project_dir] = nil
    require("ctxd.client").log("observing Claude Code sessions of %s (%s)", folder, project_dir)
    M.set_usage(result.sessionId, result.usage)
  end)
end

--- Observes `folder`'s Claude Code project (and again every folder known, after a restart).
---@param request fun(method: string, params: table, callback: fun(err: table|nil, result: any))
---@param folder? string
function M.observe(request, folder)
  local all = {}
  for _, f in pairs(folders) do
    all[f] = true
  end
  if folder then
    all[folder] = true
  end
  for f in pairs(all) do
    observe_folder(request, f)
  end
end

--- Every observed session, newest active first.
---@return ctxd.ObservedSession[]
function M.list()
  local list = vim.tbl_values(observed)
  table.sort(list, function(a, b)
    return a.seen > b.seen
  end)
  return list
end

---@param session_id? string default: the newest active
---@return ctxd.ObservedSession|nil
function M.get(session_id)
  if session_id then
    return observed[session_id]
  end
  return M.list()[1]
end

--- Folders with no observed session, and why.
function M.waiting()
  return vim.tbl_values(waiting)
end

--- Forgets everything (tests).
function M.reset()
  for dir in pairs(watchers) do
    stop_watching(dir)
  end
  observed, folders, waiting, counter = {}, {}, {}, 0
end

return M
