--- Claude Code sessions of the current directory, with no agent plugin: the daemon is
--- asked to observe the Claude Code project folder of the working directory
--- (`ctx/observe` with a `projectDir`) and publishes `ctx/usageChanged` for its
--- transcripts under ids `observe-…`. A later `:cd` moves to the new directory's project.
---
--- This module knows where Claude Code keeps a folder's transcripts, which observed id
--- is which transcript, and which observed session is shown: the one the user pinned
--- from the picker, else the one whose usage changed last.
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
---@type string|nil the session the user pinned from the picker
local pinned = nil

--- Claude Code's configuration folder: `$CLAUDE_CONFIG_DIR`, else `~/.claude`.
---@return string
function M.config_dir()
  local configured = vim.env.CLAUDE_CONFIG_DIR
  if configured and configured ~= "" then
    return configured
  end
  return vim.fs.joinpath(vim.uv.os_homedir(), ".claude")
end

--- The UTF-16 code units of a UTF-8 string, as the program's JavaScript sees a path: two
--- for a character outside the Basic Multilingual Plane; a byte that starts no valid
--- sequence counts as U+FFFD, one unit.
---@param s string
---@return integer[]
local function utf16_units(s)
  local units, i, n = {}, 1, #s
  while i <= n do
    local b = s:byte(i)
    local len = b < 0x80 and 1
      or (b >= 0xC2 and b <= 0xDF) and 2
      or (b >= 0xE0 and b <= 0xEF) and 3
      or (b >= 0xF0 and b <= 0xF4) and 4
      or 0
    local cp = len == 1 and b or nil
    if len > 1 and i + len - 1 <= n then
      cp = bit.band(b, bit.rshift(0x7F, len))
      for k = i + 1, i + len - 1 do
        local c = s:byte(k)
        if bit.band(c, 0xC0) ~= 0x80 then
          cp = nil
          break
        end
        cp = cp * 64 + bit.band(c, 0x3F)
      end
    end
    if not cp then
      table.insert(units, 0xFFFD)
      i = i + 1
    elseif cp >= 0x10000 then
      cp = cp - 0x10000
      table.insert(units, 0xD800 + math.floor(cp / 0x400))
      table.insert(units, 0xDC00 + cp % 0x400)
      i = i + len
    else
      table.insert(units, cp)
      i = i + len
    end
  end
  return units
end

--- Claude Code cuts a project folder's name at this many UTF-16 units (and adds a hash).
local FOLDER_NAME_MAX = 200

--- The name Claude Code gives the folder of the transcripts of sessions started in `cwd`:
--- each UTF-16 unit of the path that is not an ASCII letter or digit becomes `-` (two for
--- a character outside the Basic Multilingual Plane); past 200 units the name is cut and
--- given `-` and the base-36 of the path's 32-bit string hash. The cases the real program
--- gave are pinned in `editor-clients/fixtures/claude-project-folders.json`.
---@param cwd string
---@return string
function M.project_folder_name(cwd)
  local units = utf16_units(cwd)
  local chars = {}
  for i, u in ipairs(units) do
    local ascii_alnum = (u >= 48 and u <= 57) or (u >= 65 and u <= 90) or (u >= 97 and u <= 122)
    chars[i] = ascii_alnum and string.char(u) or "-"
  end
  if #units <= FOLDER_NAME_MAX then
    return table.concat(chars)
  end
  local hash = 0
  for _, u in ipairs(units) do
    hash = bit.tobit(hash * 31 + u)
  end
  local rest, digits = math.abs(hash), {}
  repeat
    local d = rest % 36
    table.insert(digits, 1, string.sub("0123456789abcdefghijklmnopqrstuvwxyz", d + 1, d + 1))
    rest = math.floor(rest / 36)
  until rest == 0
  return table.concat(chars, "", 1, FOLDER_NAME_MAX) .. "-" .. table.concat(digits)
end

