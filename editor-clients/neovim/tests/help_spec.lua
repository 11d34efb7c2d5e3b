-- :help ctxd: the help file's tags resolve, and it documents every :Ctxd subcommand
-- and every setup() option.
local t = require("minitest")

describe("doc/ctxd.txt", function()
  it("has tags that :help finds, and names every subcommand and option", function()
    -- Tags are built in a copy, so the checkout gets no doc/tags.
    local root = vim.fn.tempname()
    vim.fn.mkdir(root .. "/doc", "p")
    vim.fn.writefile(vim.fn.readfile(test_env.plugin_root .. "/doc/ctxd.txt"), root .. "/doc/ctxd.txt")
    vim.cmd.helptags(vim.fn.fnameescape(root .. "/doc"))
    vim.opt.runtimepath:prepend(root)
    for _, tag in ipairs({ "ctxd.txt", ":Ctxd", ":CtxdLog", "ctxd-claude-code", "ctxd-down", "ctxd.setup()" }) do
      vim.cmd.help(tag)
      t.truthy(vim.endswith(vim.api.nvim_buf_get_name(0), "/doc/ctxd.txt"), tag)
      vim.cmd("helpclose")
    end
    local text = table.concat(vim.fn.readfile(root .. "/doc/ctxd.txt"), "\n")
    require("ctxd.commands").register()
    for _, sub in ipairs(vim.fn.getcompletion("Ctxd ", "cmdline")) do
      t.truthy(text:find("\n    " .. sub .. "[ \n]"), "subcommand " .. sub .. " is documented")
    end
    for option in pairs(require("ctxd.config").defaults) do
      t.truthy(text:find("`" .. option .. "`", 1, true), "option " .. option .. " is documented")
    end
    vim.opt.runtimepath:remove(root)
  end)
end)
