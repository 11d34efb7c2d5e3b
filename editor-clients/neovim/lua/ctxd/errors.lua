--- Turning a failed request into one sentence a person can act on: what could not be
--- done, why in plain words, and what to do, with no method names or error codes. Worded
--- as in the VS Code client (`src/errors.ts`); both are checked against
--- `editor-clients/fixtures/error-cases.json`.
local M = {}

M.METHOD_NOT_FOUND = -32601

---@param err table|string|nil a JSON-RPC error object (`code`, `message`) or a string
---@return boolean
function M.is_method_not_found(err)
  return type(err) == "table" and err.code == M.METHOD_NOT_FOUND
end

--- What each request does, as the user asked for it.
local ACTIONS = {
  ["ctx/compact"] = "compact the session",
  ["ctx/undoCompact"] = "undo the compaction",
  ["ctx/claudeCompact"] = "compact the Claude Code session",
  ["ctx/claudeUndo"] = "undo a compaction of the Claude Code session",
  ["ctx/context"] = "show the context",
  ["ctx/usage"] = "read the session's usage",
  ["ctx/setAutoCompactWindow"] = "save the auto-compact window",
  ["ctx/clear"] = "clear the session",
  ["ctx/observe"] = "follow the Claude Code sessions",
  ["ctx/searchHistory"] = "search the session's history",
  ["ctx/readHistory"] = "read the history record",
}

--- JSON-RPC codes a connection gives when the daemon went away mid-request.
local CONNECTION_LOST = { [-32099] = true, [-32098] = true, [-32097] = true, [-32096] = true }

local RESTARTS = "It restarts on its own; try again in a moment."

--- `text` as a sentence: trimmed, ending with a full stop.
local function sentence(text)
  local trimmed = vim.trim(text)
  return trimmed:match("[.!?]$") and trimmed or trimmed .. "."
end

--- A refusal of the Claude Code compaction or undo (`<transcript>: <why>; nothing was
--- written`): the why, that nothing changed, and what to do when Claude Code has the
--- session.
local function claude_refusal(why)
  local busy = why:find("is running for this session", 1, true) or why:find("has it open", 1, true)
  return sentence(why)
    .. " The transcript is as it was"
    .. (busy and "; quit Claude Code, or wait until it is done, then try again." or ".")
end

local function reason(method, err)
  local code = err.code
  local message = type(err.message) == "string" and err.message or vim.inspect(err)
  -- The Claude Code methods name the transcript first and say nothing was written last;
  -- the daemon's own refusals start with what failed, which the sentence says already.
  local why = message
    :gsub("^/.-%.jsonl: ", "", 1)
    :gsub("; nothing was written$", "")
    :gsub("^compaction failed: ", "")
    :gsub("^cannot undo: ", "")
  local data = type(err.data) == "table" and err.data.reason or nil
  if code == M.METHOD_NOT_FOUND then
    return "this ctxd is too old to do that. Update ctxd"
      .. (method == "ctx/claudeCompact" and ", or run /compact in Claude Code." or ".")
  elseif code == -33010 then
    if data == "nothingToUndo" then
      return "this session has no compaction to undo."
    elseif data == "newTurnSince" then
      return "a new turn came after it, and undoing it now would lose that turn."
    elseif why:find("is not ctxd's", 1, true) then
      return "the transcript does not end with a compaction by ctxd, so there is nothing of ctxd's to undo."
    end
    local after = why:match("^(%d+) lines? came after ctxd's compaction")
    if after then
      return string.format(
        "Claude Code wrote %s lines after ctxd's compaction, and undoing it would take them away. The transcript is as it was.",
        after
      )
    end
    return method == "ctx/claudeUndo" and claude_refusal(why) or sentence(why)
  elseif code == -33009 then
    return method == "ctx/claudeCompact" and claude_refusal(why) or (sentence(why) .. " Nothing was changed.")
  elseif code == -33008 then
    return "the session is busy (" .. message .. "). Try again when it is done."
  elseif code == -33001 then
    return "ctxd does not know this session (it may have been closed)."
  elseif code == -33007 then
    return "the session was closed."
  elseif code == -33002 or code == -33003 then
    return "ctxd could not read or write its store (" .. message .. "). The daemon's log has more."
  elseif code == -33005 or code == -32603 then
    return "something went wrong inside ctxd (" .. message .. "). The daemon's log has more."
  end
  local lost = code == nil
    and (
      message:find("exited before answering", 1, true)
      or message:find("disposed", 1, true)
      or message:find("got closed", 1, true)
    )
  if CONNECTION_LOST[code] or lost then
    return "ctxd stopped before it answered. " .. RESTARTS
  end
  if code == nil and vim.startswith(message, "ctxd is not running") then
    return "ctxd is not running right now. " .. RESTARTS
  end
  return sentence(message)
end

--- The one sentence shown when `method` failed with `err`.
---@param method string
---@param err table|string
---@return string
function M.describe(method, err)
  if type(err) ~= "table" then
    err = { message = tostring(err) }
  end
  return string.format("ctxd could not %s: %s", ACTIONS[method] or "do that", reason(method, err))
end

return M
