-- Minimal init for the headless tests: `nvim -l tests/minit.lua [spec files]`.
-- Puts this plugin (and nothing else) on the runtimepath, runs the specs with the
-- vendored harness in tests/minitest.lua, prints `N passed, M failed` last and exits
-- non-zero when a test failed.
local plugin_root = vim.fs.dirname(vim.fs.dirname(vim.fs.normalize(vim.fn.fnamemodify(arg[0], ":p"))))
vim.opt.runtimepath:prepend(plugin_root)
vim.opt.swapfile = false
vim.opt.shadafile = "NONE"
package.path = plugin_root .. "/tests/?.lua;" .. package.path

local t = require("minitest")
_G.describe, _G.it, _G.before_each, _G.after_each = t.describe, t.it, t.before_each, t.after_each

-- What the specs share: where things are.
_G.test_env = {
  plugin_root = plugin_root,
  fixtures = vim.fs.normalize(plugin_root .. "/../fixtures"),
  ctxd_bin = vim.env.CTXD_BIN or vim.fs.normalize(plugin_root .. "/../../target/debug/ctxd"),
}

local specs = {}
for i = 1, #arg do
  table.insert(specs, arg[i])
end
if #specs == 0 then
  specs = vim.fn.glob(plugin_root .. "/tests/*_spec.lua", false, true)
  table.sort(specs)
end

for _, spec in ipairs(specs) do
  io.stdout:write(vim.fn.fnamemodify(spec, ":t") .. "\n")
  local ok, err = xpcall(dofile, debug.traceback, spec)
  if not ok then
    t.failed = t.failed + 1
    io.stdout:write("  FAILED  loading " .. spec .. "\n" .. tostring(err) .. "\n")
  end
end

-- Stop the daemon (if a spec started one) before leaving.
local loaded, ctxd = pcall(require, "ctxd")
if loaded and require("ctxd.client").state.client_id then
  local stopped = false
  ctxd.stop(function()
    stopped = true
  end)
  vim.wait(5000, function()
    return stopped
  end, 10)
end

io.stdout:write(string.format("%d passed, %d failed\n", t.passed, t.failed))
os.exit(t.failed > 0 and 1 or 0)
