-- Every failure a user reads is one plain sentence: the cases both editor clients share
-- (editor-clients/fixtures/error-cases.json), worded with no method names or codes.
local t = require("minitest")
local errors = require("ctxd.errors")

local cases = vim.json.decode(table.concat(vim.fn.readfile(test_env.fixtures .. "/error-cases.json"), "\n")).cases

describe("errors.describe", function()
  it("words every shared case as the fixture says", function()
    t.truthy(#cases >= 20)
    for _, case in ipairs(cases) do
      t.eq(case.text, errors.describe(case.method, case.error), vim.inspect(case.error))
    end
  end)

  it("names no method and no error code in any of them", function()
    for _, case in ipairs(cases) do
      local text = errors.describe(case.method, case.error)
      t.truthy(not text:find("ctx/", 1, true) and not text:find("%-3%d%d%d%d"), text)
    end
  end)
end)
