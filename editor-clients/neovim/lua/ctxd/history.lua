--- `:Ctxd history [query]`: search the current session's history, its compacted past
--- included (`ctx/searchHistory`), pick a hit (`vim.ui.select`), and read the record
--- whole with its neighbours (`ctx/readHistory`) in a scratch buffer. The session is an
--- agent plugin's current one, else the newest Claude Code session of the current
--- directory. A failed request becomes one error notification.
local client = require("ctxd.client")
local errors = require("ctxd.errors")
local sessions = require("ctxd.sessions")
local claude = require("ctxd.claude")

local M = {}

--- The session to search, as the daemon takes it, or nil (with a warning).
---@return string|nil
function M.target()
  local session = sessions.get()
  if session then
    return session.session_id
  end
  local observed = claude.get()
  if observed then
    -- Claude Code's own id finds the transcript whatever path the daemon was given.
    return observed.claude_session_id or observed.session_id
  end
  vim.notify(
    "ctxd: no session to search: no agent plugin opened one, and no Claude Code session was found for this directory.",
    vim.log.levels.WARN
  )
end

--- A hit as the picker shows it.
---@param hit table
---@return string
function M.hit_text(hit)
  local role = tostring(hit.role or "?"):gsub("_", " ")
  local where = hit.beforeCompaction and " · before compaction" or ""
  local snippet = tostring(hit.snippet or ""):gsub("%s+", " ")
  return string.format("%s%s  %s", role, where, snippet)
end

--- The lines of a read: each record under a heading, the record found marked.
---@param read table a `ctx/readHistory` answer
---@return string[]
function M.render(read)
  local lines = { "# History of " .. tostring(read.sessionId), "", "`" .. tostring(read.transcript) .. "`" }
  for _, r in ipairs(read.records or {}) do
    local marks = {}
    if r.beforeCompaction then
      table.insert(marks, "before compaction")
    end
    if r.target then
      table.insert(marks, "the record found")
    end
    local role = tostring(r.role):gsub("_", " ")
    table.insert(lines, "")
    table.insert(
      lines,
      string.format("## %s%s%s", r.target and "▶ " or "", role, r.timestamp and (" · " .. r.timestamp) or "")
    )
    table.insert(
      lines,
      "`" .. tostring(r.uuid) .. "`" .. (#marks > 0 and (" (" .. table.concat(marks, ", ") .. ")") or "")
    )
    table.insert(lines, "")
    vim.list_extend(lines, vim.split(tostring(r.text), "\n", { plain = true }))
  end
  if read.truncated then
    vim.list_extend(lines, { "", "> " .. read.truncated })
  end
  return lines
end

--- Reads `hit` whole and shows it in a scratch buffer in a split; `done(buf)`.
function M.open(hit, done)
  done = done or function() end
  client.request("ctx/readHistory", { sessionId = hit.sessionId, uuid = hit.uuid }, function(err, read)
    if err then
      vim.notify(errors.describe("ctx/readHistory", err), vim.log.levels.ERROR)
      return done(nil)
    end
    local buf = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_lines(buf, 0, -1, false, M.render(read))
    vim.bo[buf].modifiable = false
    vim.bo[buf].bufhidden = "wipe"
    vim.bo[buf].filetype = "markdown"
    pcall(vim.api.nvim_buf_set_name, buf, string.format("ctxd://history/%s/%s", hit.sessionId, hit.uuid))
    vim.cmd.split()
    vim.api.nvim_win_set_buf(0, buf)
    done(buf)
  end)
end

--- Searches the current session's history for `query` (asked for when empty), offers
--- the hits and opens the one picked. `done(buf|nil)` when it is over.
---@param query string|nil
---@param done? fun(buf: integer|nil)
function M.search(query, done)
  done = done or function() end
  local session_id = M.target()
  if not session_id then
    return done(nil)
  end
  local function run(q)
    if not q or vim.trim(q) == "" then
      return done(nil)
    end
    local params = { query = q, sessionId = session_id, limit = 50 }
    client.request("ctx/searchHistory", params, function(err, found)
      if err then
        vim.notify(errors.describe("ctx/searchHistory", err), vim.log.levels.ERROR)
        return done(nil)
      end
      local hits = type(found) == "table" and found.hits or {}
      if #hits == 0 then
        local notes = type(found.notes) == "table"
            and #found.notes > 0
            and (" (" .. table.concat(found.notes, "; ") .. ")")
          or ""
        vim.notify(string.format("ctxd: nothing found for %q%s.", q, notes), vim.log.levels.INFO)
        return done(nil)
      end
      vim.ui.select(hits, {
        prompt = string.format("ctxd: %d hits for %q", #hits, q),
        format_item = M.hit_text,
      }, function(choice)
        if not choice then
          return done(nil)
        end
        M.open(choice, done)
      end)
    end)
  end
  if query and vim.trim(query) ~= "" then
    run(query)
  else
    vim.ui.input({ prompt = "Search the session's history: " }, run)
  end
end

return M
