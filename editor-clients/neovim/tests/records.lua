--- Transcript records shaped like Claude Code's, for appending in tests.
local M = {}

local counter = 0
local function uuid()
  counter = counter + 1
  return string.format("00000000-0000-4000-8000-%012d", counter + math.random(0, 1e9) * 1000)
end

function M.user(text, parent)
  return { type = "user", uuid = uuid(), parentUuid = parent or vim.NIL, message = { role = "user", content = text } }
end

--- An assistant turn whose provider usage puts the context at `context_tokens`.
function M.assistant(context_tokens, parent)
  return {
    type = "assistant",
    uuid = uuid(),
    parentUuid = parent or vim.NIL,
    message = {
      role = "assistant",
      content = { { type = "text", text = "done" } },
      usage = {
        input_tokens = 10,
        cache_creation_input_tokens = 0,
        cache_read_input_tokens = context_tokens - 60,
        output_tokens = 50,
      },
    },
  }
end

return M
