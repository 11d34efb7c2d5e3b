-- How long from a Claude Code turn written to a transcript to Neovim's statusline
-- showing it, with the real ctxd and this plugin observing a project folder of 50
-- transcripts (issue 37's performance target: median ≤ 250 ms over 100 turns), and how
-- long a transcript cut back (an undo, a rewrite) takes to show its earlier figure.
--   nvim -l bench/observed_latency.lua   (or bench/observed-latency)
--
-- Turns are one user + one assistant line appended, 300 ms apart (Claude Code's turns
-- are seconds apart; 300 ms is past the daemon's 100 ms coalescing). BENCH_TURNS sets
-- the count (100); BENCH_SPREAD=1 writes each turn to the next of the 50 transcripts in
-- turn (the statusline follows the session that changed last) instead of the newest
-- one. BENCH_CUTS sets how many cut-backs are timed (20). A turn or a cut that shows
-- nothing within 5 s counts as missed; the figures are over those shown. The start is
-- taken just before the write; the end is the first poll (every 1 ms) of
-- `require("ctxd").status()` that shows the turn's token figure.
local bench_dir = vim.fs.dirname(vim.fs.normalize(vim.fn.fnamemodify(arg[0], ":p")))
local plugin_root = vim.fs.dirname(bench_dir)
vim.opt.runtimepath:prepend(plugin_root)
vim.opt.shadafile = "NONE"

local ctxd = require("ctxd")
local claude = require("ctxd.claude")
local client = require("ctxd.client")
local common = dofile(bench_dir .. "/bench_common.lua")
local now_ms, say, pause = common.now_ms, common.say, common.pause

local TRANSCRIPTS = 50
local TURNS = tonumber(vim.env.BENCH_TURNS) or 100
local CUTS = tonumber(vim.env.BENCH_CUTS) or 20
local SPREAD = vim.env.BENCH_SPREAD == "1"
local MISS_MS = 5000
local MODEL = "claude-opus-4-6"
local bin = vim.env.CTXD_BIN or vim.fs.normalize(plugin_root .. "/../../target/debug/ctxd")

local scratch = vim.uv.fs_realpath(vim.fn.tempname():match("^(.*)/[^/]*$"))
  .. "/ctxd-observed-bench-"
  .. vim.uv.os_getpid()
local folder = scratch .. "/app"
local config_dir = scratch .. "/claude"
vim.fn.mkdir(folder, "p")
vim.env.CLAUDE_CONFIG_DIR = config_dir
local project_dir = claude.project_dir(folder, config_dir)
vim.fn.mkdir(project_dir, "p")

local n = 0
--- A transcript line: a user prompt, or an assistant reply whose context holds `tokens`.
local function line(tokens)
  n = n + 1
  local base = {
    uuid = string.format("00000000-0000-4000-8000-%012d", n),
    sessionId = "bench",
    timestamp = "2026-12-06T05:00:00.000Z",
    version = "2.1.332",
  }
  if not tokens then
    return vim.json.encode(
      vim.tbl_extend("force", base, { type = "user", message = { role = "user", content = "go on" } })
    )
  end
  local usage =
    { input_tokens = 10, cache_creation_input_tokens = 0, cache_read_input_tokens = tokens - 60, output_tokens = 50 }
  local message =
    { id = "msg_" .. n, role = "assistant", model = MODEL, content = { { type = "text", text = "ok" } }, usage = usage }
  return vim.json.encode(vim.tbl_extend("force", base, { type = "assistant", message = message }))
end

local function write(path, text, mode)
  local f = assert(io.open(path, mode))
  f:write(text)
  f:close()
end

--- A turn that brings the context to `tokens`.
local function turn(tokens)
  return line() .. "\n" .. line(tokens) .. "\n"
end

--- Milliseconds until the statusline shows `tokens` (`· 61.0k ·`), or nil past MISS_MS.
local function shown_after(started, tokens)
  local figure = string.format("· %.1fk ·", tokens / 1000)
  if not vim.wait(MISS_MS, function()
    return ctxd.status():find(figure, 1, true) ~= nil
  end, 1) then
    return nil
  end
  return now_ms() - started
end

local function report(name, latencies, missed)
  table.sort(latencies)
  if missed == 0 and #latencies == 0 then
    return
  elseif #latencies == 0 then
    say(string.format("%-24s none of %d shown within %d ms", name, missed, MISS_MS))
    return
  end
  say(
    string.format(
      "%-24s %3d shown, %3d missed: median %6.1f ms  p90 %6.1f ms  max %6.1f ms",
      name,
      #latencies,
      missed,
      common.percentile(latencies, 50),
      common.percentile(latencies, 90),
      latencies[#latencies]
    )
  )
end

-- 50 transcripts of one turn each, the last written the newest.
local transcripts, tokens_of = {}, {}
for i = 1, TRANSCRIPTS do
  transcripts[i] = string.format("%s/10000000-0000-4000-8000-%012d.jsonl", project_dir, i)
  tokens_of[i] = 10000 + i * 100
  write(transcripts[i], turn(tokens_of[i]), "w")
  local mtime = os.time() - TRANSCRIPTS + i
  vim.uv.fs_utime(transcripts[i], mtime, mtime)
end

vim.fn.chdir(folder)
ctxd.setup({
  cmd = { bin, "serve", "--state-dir", scratch .. "/state", "--log-file", scratch .. "/ctxd.log" },
  settings = { provider = "offline" },
})
assert(vim.wait(20000, client.is_ready, 10), "the daemon did not start")
assert(shown_after(now_ms(), tokens_of[TRANSCRIPTS]), "the newest transcript never showed: " .. ctxd.status())

say(string.format("ctxd %s (%s), Neovim %s", client.state.capabilities.version, bin, tostring(vim.version())))
say(
  string.format(
    "%d transcripts in the project folder; turns %s, 300 ms apart:",
    TRANSCRIPTS,
    SPREAD and "to each transcript in turn" or "to the newest"
  )
)
local latencies, missed = {}, 0
for i = 1, TURNS do
  local k = SPREAD and (i - 1) % TRANSCRIPTS + 1 or TRANSCRIPTS
  tokens_of[k] = 20000 + i * 1000
  local started = now_ms()
  write(transcripts[k], turn(tokens_of[k]), "a")
  local ms = shown_after(started, tokens_of[k])
  if ms then
    table.insert(latencies, ms)
  else
    missed = missed + 1
  end
  pause(300)
end
report("turn → statusline", latencies, missed)

-- A cut back: the newest transcript grows by a turn, then is rewritten to what it was
-- (as an undo of a compaction puts the earlier bytes back).
latencies, missed = {}, 0
local target = transcripts[TRANSCRIPTS]
for i = 1, CUTS do
  local before = assert(io.open(target, "r")):read("a")
  local grown = 150000 + i * 1000
  write(target, turn(grown), "a")
  if shown_after(now_ms(), grown) then
    local started = now_ms()
    write(target, before, "w")
    local ms = shown_after(started, tokens_of[TRANSCRIPTS])
    if ms then
      table.insert(latencies, ms)
    else
      missed = missed + 1
      write(target, before, "w")
    end
  else
    missed = missed + 1
  end
  pause(300)
end
report("cut back → statusline", latencies, missed)

common.finish(scratch)
