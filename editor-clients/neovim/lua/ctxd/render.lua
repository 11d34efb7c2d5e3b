--- Everything the user sees about a session, as pure functions of the daemon's usage
--- object (and of the `ctx/context` answer). No thresholds are recomputed here: the
--- daemon already says the level, the percentages and the tokens left.
---
--- The VS Code client has the same functions in `src/render.ts`; both are checked
--- against `editor-clients/fixtures/render-cases.json`, so the two editors show the
--- same strings for the same usage.
local M = {}

---@alias ctxd.Level "ok"|"warning"|"compacting"|"blocked"

---@class ctxd.Usage
---@field tokens integer
---@field reportedTokens integer
---@field estimatedTokens integer
---@field window integer
---@field effectiveWindow integer
---@field threshold integer
---@field warning integer
---@field blocked integer
---@field percentUsed number
---@field percentUntilCompact number
---@field tokensUntilCompact integer
---@field level ctxd.Level
---@field autoCompactEnabled boolean
---@field breakdown table
---@field cache? table the prompt cache when the daemon knows it (warm, secondsLeft, recacheTokens, …)

--- `50060` -> `50,060`.
---@param n number
---@return string
function M.format_count(n)
  local digits = string.format("%d", math.floor(n))
  local formatted = digits:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (formatted:gsub("^,", ""))
end

--- Short token counts: `999`, `16.9k`, `1.2M`, rounding half up at the tenth with
--- integer arithmetic so that Lua and JavaScript agree on every input.
---@param n number
---@return string
function M.format_tokens(n)
  n = math.floor(n)
  if n < 1000 then
    return tostring(n)
  end
  local tenths_k = math.floor((n + 50) / 100)
  if tenths_k < 10000 then
    return string.format("%d.%dk", math.floor(tenths_k / 10), tenths_k % 10)
  end
  local tenths_m = math.floor((n + 50000) / 100000)
  return string.format("%d.%dM", math.floor(tenths_m / 10), tenths_m % 10)
end

local function percent(p)
  return string.format("%.1f", p)
end

local function dollars(usd)
  return usd < 0.005 and "<$0.01" or string.format("~$%.2f", usd)
end

--- What a cold prompt cache costs and the fix, as `ctxd statusline` says it:
--- `cache cold: next turn re-writes 612.0k tokens (~$3.06); /compact is instant (summary ready)`.
--- Empty while the cache is warm (the daemon says when that ends; no countdown here).
---@param cache? table
---@return string
function M.cache_text(cache)
  if type(cache) ~= "table" or cache.warm then
    return ""
  end
  local text = "cache cold"
  if type(cache.recacheTokens) == "number" then
    text = text .. ": next turn re-writes " .. M.format_tokens(cache.recacheTokens) .. " tokens"
    if type(cache.recacheCostUsd) == "number" then
      text = text .. " (" .. dollars(cache.recacheCostUsd) .. ")"
    end
  end
  if cache.summaryReady == true then
    text = text .. "; /compact is instant (summary ready)"
  end
  return text
end

--- The status text shared by both editors, e.g. `ctx 50.1% · 16.9k to compact`.
---@param usage ctxd.Usage
---@return string
function M.status_text(usage)
  local used = "ctx " .. percent(usage.percentUsed) .. "%"
  if usage.level == "compacting" then
    return used .. " · compacting"
  elseif usage.level == "blocked" then
    return used .. " · blocked"
  elseif not usage.autoCompactEnabled then
    return used .. " · auto-compact off"
  end
  return used .. " · " .. M.format_tokens(usage.tokensUntilCompact) .. " to compact"
end

--- Highlight group for a level (linked to the Diagnostic groups in `setup`).
---@param level ctxd.Level
---@return string
function M.level_highlight(level)
  return ({ ok = "CtxdOk", warning = "CtxdWarning", compacting = "CtxdCompacting", blocked = "CtxdBlocked" })[level]
    or "CtxdOk"
end

