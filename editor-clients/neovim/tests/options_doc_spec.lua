-- The docs name every option of setup() and no other: the README's options table and
-- the `Options:` list under *ctxd.setup()* in doc/ctxd.txt, against the options
-- lua/ctxd/config.lua defines. An option is in config.lua's `M.defaults` table, even
-- when its default is nil (so `pairs` over the table cannot list it), and in its
-- `ctxd.Config` class; the two must agree, and both docs must list exactly them.
local t = require("minitest")

--- Sorted keys of a set.
local function sorted(set)
  local keys = vim.tbl_keys(set)
  table.sort(keys)
  return keys
end

--- The lines of a file of the plugin.
local function lines(relative)
  return vim.fn.readfile(test_env.plugin_root .. "/" .. relative)
end

--- The options config.lua defines: the keys written in `M.defaults = { … }` (nil ones
--- included) and the fields of the `ctxd.Config` class.
local function config_options()
  local defaults, fields = {}, {}
  local in_defaults = false
  for _, line in ipairs(lines("lua/ctxd/config.lua")) do
    local field = line:match("^%-%-%-@field ([%w_]+)")
    if field then
      fields[field] = true
    end
    if line:match("^M%.defaults = {") then
      in_defaults = true
    elseif in_defaults and line:match("^}") then
      in_defaults = false
    elseif in_defaults then
      local key = line:match("^  ([%w_]+) = ")
      if key then
        defaults[key] = true
      end
    end
  end
  return defaults, fields
end

--- The names `pattern` captures in the lines of `file` between the line `opens` accepts
--- and the next line `closes` accepts.
local function listed(file, opens, closes, pattern)
  local names, inside = {}, false
  for _, line in ipairs(lines(file)) do
    if inside and closes(line) then
      break
    elseif inside then
      local name = line:match(pattern)
      if name then
        names[name] = true
      end
    else
      inside = opens(line)
    end
  end
  return names
end

--- The options the README's `## Setup` table lists (the first column's backticked name).
local function readme_options()
  return listed("README.md", function(line)
    return line == "## Setup"
  end, function(line)
    return line:match("^## ") ~= nil
  end, "^| `([%w_]+)` |")
end

--- The options the manual lists under `Options:` (in *ctxd.setup()*), up to the blank line.
local function manual_options()
  return listed("doc/ctxd.txt", function(line)
    return line == "Options:"
  end, function(line)
    return line == ""
  end, "^  `([%w_]+)`")
end

describe("setup() options in the docs", function()
  it("config.lua's defaults table, its Config class and its runtime keys agree", function()
    local defaults, fields = config_options()
    t.truthy(defaults.cmd and defaults.state_dir, "nil defaults are read from the source too")
    t.eq(sorted(fields), sorted(defaults), "---@field names against M.defaults keys")
    for key in pairs(require("ctxd.config").defaults) do
      t.truthy(defaults[key], key .. " is in M.defaults as written")
    end
  end)

  it("the README's Setup table lists every option, and only those", function()
    local defaults = config_options()
    t.eq(sorted(defaults), sorted(readme_options()))
  end)

  it("doc/ctxd.txt's Options list names every option, and only those", function()
    local defaults = config_options()
    t.eq(sorted(defaults), sorted(manual_options()))
  end)
end)
