-- A second editor on a store relays to the daemon the first one started: :checkhealth and
-- :CtxdLog say so and name that daemon (its pid from the store's lock, its log from its
-- command line), not only the relay's pid and its two log lines.
local t = require("minitest")
local ctxd = require("ctxd")
local client = require("ctxd.client")

local state_dir = vim.fn.tempname()
vim.fn.mkdir(state_dir, "p")
state_dir = vim.uv.fs_realpath(state_dir)

--- One LSP frame.
local function frame(message)
  local body = vim.json.encode(message)
  return string.format("Content-Length: %d\r\n\r\n%s", #body, body)
end

--- The daemon another editor started on the store: initialized, so it listens for others.
local function start_holder()
  local out = {}
  local holder = vim.system(
    { test_env.ctxd_bin, "serve", "--state-dir", state_dir, "--log-file", state_dir .. "/holder.log" },
    {
      stdin = true,
      stdout = function(_, data)
        table.insert(out, data or "")
      end,
    }
  )
  holder:write(frame({
    jsonrpc = "2.0",
    id = 1,
    method = "initialize",
    params = { processId = vim.fn.getpid(), rootUri = vim.NIL, capabilities = vim.empty_dict() },
  }))
  t.wait_for("the holder's initialize answer", function()
    return table.concat(out):find('"id":1', 1, true)
  end)
  holder:write(frame({ jsonrpc = "2.0", method = "initialized", params = vim.empty_dict() }))
  t.wait_for("the holder's socket", function()
    return vim.uv.fs_stat(state_dir .. "/ctxd.sock")
  end)
  return holder
end

describe("a second editor on the same store", function()
  it("says in :checkhealth and :CtxdLog that it relays, and names the daemon holding the store", function()
    local holder = start_holder()
    local ok, err = pcall(function()
      ctxd.setup({
        cmd = { test_env.ctxd_bin, "serve", "--state-dir", state_dir, "--log-file", state_dir .. "/relay.log" },
        observe_claude_code = false,
      })
      t.wait_for("the relayed daemon to be ready", client.is_ready)
      local relay = client.pid()
      t.truthy(relay and relay ~= holder.pid, "the relay is a process of its own")
      vim.cmd("checkhealth ctxd")
      local health = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
      vim.cmd("bwipeout")
      t.contains(
        health,
        string.format(
          "this editor's ctxd (pid %d) relays to the daemon that holds the store, pid %d",
          relay,
          holder.pid
        )
      )
      t.contains(health, "that daemon's log: " .. state_dir .. "/holder.log")
      vim.cmd("Ctxd log")
      local log = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
      vim.cmd("close")
      t.contains(
        log,
        string.format(
          "relays to the daemon that holds the store (pid %d); its log (%s/holder.log), last lines:",
          holder.pid,
          state_dir
        )
      )
      t.contains(log, "an editor shares this daemon")
    end)
    local stopped = false
    ctxd.stop(function()
      stopped = true
    end)
    t.wait_for("the relay to stop", function()
      return stopped
    end)
    holder:kill(15)
    holder:wait(5000)
    if not ok then
      error(err, 0)
    end
  end)
end)
