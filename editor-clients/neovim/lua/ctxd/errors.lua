--- Turning a failed request into one sentence a person can act on, worded as in the
--- VS Code client. Methods the daemon does not have yet answer -32601.
local M = {}

M.METHOD_NOT_FOUND = -32601

---@param err table|string|nil a JSON-RPC error object (`code`, `message`) or a string
---@return boolean
function M.is_method_not_found(err)
  return type(err) == "table" and err.code == M.METHOD_NOT_FOUND
end

--- One line describing why `method` failed.
---@param method string
---@param err table|string
---@return string
function M.describe(method, err)
  if type(err) ~= "table" then
    return string.format("%s failed: %s", method, tostring(err))
  end
  local message = err.message or vim.inspect(err)
  if err.code == M.METHOD_NOT_FOUND then
    return string.format(
      "ctxd does not support %s yet (error %d: %s). Update ctxd to use this command.",
      method,
      err.code,
      message
    )
  elseif err.code == nil or err.code == -33001 then
    return string.format("%s failed: %s", method, message)
  end
  return string.format("%s failed (error %d): %s", method, err.code, message)
end

return M
