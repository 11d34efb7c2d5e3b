-- Rendering is a pure function of the usage object; the cases are shared with VS Code.
local t = require("minitest")
local render = require("ctxd.render")
local config = require("ctxd.config")

local cases = vim.json.decode(table.concat(vim.fn.readfile(test_env.fixtures .. "/render-cases.json"), "\n"))

describe("shared render cases", function()
  it("formats token counts", function()
    for _, c in ipairs(cases.formatTokens) do
      t.eq(c[2], render.format_tokens(c[1]), "format_tokens(" .. c[1] .. ")")
    end
  end)

  for _, c in ipairs(cases.usageCases) do
    it("renders " .. c.name, function()
      t.eq(c.statusText, render.status_text(c.usage), "status text")
      t.eq(c.summaryRows, render.summary_rows(c.usage), "summary rows")
      t.eq(c.breakdownRows, render.breakdown_rows(c.usage), "breakdown rows")
    end)
  end

  it("says what a cold cache costs and the fix", function()
    t.truthy(#cases.cacheCases > 0)
    for _, c in ipairs(cases.cacheCases) do
      t.eq(c.text, render.cache_text(c.cache), c.name)
    end
    t.eq("", render.cache_text(nil))
    t.eq("", render.cache_text(vim.NIL))
  end)

  it("says what instant compaction cost and saved", function()
    t.truthy(#cases.instantCompactionCases > 0)
    for _, c in ipairs(cases.instantCompactionCases) do
      t.eq(c.text, render.instant_compaction_text(c.stats), vim.inspect(c.stats))
    end
    t.eq(
      cases.contextCase.instantCompactionText,
      render.instant_compaction_text(cases.contextCase.context.instantCompaction)
    )
  end)

  it("renders memory files and pending rules", function()
    local c = cases.contextCase
    t.eq(c.memoryFileRows, render.memory_file_rows(c.context))
    t.eq(c.pendingRuleRows, render.pending_rule_rows(c.context))
  end)

  it("renders read files and git", function()
    t.eq(cases.contextCase.contextRows, render.context_rows(cases.contextCase.context))
    t.eq(
      { { "Files read", "0" }, { "Changed since read", "0" }, { "Git snapshot", "no" } },
      render.context_rows({ filesRead = 0, git = false })
    )
  end)

  it("says which window is in force and where it comes from", function()
    for _, c in ipairs(cases.windowCases) do
      t.eq(c.text, render.window_result_text(c.result), vim.inspect(c.result))
    end
  end)

  it("says why a window differs from the one asked for", function()
    t.truthy(#cases.windowReasonCases > 0)
    for _, c in ipairs(cases.windowReasonCases) do
      t.eq(c.text, render.window_reason_text(c.result), vim.inspect(c.result))
    end
  end)

  it("reads window inputs as the VS Code client does", function()
    local commands = require("ctxd.commands")
    for _, c in ipairs(cases.windowInputs) do
      local expected = c[2] ~= vim.NIL and c[2] or nil
      t.eq(expected, commands.parse_window(c[1]), vim.inspect(c[1]))
    end
  end)
end)

describe("context lines", function()
  it("lists memory files with their sizes when ctx/context gives them", function()
    local lines = render.context_lines("s-1", cases.contextCase.context)
    t.eq("ctxd context: s-1", lines[1])
    t.eq("ctx 50.1% · 16.9k to compact", lines[3], "no note")
    t.truthy(vim.tbl_contains(lines, "  Memory files            1,840"), "the breakdown's memory-file line")
    t.truthy(vim.tbl_contains(lines, "Memory files"))
    t.truthy(
      vim.tbl_contains(lines, "  /home/dev/project/CLAUDE.md              project  1,428  loaded"),
      vim.inspect(lines)
    )
    t.truthy(
      vim.tbl_contains(lines, "  /home/dev/project/.claude/rules/rust.md  rule     236    waiting"),
      vim.inspect(lines)
    )
    t.truthy(vim.tbl_contains(lines, "Pending rules"))
    local at = vim.fn.index(lines, "Instant compaction") + 1
    t.truthy(at > 0, vim.inspect(lines))
    t.eq("  prepared 2× $0.41 · saved 1 compaction ~$1.20", lines[at + 1])
    local tail = vim.list_slice(lines, #lines - 10)
    t.eq({
      "",
      "Files and git",
      "  Files read          3",
      "  Changed since read  1",
      "  Git snapshot        yes",
      "",
      "Changed since read",
      "  /home/dev/project/src/lib.rs",
      "",
      "Problems",
      "  /home/dev/project/CLAUDE.md: @docs/missing.md: no such file",
    }, tail)
  end)

  it("leaves out empty sections", function()
    local context =
      vim.tbl_extend("force", cases.contextCase.context, { memoryFiles = {}, pendingRules = {}, diagnostics = {} })
    context.staleFiles = nil
    local lines = render.context_lines("s-1", context)
    t.truthy(vim.tbl_contains(lines, "  none loaded"))
    for _, heading in ipairs({ "Pending rules", "Changed since read", "Problems" }) do
      t.truthy(not vim.tbl_contains(lines, heading), heading)
    end
    t.truthy(vim.tbl_contains(lines, "  Changed since read  0"))
    context.instantCompaction = nil
    t.truthy(
      not vim.tbl_contains(render.context_lines("s-1", context), "Instant compaction"),
      "a session off the gateway"
    )
  end)

  it("shows the note and no memory files when only a usage is known", function()
    local lines = render.context_lines("s-1", { usage = cases.usageCases[1].usage }, "only usage")
    t.eq({ "ctxd context: s-1", "", "only usage", "", "ctx 0.0% · 67.0k to compact", "" }, vim.list_slice(lines, 1, 6))
    t.truthy(not vim.tbl_contains(lines, "Memory files"))
    t.truthy(not vim.tbl_contains(lines, "Files and git"))
  end)
end)

describe("config", function()
  it("builds the default command from bin and log_file", function()
    local c = config.resolve({ bin = "/opt/ctxd", log_file = "/tmp/x.log", state_dir = "/tmp/s" })
    t.eq({ "/opt/ctxd", "serve", "--log-file", "/tmp/x.log", "--state-dir", "/tmp/s" }, c.cmd)
    t.eq("/tmp/x.log", config.log_path(c))
  end)

  it("leaves empty settings out of initializationOptions (they would encode as [])", function()
    t.eq(nil, config.init_options(config.resolve({ cmd = { "ctxd" } })))
    t.eq(
      { settings = { autoCompactWindow = 1000 } },
      config.init_options(config.resolve({ cmd = { "ctxd" }, settings = { autoCompactWindow = 1000 } }))
    )
  end)

  it("finds the log from the daemon's state dir when cmd names no log file", function()
    local c = config.resolve({ cmd = { "ctxd", "serve" } })
    t.eq(nil, config.log_path(c))
    t.eq("/s/logs/ctxd.log", config.log_path(c, "/s"))
    t.eq("/l.log", config.log_path(config.resolve({ cmd = { "ctxd", "--log-file=/l.log" } })))
  end)
end)
