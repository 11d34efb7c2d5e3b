-- :help ctxd: the shipped doc/tags resolve in a clean Neovim with the README's install
-- (the plugin folder on 'runtimepath'), :help ctxd opens the top of the manual, the tags
-- are what :helptags makes of doc/ctxd.txt today, and the manual documents every :Ctxd
-- subcommand and every setup() option.
local t = require("minitest")

describe("doc/ctxd.txt", function()
  it(":help ctxd opens the top of the manual in a clean Neovim with the README's install", function()
    local script = table.concat({
      "vim.cmd.help('ctxd')",
      "io.stdout:write(vim.api.nvim_buf_get_name(0), '\\n', vim.fn.line('.'), '\\n', vim.fn.line('w0'), '\\n', vim.fn.getline(1), '\\n')",
      "vim.cmd('qa!')",
    }, "; ")
    local done = vim
      .system({
        vim.v.progpath,
        "--clean",
        "--headless",
        "--cmd",
        "set runtimepath+=" .. vim.fn.fnameescape(test_env.plugin_root),
        "-c",
        "lua " .. script,
      }, { text = true })
      :wait(20000)
    t.eq(0, done.code, done.stderr)
    local out = vim.split(done.stdout, "\n", { plain = true })
    t.eq(test_env.plugin_root .. "/doc/ctxd.txt", out[1])
    t.eq("1", out[2], "the cursor on the manual's first line")
    t.eq("1", out[3], "the window shows the top")
    t.truthy(vim.startswith(out[4], "*ctxd.txt*"), out[4])
  end)

  it("ships doc/tags as :helptags makes them", function()
    local copy = vim.fn.tempname()
    vim.fn.mkdir(copy, "p")
    vim.fn.writefile(vim.fn.readfile(test_env.plugin_root .. "/doc/ctxd.txt", "b"), copy .. "/ctxd.txt", "b")
    vim.cmd.helptags(vim.fn.fnameescape(copy))
    local fresh = vim.fn.readfile(copy .. "/tags", "b")
    t.eq(
      fresh,
      vim.fn.readfile(test_env.plugin_root .. "/doc/tags", "b"),
      "doc/tags is stale: run nvim --clean --headless -c 'helptags doc' -c q in editor-clients/neovim"
    )
  end)

  it("has tags that :help finds, and names every subcommand and option", function()
    for _, tag in ipairs({ "ctxd", "ctxd.txt", ":Ctxd", ":CtxdLog", "ctxd-claude-code", "ctxd-down", "ctxd.setup()" }) do
      vim.cmd.help(tag)
      t.truthy(vim.endswith(vim.api.nvim_buf_get_name(0), "/doc/ctxd.txt"), tag)
      vim.cmd("helpclose")
    end
    local text = table.concat(vim.fn.readfile(test_env.plugin_root .. "/doc/ctxd.txt"), "\n")
    require("ctxd.commands").register()
    for _, sub in ipairs(vim.fn.getcompletion("Ctxd ", "cmdline")) do
      t.truthy(text:find("\n    " .. sub .. "[ \n]"), "subcommand " .. sub .. " is documented")
    end
    for option in pairs(require("ctxd.config").defaults) do
      t.truthy(text:find("`" .. option .. "`", 1, true), "option " .. option .. " is documented")
    end
  end)
end)
