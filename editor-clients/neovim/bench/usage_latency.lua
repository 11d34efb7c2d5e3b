-- How long from `ctx/append` on the wire to the statusline string changing, with the
-- real ctxd and this plugin: `nvim -l bench/usage_latency.lua` (or bench/usage-latency).
--
-- Two runs of 50 appends each (one user + one assistant record, each adding 1,000
-- tokens so every append changes the status text):
--   paced: one append every 150 ms, longer than the daemon's 100 ms coalescing
--          interval, so each ctx/usageChanged is pushed at once;
--   burst: one append every 10 ms, so pushes are coalesced (at most one per 100 ms).
-- For append i, the latency ends when `require("ctxd").status()` first shows a usage
-- that includes append i (a coalesced push may skip straight to a later append's
-- state). Times come from vim.uv.hrtime(); the start is taken just before the request
-- is written to the daemon's stdin.
local bench_dir = vim.fs.dirname(vim.fs.normalize(vim.fn.fnamemodify(arg[0], ":p")))
local plugin_root = vim.fs.dirname(bench_dir)
vim.opt.runtimepath:prepend(plugin_root)
vim.opt.shadafile = "NONE"

local ctxd = require("ctxd")
local client = require("ctxd.client")
local sessions = require("ctxd.sessions")
local common = dofile(bench_dir .. "/bench_common.lua")
local now_ms, say, percentile = common.now_ms, common.say, common.percentile

local COUNT = tonumber(vim.env.BENCH_APPENDS) or 50
local bin = vim.env.CTXD_BIN or vim.fs.normalize(plugin_root .. "/../../target/debug/ctxd")
local state_dir = vim.fn.tempname()
vim.fn.mkdir(state_dir, "p")

local function wait(what, probe)
  if not vim.wait(20000, probe, 1) then
    error("timed out waiting for " .. what)
  end
end

-- Record every moment the status text changes, with the tokens it reflects.
local changes = {} ---@type { at: number, tokens: integer }[]
local set_usage = sessions.set_usage
sessions.set_usage = function(session_id, usage)
  local before = ctxd.status()
  set_usage(session_id, usage)
  if ctxd.status() ~= before then
    table.insert(changes, { at = now_ms(), tokens = usage.tokens })
  end
end

ctxd.setup({
  cmd = { bin, "serve", "--state-dir", state_dir, "--log-file", state_dir .. "/ctxd.log" },
  settings = { autoCompactWindow = 200000 },
})
wait("the daemon", client.is_ready)

local function request(method, params)
  local answer
  ctxd.request(method, params, function(err, result)
    answer = { err = err, result = result }
  end)
  wait(method, function()
    return answer ~= nil
  end)
  assert(not answer.err, vim.inspect(answer.err))
  return answer.result
end

local uuid_n = 0
local function uuid()
  uuid_n = uuid_n + 1
  return string.format("00000000-0000-4000-8000-%012d", uuid_n)
end

local function run(name, interval_ms)
  local opened = request("ctx/openSession", { cwd = vim.fn.getcwd(), model = "claude-sonnet-4-5-20250929" })
  local session_id = opened.sessionId
  changes = {}
  local sent, answered, parent = {}, {}, vim.NIL
  for i = 1, COUNT do
    local user = { type = "user", uuid = uuid(), parentUuid = parent, message = { role = "user", content = "next" } }
    local assistant = {
      type = "assistant",
      uuid = uuid(),
      parentUuid = user.uuid,
      message = {
        role = "assistant",
        content = { { type = "text", text = "ok" } },
        usage = {
          input_tokens = 10,
          cache_creation_input_tokens = 0,
          cache_read_input_tokens = 10000 + i * 1000,
          output_tokens = 50,
        },
      },
    }
    parent = assistant.uuid
    sent[i] = now_ms()
    ctxd.request("ctx/append", { sessionId = session_id, records = { user, assistant } }, function(err, result)
      assert(not err, vim.inspect(err))
      answered[i] = result.usage.tokens
    end)
    local next_at = sent[i] + interval_ms
    common.pause(math.max(0, next_at - now_ms()))
  end
  wait("every append's answer", function()
    return #vim.tbl_keys(answered) == COUNT
  end)
  wait("the last usage on the statusline", function()
    return #changes > 0 and changes[#changes].tokens >= answered[COUNT]
  end)
  local latencies = {}
  for i = 1, COUNT do
    for _, change in ipairs(changes) do
      if change.tokens >= answered[i] then
        table.insert(latencies, change.at - sent[i])
        break
      end
    end
  end
  table.sort(latencies)
  local sum = 0
  for _, l in ipairs(latencies) do
    sum = sum + l
  end
  say(
    string.format(
      "%-6s every %3d ms, %d appends, %2d status changes: median %6.1f ms  p90 %6.1f ms  max %6.1f ms  (min %5.1f, mean %6.1f)",
      name,
      interval_ms,
      #latencies,
      #changes,
      percentile(latencies, 50),
      percentile(latencies, 90),
      latencies[#latencies],
      latencies[1],
      sum / #latencies
    )
  )
  request("ctx/closeSession", { sessionId = session_id })
end

say(string.format("ctxd %s (%s), Neovim %s", client.state.capabilities.version, bin, tostring(vim.version())))
say("from ctx/append written to the daemon to require('ctxd').status() changing:")
run("paced", 150)
run("burst", 10)

common.finish(state_dir)
