--- A scripted in-process server for `setup({ cmd = … })` (`vim.lsp.start` takes a
--- function as `cmd`): for answers the real daemon cannot give in a test, such as those
--- of an older daemon without `ctx/context`. It answers `initialize` and `shutdown`,
--- the methods in `answers`, and -32601 for any other, as ctxd does.
local M = {}

---@class ctxd.test.FakeServer
---@field cmd fun(dispatchers: table): table the `cmd` to pass to setup()
---@field sent { method: string, params: any }[] every request received, in order
---@field notify fun(method: string, params: table) sends a notification to Neovim

---@param answers table<string, fun(params: table): any> results by method; raise `{ code, message }` for an error
---@param methods? string[] what `initialize` announces
---@return ctxd.test.FakeServer
function M.new(answers, methods)
  local fake = { sent = {} }
  local dispatchers
  function fake.notify(method, params)
    dispatchers.notification(method, params)
  end
  fake.cmd = function(d)
    dispatchers = d
    local closing, id = false, 0
    local function exit(code)
      if not closing then
        closing = true
        vim.schedule(function()
          dispatchers.on_exit(code, 0)
        end)
      end
    end
    return {
      request = function(method, params, callback)
        id = id + 1
        table.insert(fake.sent, { method = method, params = params })
        vim.schedule(function()
          if method == "initialize" then
            callback(nil, {
              capabilities = {
                experimental = {
                  ctxd = {
                    version = "0.0.1",
                    protocol = 1,
                    methods = methods or vim.tbl_keys(answers),
                    notifications = { "ctx/usageChanged" },
                    stateDir = "/nonexistent",
                  },
                },
              },
            })
          elseif method == "shutdown" then
            callback(nil, vim.NIL)
          elseif answers[method] then
            -- An answer that raises `{ code, message }` is an error answer.
            local ok, result = pcall(answers[method], params)
            if ok then
              callback(nil, result)
            else
              callback(result, nil)
            end
          else
            callback({ code = -32601, message = "Method not found: " .. method }, nil)
          end
        end)
        return true, id
      end,
      notify = function(method)
        if method == "exit" then
          exit(0)
        end
        return true
      end,
      is_closing = function()
        return closing
      end,
      terminate = function()
        exit(1)
      end,
    }
  end
  return fake
end

return M