--- Levels, window and threshold, one `{label, value}` row each.
---@param usage ctxd.Usage
---@return string[][]
function M.summary_rows(usage)
  local f = M.format_count
  local auto_compact_at = f(usage.threshold)
  if not usage.autoCompactEnabled then
    auto_compact_at = auto_compact_at .. " (auto-compact off)"
  end
  return {
    { "Level", usage.level },
    {
      "Tokens",
      string.format(
        "%s (reported %s, estimated %s)",
        f(usage.tokens),
        f(usage.reportedTokens),
        f(usage.estimatedTokens)
      ),
    },
    { "Used", percent(usage.percentUsed) .. "% of the window" },
    { "Window", string.format("%s (effective %s)", f(usage.window), f(usage.effectiveWindow)) },
    { "Warning at", f(usage.warning) },
    { "Auto-compact at", auto_compact_at },
    { "Blocked at", f(usage.blocked) },
    {
      "Until compaction",
      -- With auto-compact off nothing compacts at the threshold: no count-down to show.
      usage.autoCompactEnabled
          and string.format("%s (%s%%)", f(usage.tokensUntilCompact), percent(usage.percentUntilCompact))
        or "none (auto-compact off)",
    },
  }
end

--- Where the tokens go, one `{label, tokens}` row per category.
---@param usage ctxd.Usage
---@return string[][]
function M.breakdown_rows(usage)
  local b = usage.breakdown
  local rows = {
    { "System prompt", b.systemPrompt },
    { "Tools", b.tools },
    { "Memory files", b.memoryFiles },
    { "Skills", b.skills },
    { "Messages: tool results", b.messages.toolResults },
    { "Messages: summaries", b.messages.summaries },
    { "Messages: other", b.messages.other },
    { "Free space", b.freeSpace },
    { "Autocompact buffer", b.autocompactBuffer },
  }
  return vim.tbl_map(function(row)
    return { row[1], M.format_count(row[2]) }
  end, rows)
end

--- Memory files as `{path, kind, tokens, status}`.
---@param context { memoryFiles: table[] }
---@return string[][]
function M.memory_file_rows(context)
  return vim.tbl_map(function(f)
    return { f.path, f.kind, M.format_count(f.tokens), f.status }
  end, context.memoryFiles)
end

--- Rules waiting for a matching path, as `{path, globs}`.
---@param context { pendingRules: table[] }
---@return string[][]
function M.pending_rule_rows(context)
  return vim.tbl_map(function(r)
    return { r.path, table.concat(r.paths, ", ") }
  end, context.pendingRules)
end

