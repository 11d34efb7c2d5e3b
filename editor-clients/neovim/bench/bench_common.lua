-- What the Neovim benches share: the clock, output, a pause that keeps the event loop
-- running, percentiles, and stopping the daemon at the end. Loaded with
-- `dofile(<bench dir> .. "/bench_common.lua")`.
local M = {}

function M.now_ms()
  return vim.uv.hrtime() / 1e6
end

function M.say(text)
  io.stdout:write(text .. "\n")
end

--- Waits `ms` with the event loop running (the daemon's messages are handled meanwhile).
function M.pause(ms)
  vim.wait(ms, function()
    return false
  end, 1)
end

--- The `p`th percentile of an ascending list.
function M.percentile(sorted, p)
  return sorted[math.max(1, math.ceil(p / 100 * #sorted))]
end

--- Stops the daemon, removes `dir` and exits Neovim.
function M.finish(dir)
  local stopped = false
  require("ctxd").stop(function()
    stopped = true
  end)
  vim.wait(5000, function()
    return stopped
  end, 10)
  vim.fn.delete(dir, "rf")
  os.exit(0)
end

return M
