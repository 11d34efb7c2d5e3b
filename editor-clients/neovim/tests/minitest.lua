--- A tiny test harness, vendored so the tests need no network: `describe`, `it`,
--- `before_each`, `after_each`, and assertions. Tests are synchronous; a test that
--- waits for the daemon uses `wait_for`, which runs Neovim's event loop.
local M = { passed = 0, failed = 0, failures = {} }

local stack = {} ---@type { name: string, before: function[], after: function[] }[]

function M.describe(name, body)
  table.insert(stack, { name = name, before = {}, after = {} })
  body()
  table.remove(stack)
end

function M.before_each(fn)
  table.insert(stack[#stack].before, fn)
end

function M.after_each(fn)
  table.insert(stack[#stack].after, fn)
end

local function full_name(name)
  local parts = {}
  for _, s in ipairs(stack) do
    table.insert(parts, s.name)
  end
  table.insert(parts, name)
  return table.concat(parts, " › ")
end

function M.it(name, body)
  local title = full_name(name)
  -- MINITEST_FILTER runs only the cases whose full name contains it (each case sets up
  -- what it needs, so any one of them runs alone).
  local only = os.getenv("MINITEST_FILTER")
  if only and only ~= "" and not title:find(only, 1, true) then
    return
  end
  local ok, err = xpcall(function()
    for _, s in ipairs(stack) do
      for _, fn in ipairs(s.before) do
        fn()
      end
    end
    body()
  end, debug.traceback)
  for i = #stack, 1, -1 do
    for _, fn in ipairs(stack[i].after) do
      local after_ok, after_err = xpcall(fn, debug.traceback)
      if ok and not after_ok then
        ok, err = false, after_err
      end
    end
  end
  if ok then
    M.passed = M.passed + 1
    io.stdout:write("  ok      " .. title .. "\n")
  else
    M.failed = M.failed + 1
    table.insert(M.failures, { name = title, err = err })
    io.stdout:write("  FAILED  " .. title .. "\n" .. tostring(err):gsub("\n", "\n          ") .. "\n")
  end
end

--- Asserts `actual` equals `expected` (deeply for tables).
function M.eq(expected, actual, what)
  if not vim.deep_equal(expected, actual) then
    error(
      string.format(
        "%s\n  expected: %s\n  actual:   %s",
        what or "values differ",
        vim.inspect(expected),
        vim.inspect(actual)
      ),
      2
    )
  end
end

--- Asserts the string `actual` contains `pattern` (a plain string unless `is_pattern`).
function M.contains(actual, needle, what)
  if type(actual) ~= "string" or not actual:find(needle, 1, true) then
    error(
      string.format("%s\n  expected to contain: %s\n  actual: %s", what or "missing text", needle, vim.inspect(actual)),
      2
    )
  end
end

function M.truthy(value, what)
  if not value then
    error(what or "expected a true value", 2)
  end
  return value
end

--- Runs the event loop until `probe()` returns a non-nil, non-false value; returns it.
function M.wait_for(what, probe, timeout_ms)
  local value
  local ok = vim.wait(timeout_ms or 10000, function()
    value = probe()
    return value ~= nil and value ~= false
  end, 5)
  if not ok then
    error("timed out waiting for " .. what, 2)
  end
  return value
end

return M
