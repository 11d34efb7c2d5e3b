-- A daemon that exits at start says why in its own words: its stderr is quoted in the
-- message the user gets and shown by :CtxdLog (Neovim would keep it in lsp.log only).
local t = require("minitest")
local ctxd = require("ctxd")

local scratch = vim.fn.tempname()
vim.fn.mkdir(scratch, "p")

describe("a daemon that exits at start", function()
  it("is named with its exit code and its last stderr lines, in the message and in :CtxdLog", function()
    local failing = scratch .. "/ctxd-exits"
    vim.fn.writefile({
      "#!/bin/sh",
      "echo 'first line' >&2",
      "echo 'ctxd: cannot open the state directory /nope: Permission denied' >&2",
      "exit 3",
    }, failing)
    vim.uv.fs_chmod(failing, tonumber("755", 8))
    local seen = {}
    local notify = vim.notify
    vim.notify = function(msg, level)
      table.insert(seen, { msg = msg, level = level })
    end
    local ok, err = pcall(function()
      ctxd.setup({ cmd = { failing, "serve" }, restart = { initial_ms = 60000, max_ms = 60000, stable_ms = 60000 } })
      t.wait_for("the failure message", function()
        return #seen > 0
      end)
    end)
    vim.notify = notify
    t.truthy(ok, err)
    t.eq({
      {
        msg = "ctxd exited with code 3 while starting: first line | ctxd: cannot open the state directory /nope: Permission denied; retrying in 60 s (:CtxdLog for details)",
        level = vim.log.levels.ERROR,
      },
    }, seen)
    -- The statusline keeps to the cause.
    t.eq("ctxd down: exited with code 3 while starting", ctxd.status())
    vim.cmd("Ctxd log")
    local lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
    vim.cmd("close")
    local at =
      vim.fn.index(lines, "The daemon's stderr (what it said before its log was open, and panics), last lines:")
    t.truthy(at >= 0, table.concat(lines, "\n"))
    t.eq(
      { "first line", "ctxd: cannot open the state directory /nope: Permission denied" },
      vim.list_slice(lines, at + 2, at + 3)
    )
    ctxd.stop()
  end)
end)