--- Read files and git, one `{label, value}` row each.
---@param context { filesRead: integer, staleFiles?: string[], git: boolean }
---@return string[][]
function M.context_rows(context)
  return {
    { "Files read", M.format_count(context.filesRead) },
    { "Changed since read", M.format_count(type(context.staleFiles) == "table" and #context.staleFiles or 0) },
    { "Git snapshot", context.git and "yes" or "no" },
  }
end

--- Dollars as `ctxd claude stats` writes them: `$1.20`, `<$0.01` under half a cent.
--- Rounded to whole cents with integer arithmetic, so Lua and JavaScript agree.
---@param usd number
---@return string
function M.format_usd(usd)
  if usd > 0 and usd < 0.005 then
    return "<$0.01"
  end
  local cents = math.floor(math.max(usd, 0) * 100 + 0.5)
  return string.format("$%d.%02d", math.floor(cents / 100), cents % 100)
end

--- A Claude Code session's instant compaction in one line:
--- `prepared 2× $0.41 · saved 1 compaction ~$1.20`.
---@param stats { preparations: integer, preparationUsd: number, instantCompactions: integer, savedUsd: number }
---@return string
function M.instant_compaction_text(stats)
  local compactions = stats.instantCompactions == 1 and "compaction" or "compactions"
  return string.format(
    "prepared %d× %s · saved %d %s ~%s",
    stats.preparations,
    M.format_usd(stats.preparationUsd),
    stats.instantCompactions,
    compactions,
    M.format_usd(stats.savedUsd)
  )
end

local WINDOW_SOURCES = {
  env = "CLAUDE_CODE_AUTO_COMPACT_WINDOW overrides saved windows",
  setting = "from settings",
  client = "from the editor's initializationOptions",
  experiment = "from an experiment",
  modelDefault = "the model's own window",
  subagentCeiling = "held to the subagent ceiling",
}

--- Why the window in force is not the one asked for (the answer's `reason`), as the VS
--- Code client words it.
---@param result { window: integer, requested?: integer, reason: string }
---@return string
function M.window_reason_text(result)
  return string.format(
    "ctxd: window %s, not %s: %s.",
    M.format_count(result.window),
    M.format_count(result.requested or result.window),
    result.reason
  )
end

--- What `ctx/setAutoCompactWindow` answered, in one sentence: the window now in force
--- and where it comes from (its `warnings` are shown on their own).
---@param result { model: string, window: integer, source: string, warnings?: string[] }
---@return string
function M.window_result_text(result)
  return string.format(
    "ctxd: auto-compact window for %s is %s tokens (%s).",
    result.model,
    M.format_count(result.window),
    WINDOW_SOURCES[result.source] or result.source
  )
end

--- Rows as aligned text lines, indented by two spaces.
---@param rows string[][]
---@return string[]
local function aligned(rows)
  local widths = {}
  for _, row in ipairs(rows) do
    for i, cell in ipairs(row) do
      widths[i] = math.max(widths[i] or 0, vim.fn.strdisplaywidth(cell))
    end
  end
  return vim.tbl_map(function(row)
    local cells = {}
    for i, cell in ipairs(row) do
      local pad = i < #row and string.rep(" ", widths[i] - vim.fn.strdisplaywidth(cell)) or ""
      cells[i] = cell .. pad
    end
    return "  " .. table.concat(cells, "  ")
  end, rows)
end

--- `list` as lines indented by two spaces.
local function indented(list)
  return vim.tbl_map(function(item)
    return "  " .. item
  end, list)
end

--- The lines of the context window. `context` is the `ctx/context` answer, or only
--- `{ usage = … }` when the daemon does not have `ctx/context`; `note` says so.
---@param session_id string
---@param context { usage: ctxd.Usage, memoryFiles?: table[], pendingRules?: table[], filesRead?: integer, staleFiles?: string[], diagnostics?: string[], git?: boolean, instantCompaction?: table }
---@param note? string
---@return string[]
function M.context_lines(session_id, context, note)
  local lines = { "ctxd context: " .. session_id, "" }
  if note then
    vim.list_extend(lines, { note, "" })
  end
  vim.list_extend(lines, { M.status_text(context.usage), "" })
  vim.list_extend(lines, aligned(M.summary_rows(context.usage)))
  vim.list_extend(lines, { "", "Breakdown" })
  vim.list_extend(lines, aligned(M.breakdown_rows(context.usage)))
  if type(context.instantCompaction) == "table" then
    vim.list_extend(lines, { "", "Instant compaction", "  " .. M.instant_compaction_text(context.instantCompaction) })
  end
  if context.memoryFiles then
    vim.list_extend(lines, { "", "Memory files" })
    if #context.memoryFiles == 0 then
      table.insert(lines, "  none loaded")
    else
      vim.list_extend(lines, aligned(M.memory_file_rows(context)))
    end
  end
  if context.pendingRules and #context.pendingRules > 0 then
    vim.list_extend(lines, { "", "Pending rules" })
    vim.list_extend(lines, aligned(M.pending_rule_rows(context)))
  end
  if type(context.filesRead) == "number" and type(context.git) == "boolean" then
    vim.list_extend(lines, { "", "Files and git" })
    vim.list_extend(lines, aligned(M.context_rows(context)))
  end
  if type(context.staleFiles) == "table" and #context.staleFiles > 0 then
    vim.list_extend(lines, { "", "Changed since read" })
    vim.list_extend(lines, indented(context.staleFiles))
  end
  if type(context.diagnostics) == "table" and #context.diagnostics > 0 then
    vim.list_extend(lines, { "", "Problems" })
    vim.list_extend(lines, indented(context.diagnostics))
  end
  return lines
end

--- The status while the daemon is down and restarting.
M.DAEMON_DOWN_TEXT = "ctxd restarting"

return M