--- Where Claude Code writes the transcripts of sessions started in `cwd`. The program
--- names the folder after the real path, so a directory entered through a symlink finds
--- the sessions started in the one it points to.
---@param cwd string
---@param config_dir? string
---@return string
function M.project_dir(cwd, config_dir)
  local real = vim.uv.fs_realpath(cwd) or cwd
  return vim.fs.joinpath(config_dir or M.config_dir(), "projects", M.project_folder_name(real))
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
    if folders[project_dir] ~= folder then
      return -- forgotten meanwhile (the directory changed)
    end
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

---@param session_id? string default: the shown one (pinned, else the newest active)
---@return ctxd.ObservedSession|nil
function M.get(session_id)
  if session_id then
    return observed[session_id]
  end
  return (pinned and observed[pinned]) or M.list()[1]
end

--- Shows `session_id` from now on, whichever session changes; nil follows the newest again.
---@param session_id string|nil
function M.pin(session_id)
  pinned = session_id
  changed()
end

---@return string|nil the pinned session's id
function M.pinned()
  return pinned
end

---@class ctxd.ListedTranscript
---@field transcript string
---@field folder string
---@field project_dir string
---@field claude_session_id string
---@field modified number last written (seconds since the epoch, with fractions)
---@field session? ctxd.ObservedSession

--- Every transcript of the observed project folders, newest written first: the files on
--- disk, so that every editor on the folder lists the same sessions.
---@return ctxd.ListedTranscript[]
function M.listed()
  local list = {}
  for project_dir, folder in pairs(folders) do
    for _, name in ipairs(transcripts(project_dir)) do
      local transcript = vim.fs.joinpath(project_dir, name)
      local stat = vim.uv.fs_stat(transcript)
      if stat then
        table.insert(list, {
          transcript = transcript,
          folder = folder,
          project_dir = project_dir,
          claude_session_id = (name:gsub("%.jsonl$", "")),
          modified = stat.mtime.sec + stat.mtime.nsec / 1e9,
          session = observed[M.observe_id(transcript)],
        })
      end
    end
  end
  table.sort(list, function(a, b)
    if a.modified ~= b.modified then
      return a.modified > b.modified
    end
    return a.transcript < b.transcript
  end)
  return list
end

--- The observed session of a listed transcript: asks the daemon to follow that one
--- transcript when it has sent no usage for it yet (an older session it does not follow).
---@param request fun(method: string, params: table, callback: fun(err: table|nil, result: any))
---@param listed ctxd.ListedTranscript
---@param callback fun(err: table|nil, session: ctxd.ObservedSession|nil)
function M.follow(request, listed, callback)
  local known = observed[M.observe_id(listed.transcript)]
  if known and known.usage then
    return callback(nil, known)
  end
  request("ctx/observe", { transcript = listed.transcript }, function(err, result)
    if err then
      return callback(err, nil)
    end
    M.set_usage(result.sessionId, result.usage)
    local session = observed[result.sessionId]
    if not session then
      return callback(
        { message = "the daemon followed " .. listed.transcript .. " under an id this editor cannot place" },
        nil
      )
    end
    callback(nil, session)
  end)
end

--- Forgets every folder but those in `keep` (the directory changed, or observing was
--- turned off): their sessions, watchers and reasons, and the pin if it was one of
--- theirs. The daemon keeps following them; their usage is ignored from now on.
---@param keep? string[]
function M.forget(keep)
  local kept = {}
  for _, f in ipairs(keep or {}) do
    kept[f] = true
  end
  for project_dir, folder in pairs(vim.deepcopy(folders)) do
    if not kept[folder] then
      folders[project_dir], waiting[project_dir] = nil, nil
      stop_watching(project_dir)
      for id, session in pairs(vim.deepcopy(observed)) do
        if session.project_dir == project_dir then
          observed[id] = nil
        end
      end
    end
  end
  if pinned and not observed[pinned] then
    pinned = nil
  end
  changed()
end

--- The current directory became `dir` (`DirChanged`): its Claude Code project is observed
--- in place of the one before.
---@param request fun(method: string, params: table, callback: fun(err: table|nil, result: any))
---@param dir string
function M.moved_to(request, dir)
  if folders[M.project_dir(dir)] == dir then
    return
  end
  M.forget({})
  observe_folder(request, dir)
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
  observed, folders, waiting, counter, pinned = {}, {}, {}, 0, nil
end

return M
