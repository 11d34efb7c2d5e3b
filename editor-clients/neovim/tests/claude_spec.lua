-- With no agent plugin: the Claude Code sessions of the current directory, observed by
-- the real ctxd, in the statusline, the context float and the session picker; `:Ctxd`
-- and its completion; the Claude Code compaction offered with a confirmation.
local t = require("minitest")
local ctxd = require("ctxd")
local claude = require("ctxd.claude")
local client = require("ctxd.client")
local commands = require("ctxd.commands")

-- A model Claude Code auto-compacts (claude-sonnet-4-5 gets no "to compact" figure).
local MODEL = "claude-opus-4-6"
local n = 0

--- A Claude Code transcript line: a user prompt, or an assistant turn at `context_tokens`.
local function line(kind, context_tokens)
  n = n + 1
  local base = {
    uuid = string.format("10000000-0000-4000-8000-%012d", n),
    sessionId = "s",
    timestamp = "2026-12-01T10:00:00.000Z",
    cwd = vim.fn.getcwd(),
  }
  if kind == "user" then
    return vim.json.encode(
      vim.tbl_extend("force", base, { type = "user", message = { role = "user", content = "go on" } })
    )
  end
  return vim.json.encode(vim.tbl_extend("force", base, {
    type = "assistant",
    message = {
      id = "msg_" .. n,
      role = "assistant",
      model = MODEL,
      content = { { type = "text", text = "ok" } },
      usage = {
        input_tokens = 10,
        cache_creation_input_tokens = 0,
        cache_read_input_tokens = context_tokens - 60,
        output_tokens = 50,
      },
    },
  }))
end

local function append(path, lines)
  local file = assert(io.open(path, "a"))
  file:write(table.concat(lines, "\n") .. "\n")
  file:close()
end

local scratch = vim.uv.fs_realpath(vim.fn.tempname()) or vim.fn.tempname()
vim.fn.mkdir(scratch, "p")
scratch = vim.uv.fs_realpath(scratch)
local config_dir = scratch .. "/claude"
local old_cwd = vim.fn.getcwd()
local cases = 0

--- Stops the daemon a case started and forgets what the plugin observed.
local function stop()
  local stopped = false
  ctxd.stop(function()
    stopped = true
  end)
  t.wait_for("the daemon to stop", function()
    return stopped
  end)
  claude.reset()
  client.state.observing = false
  vim.env.CLAUDE_CONFIG_DIR = nil
  vim.fn.chdir(old_cwd)
end

--- The Claude Code project folder of `dir`, worked out here on its own (not with the
--- plugin's code): one `-` per UTF-16 unit of each character that is not an ASCII letter
--- or digit, under the real path (names past 200 units are not used in these tests).
local function expected_project_dir(dir)
  local name = {}
  for _, c in ipairs(vim.fn.split(vim.uv.fs_realpath(dir) or dir, "\\zs")) do
    table.insert(name, c:match("^[A-Za-z0-9]$") and c or string.rep("-", vim.str_utfindex(c, "utf-16")))
  end
  return config_dir .. "/projects/" .. table.concat(name)
end

--- A working folder of the calling case's own (`my.app_1`, or `name`), made the current
--- directory, and a daemon started in it that waits for the folder's first Claude Code
--- transcript. Returns the folder and its Claude Code project folder.
local function new_folder(name)
  cases = cases + 1
  local folder = string.format("%s/%d/%s", scratch, cases, name or "my.app_1")
  vim.fn.mkdir(folder, "p")
  return folder
end

--- Makes `folder` the current directory and starts a daemon of the case's own there.
local function start_in(folder)
  vim.fn.chdir(folder)
  vim.env.CLAUDE_CONFIG_DIR = config_dir
  ctxd.setup({
    cmd = {
      test_env.ctxd_bin,
      "serve",
      "--state-dir",
      scratch .. "/state-" .. cases,
      "--log-file",
      scratch .. "/ctxd-" .. cases .. ".log",
    },
    settings = { autoCompactWindow = 100000, provider = "offline" },
  })
  t.wait_for("the daemon to be ready", client.is_ready)
end

local function start_in_new_folder(name)
  local folder = new_folder(name)
  start_in(folder)
  t.wait_for("the project to wait for a transcript", function()
    return #claude.waiting() == 1
  end)
  return folder, claude.project_dir(folder)
end

--- Runs `:Ctxd sessions` and picks entry `index`: returns the entries offered and the
--- text of the context float the pick opened (closed again), if it opened one.
local function pick(index)
  local offered, buf
  local select = vim.ui.select
  vim.ui.select = function(items, opts, on_choice)
    offered = vim.tbl_map(opts.format_item, items)
    on_choice(items[index])
  end
  local ok, err = pcall(function()
    commands.pick_session(function(b)
      buf = b or false
    end)
    t.wait_for("the pick to be done", function()
      return buf ~= nil
    end)
  end)
  vim.ui.select = select
  t.truthy(ok, err)
  local shown = buf and table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), "\n")
  if buf then
    vim.cmd("close")
  end
  return offered, shown
end

local function transcript_named(project_dir, n)
  return string.format("%s/20000000-0000-4000-8000-%012d.jsonl", project_dir, n)
end

--- The statusline of a session whose last turn is at 40,000 tokens.
local FIRST_TURN = "ctx 40.0% · 27.0k to compact · 40.0k · claude-opus-4-6"

--- Writes a first turn (40,000 tokens) to transcript 1 of `project_dir`, which it makes.
--- Returns the transcript.
local function first_turn(project_dir)
  vim.fn.mkdir(project_dir, "p")
  local transcript = transcript_named(project_dir, 1)
  append(transcript, { line("user"), line("assistant", 40000) })
  return transcript
end

--- Waits for the statusline to show the session of `first_turn()`.
local function wait_for_first_turn(what)
  t.wait_for(what, function()
    return ctxd.status() == FIRST_TURN
  end)
end

--- Two sessions in a new folder's project directory, the older written an hour ago
--- (Claude Code resumes it later), and the plugin started there showing the newest.
--- Returns the older and the newer transcript.
local function two_sessions_started()
  local folder = new_folder()
  local project_dir = expected_project_dir(folder)
  vim.fn.mkdir(project_dir, "p")
  local older, newer = transcript_named(project_dir, 1), transcript_named(project_dir, 2)
  append(older, { line("user"), line("assistant", 10000) })
  local an_hour_ago = os.time() - 3600
  vim.uv.fs_utime(older, an_hour_ago, an_hour_ago)
  append(newer, { line("user"), line("assistant", 40000) })
  start_in(folder)
  wait_for_first_turn("the newest session")
  return older, newer
end

--- A folder of the calling case's own with one Claude Code session observed: two
--- turns, the last at 60,000 tokens, shown in the statusline. Returns the transcript and
--- the project folder.
local function observed_session()
  local _, project_dir = start_in_new_folder()
  vim.fn.mkdir(project_dir, "p")
  local transcript = transcript_named(project_dir, 1)
  append(transcript, { line("user"), line("assistant", 40000), line("user"), line("assistant", 60000) })
  t.wait_for("the observed session in the statusline", function()
    return ctxd.status() == "ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6"
  end)
  return transcript, project_dir
end

--- Runs `command(done)` (a `:Ctxd` command's function) answering its confirmation with
--- the first choice, and waits for it to be done. Returns the prompts shown and the
--- messages it notified.
local function run_confirmed(command)
  local prompts, messages = {}, {}
  local select, notify = vim.ui.select, vim.notify
  vim.ui.select = function(items, opts, on_choice)
    table.insert(prompts, opts.prompt)
    on_choice(items[1])
  end
  vim.notify = function(msg, level)
    table.insert(messages, { msg = msg, level = level })
  end
  local done = false
  local ok, err = pcall(function()
    command(function()
      done = true
    end)
    t.wait_for("the answer", function()
      return done
    end)
  end)
  vim.ui.select, vim.notify = select, notify
  t.truthy(ok, err)
  return prompts, messages
end

-- Each case starts its own daemon in a folder of its own and stops it after.
describe("Claude Code sessions of the current directory", function()
  after_each(function()
    if client.state.client_id then
      stop()
    end
  end)

  it("names project folders as the real Claude Code program did, in every pinned case", function()
    local pinned =
      vim.json.decode(table.concat(vim.fn.readfile(test_env.fixtures .. "/claude-project-folders.json"), "\n"))
    t.truthy(#pinned.cases >= 9)
    for _, case in ipairs(pinned.cases) do
      t.eq(case.folder, claude.project_folder_name(case.cwd), case.cwd)
    end
    t.eq(pinned.symlink.folder, claude.project_folder_name(pinned.symlink.target))
    -- A character outside the Basic Multilingual Plane is two UTF-16 units: two dashes.
    t.eq("-w-caf----", claude.project_folder_name("/w/café-😀"))
    -- A folder reached through a symlink is named after the real path.
    local real = scratch .. "/names/café-😀"
    vim.fn.mkdir(real, "p")
    vim.uv.fs_symlink(real, scratch .. "/names/link")
    t.eq(claude.project_dir(real, "/c"), claude.project_dir(scratch .. "/names/link", "/c"))
  end)

  it("names the project folder as Claude Code does, and the id as the daemon does", function()
    local folder = scratch .. "/my.app_1"
    t.eq(config_dir .. "/projects/" .. folder:gsub("[^%w]", "-"), claude.project_dir(folder, config_dir))
    t.truthy(vim.endswith(claude.project_dir(folder, config_dir), "-my-app-1"))
    -- One `-` per character, as the VS Code client (and Claude Code) write it.
    t.eq("/c/projects/-srv-a-b--n-", claude.project_dir("/srv/a b/Ünï", "/c"))
    -- FNV-1a 64 of the path, as `ctxd` publishes it (the empty input is the offset basis).
    t.eq("observe-cbf29ce484222325", claude.observe_id(""))
    t.eq("observe-af63dc4c8601ec8c", claude.observe_id("a"))
  end)

  it("shows nothing until a transcript appears, then the newest session, following it", function()
    local _, project_dir = start_in_new_folder()
    t.eq("", ctxd.status())
    local transcript = first_turn(project_dir)
    wait_for_first_turn("the observed session in the statusline")
    t.eq(claude.observe_id(transcript), claude.get().session_id)
    append(transcript, { line("user"), line("assistant", 60000) })
    t.wait_for("the next turn", function()
      return ctxd.status() == "ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6"
    end)
    t.eq("CtxdWarning", ctxd.status_highlight())
  end)

  it("shows the cold cache the daemon pushes at its expiry, with the fix when a summary is ready", function()
    local _, project_dir = start_in_new_folder()
    local transcript = first_turn(project_dir)
    wait_for_first_turn("the observed session in the statusline")
    local cases = vim.json.decode(table.concat(vim.fn.readfile(test_env.fixtures .. "/render-cases.json"), "\n"))
    local named = {}
    for _, c in ipairs(cases.cacheCases) do
      named[c.name] = c
    end
    -- The daemon's push, as the LSP client hands it to the plugin's handler.
    local handler = vim.lsp.get_client_by_id(client.state.client_id).handlers["ctx/usageChanged"]
    local function push(cache)
      local usage = vim.deepcopy(claude.get().usage)
      usage.cache = cache
      handler(nil, { sessionId = claude.observe_id(transcript), usage = usage })
    end
    push(named["warm"].cache)
    t.eq(FIRST_TURN, ctxd.status(), "warm: nothing to add")
    push(named["cold with a summary ready"].cache)
    t.eq(FIRST_TURN .. " · " .. named["cold with a summary ready"].text, ctxd.status())
    t.truthy(vim.endswith(ctxd.status(), "; /compact is instant (summary ready)"))
    push(named["cold, nothing prepared"].cache)
    t.eq(FIRST_TURN .. " · cache cold: next turn re-writes 14.3k tokens (~$0.07)", ctxd.status())
  end)

  it(":Ctxd context shows the observed session", function()
    local transcript = observed_session()
    vim.cmd("Ctxd context")
    local lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
    local text = table.concat(lines, "\n")
    t.contains(
      text,
      "Claude Code session 20000000-0000-4000-8000-000000000001 ("
        .. transcript
        .. ", model "
        .. MODEL
        .. "), observed by ctxd."
    )
    t.contains(text, "ctx 60.0% · 7.0k to compact")
    vim.cmd("close")
  end)

  it(":Ctxd compact asks first, then says clearly when the daemon cannot compact a Claude Code session", function()
    local transcript = observed_session()
    local prompts, messages = run_confirmed(function(done)
      commands.compact("", done)
    end)
    t.eq(1, #prompts)
    t.contains(prompts[1], "appends a compact boundary and a summary to " .. transcript)
    t.contains(prompts[1], ":Ctxd undo takes it back")
    t.eq(1, #messages)
    t.truthy(vim.startswith(messages[1].msg, "ctxd: Claude Code session compacted"), messages[1].msg)
    -- No provider is configured in the test's home: the built-in summarizer wrote it.
    t.truthy(vim.endswith(messages[1].msg, "tokens, summary by offline"), messages[1].msg)
  end)

  it("shows the newest active session when there are several, with a picker", function()
    local _, project_dir = observed_session()
    local second = transcript_named(project_dir, 2)
    append(second, { line("user"), line("assistant", 20000) })
    t.wait_for("the new session shown", function()
      return ctxd.status() == "ctx 20.0% · 47.0k to compact · 20.0k · claude-opus-4-6"
    end)
    local offered, shown = pick(2)
    t.eq(2, #offered)
    t.eq(
      "ctx 20.0% · 47.0k to compact · 20.0k · claude-opus-4-6  20000000-0000-4000-8000-000000000002  (shown)",
      offered[1]
    )
    t.eq("ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6  20000000-0000-4000-8000-000000000001", offered[2])
    t.contains(shown, "Claude Code session 20000000-0000-4000-8000-000000000001")
    -- The picked session is pinned to the statusline, and stays while the other changes.
    t.eq("ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6", ctxd.status())
    append(second, { line("user"), line("assistant", 30000) })
    t.wait_for("the other session's turn read", function()
      local other = claude.get(claude.observe_id(second))
      return other and other.usage and other.usage.tokens == 30000
    end)
    t.eq("ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6", ctxd.status())
    -- The first entry follows the session that changed last again.
    offered = pick(1)
    t.eq(commands.FOLLOW_NEWEST, offered[1])
    t.eq("ctx 30.0% · 37.0k to compact · 30.0k · claude-opus-4-6", ctxd.status())
  end)

  it(
    "lists every transcript of the directory, also one the daemon does not follow, and shows it when picked",
    function()
      local older = two_sessions_started()
      local offered, shown = pick(2)
      t.contains(shown, "Claude Code session 20000000-0000-4000-8000-000000000001")
      local older_text = "ctx 10.0% · 57.0k to compact · 10.0k · claude-opus-4-6"
      t.eq(2, #offered)
      t.eq(FIRST_TURN .. "  20000000-0000-4000-8000-000000000002  (shown)", offered[1])
      -- A daemon that follows only the newest transcript has sent nothing for the older one.
      t.truthy(
        offered[2] == "not followed yet  20000000-0000-4000-8000-000000000001"
          or offered[2] == older_text .. "  20000000-0000-4000-8000-000000000001",
        offered[2]
      )
      t.eq(older_text, ctxd.status())
    end
  )

  -- Issue #37 item 1: a follower that reads on from the old end of a file cut back shows
  -- the compacted figure after undo and misses the turns written after it.
  it("after :Ctxd compact then :Ctxd undo, shows the figure from before the compaction, then the next turn", function()
    local transcript = observed_session()
    local before = "ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6"
    local _, compacted = run_confirmed(function(done)
      commands.compact("", done)
    end)
    t.truthy(vim.startswith(compacted[1].msg, "ctxd: Claude Code session compacted"), compacted[1].msg)
    t.wait_for("the compacted figure in the statusline", function()
      local shown = claude.get()
      return shown and shown.usage and shown.usage.tokens < 60000 and ctxd.status() ~= before
    end)
    local size_compacted = vim.uv.fs_stat(transcript).size

    local _, undone = run_confirmed(commands.undo_compact)
    t.contains(undone[1].msg, "last compaction is undone")
    t.truthy(vim.uv.fs_stat(transcript).size < size_compacted, "undo cut the transcript back")
    t.wait_for("the figure from before the compaction again", function()
      return ctxd.status() == before
    end)

    -- Claude Code goes on from the restored transcript: its next turn is shown.
    append(transcript, { line("user"), line("assistant", 50000) })
    t.wait_for("the turn after the undo", function()
      return ctxd.status() == "ctx 50.0% · 17.0k to compact · 50.0k · claude-opus-4-6"
    end)
    t.eq(claude.observe_id(transcript), claude.get().session_id)
  end)

  -- Issue #37 item 2: `claude --resume` appends to an older transcript of the folder; a
  -- daemon that follows only the newest at start sends nothing for it.
  it("shows an older session of the folder that Claude Code resumes, unless another is pinned", function()
    local older, newer = two_sessions_started()

    -- Resumed: the older session is written to, and the statusline follows it.
    append(older, { line("user"), line("assistant", 20000) })
    t.wait_for("the resumed session in the statusline", function()
      return ctxd.status() == "ctx 20.0% · 47.0k to compact · 20.0k · claude-opus-4-6"
    end)
    t.eq(claude.observe_id(older), claude.get().session_id)
    -- And stays followed: its next turn shows too.
    append(older, { line("user"), line("assistant", 30000) })
    t.wait_for("the resumed session's next turn", function()
      return ctxd.status() == "ctx 30.0% · 37.0k to compact · 30.0k · claude-opus-4-6"
    end)

    -- The user pins the newer session: a turn of the resumed one is read, not shown.
    claude.pin(claude.observe_id(newer))
    t.eq(FIRST_TURN, ctxd.status())
    append(older, { line("user"), line("assistant", 35000) })
    t.wait_for("the resumed session's turn read", function()
      local resumed = claude.get(claude.observe_id(older))
      return resumed and resumed.usage and resumed.usage.tokens == 35000
    end)
    t.eq(FIRST_TURN, ctxd.status())
  end)

  it("setup() with observe_claude_code = false stops showing the sessions, and true shows them again", function()
    observed_session()
    local cmd = client.state.config.cmd
    local function setup(on)
      ctxd.setup({
        cmd = cmd,
        settings = { autoCompactWindow = 100000, provider = "offline" },
        observe_claude_code = on,
      })
      t.wait_for("the daemon to be ready", client.is_ready)
    end
    setup(false)
    t.wait_for("nothing in the statusline", function()
      return ctxd.status() == ""
    end)
    setup(true)
    t.wait_for("the session again", function()
      return ctxd.status() == "ctx 60.0% · 7.0k to compact · 60.0k · claude-opus-4-6"
    end)
  end)

  it("follows a later :cd into a project (DirChanged)", function()
    start_in_new_folder()
    -- Another project, whose session Claude Code writes; the editor moves there later.
    local other = new_folder("other.app")
    local project_dir = expected_project_dir(other)
    first_turn(project_dir)
    vim.cmd.cd(vim.fn.fnameescape(other))
    wait_for_first_turn("the other project's session")
    t.eq(project_dir, claude.get().project_dir)
    t.eq({}, claude.waiting(), "the first directory's wait is over")
  end)

  it("shows the session of a folder named with characters outside the Basic Multilingual Plane", function()
    local folder = start_in_new_folder("café-😀")
    local project_dir = expected_project_dir(folder)
    t.truthy(vim.endswith(project_dir, "-caf----"), project_dir)
    first_turn(project_dir)
    wait_for_first_turn("the session in the statusline")
  end)

  it("shows the session of the folder a symlink points to, as Claude Code names it", function()
    local real = start_in_new_folder("real.app")
    local link = vim.fs.dirname(real) .. "/link"
    vim.uv.fs_symlink(real, link)
    vim.cmd.cd(vim.fn.fnameescape(link))
    local project_dir = expected_project_dir(real)
    first_turn(project_dir)
    wait_for_first_turn("the real folder's session")
  end)

  it(":Ctxd with no argument prints the usage line", function()
    require("ctxd.commands").register()
    local messages = {}
    local notify = vim.notify
    vim.notify = function(msg, level)
      table.insert(messages, { msg = msg, level = level })
    end
    local ok, err = pcall(vim.cmd, "Ctxd")
    vim.notify = notify
    t.truthy(ok, err)
    t.eq(1, #messages)
    t.eq(vim.log.levels.INFO, messages[1].level)
    local names = vim.fn.getcompletion("Ctxd ", "cmdline")
    t.truthy(vim.startswith(messages[1].msg, "Usage: :Ctxd {" .. table.concat(names, "|") .. "}\n"), messages[1].msg)
    t.contains(messages[1].msg, "compact the current session")
  end)

  it("completes :Ctxd subcommands and windows", function()
    t.eq({ "compact", "context" }, vim.fn.getcompletion("Ctxd co", "cmdline"))
    t.eq(
      { "compact", "context", "history", "log", "restart", "sessions", "undo", "window" },
      vim.fn.getcompletion("Ctxd ", "cmdline")
    )
    t.eq({ "200k" }, vim.fn.getcompletion("Ctxd window 2", "cmdline"))
  end)

  it(":Ctxd window explains a window the model cannot take", function()
    observed_session()
    local messages = {}
    local notify = vim.notify
    vim.notify = function(msg, level)
      table.insert(messages, { msg = msg, level = level })
    end
    local done, result = false, nil
    commands.auto_compact_window("500k", nil, function(_, r)
      done, result = true, r
    end)
    local ok, err = pcall(t.wait_for, "the answer", function()
      return done
    end)
    vim.notify = notify
    t.truthy(ok, err)
    t.eq(MODEL, result.model, "the observed session's model")
    t.truthy(result.reason, "the answer says why: " .. vim.inspect(result))
    t.eq(
      { msg = "ctxd: window 200,000, not 500,000: " .. result.reason .. ".", level = vim.log.levels.WARN },
      messages[1]
    )
    t.contains(result.reason, "at most 200000")
    t.contains(messages[#messages].msg, "ctxd: auto-compact window for " .. MODEL .. " is 200,000 tokens")
  end)
end)

describe("observing while the daemon refuses", function()
  it("asks at most twice when a transcript exists, and says why it waits", function()
    claude.reset()
    local dir = scratch .. "/refused"
    local refused_project = claude.project_dir(dir, config_dir)
    vim.fn.mkdir(refused_project, "p")
    append(refused_project .. "/s.jsonl", { line("user") })
    local asked = 0
    local function refuse(_, _, callback)
      asked = asked + 1
      vim.schedule(function()
        callback({ message = "cannot read the project" })
      end)
    end
    vim.env.CLAUDE_CONFIG_DIR = config_dir
    claude.observe(refuse, dir)
    -- The client gives up until the next daemon start, and says so in its log.
    local gave_up = "cannot observe the Claude Code sessions of " .. dir .. ": cannot read the project"
    t.wait_for("the client to give up", function()
      for _, entry in ipairs(require("ctxd.client").state.log) do
        if entry:find(gave_up, 1, true) then
          return true
        end
      end
    end)
    t.eq(2, asked)
    -- Nor does it ask again over the next 200 ms, while the transcript grows (a watcher
    -- on the project would fire).
    append(refused_project .. "/s.jsonl", { line("user") })
    vim.wait(200)
    vim.env.CLAUDE_CONFIG_DIR = nil
    t.eq(2, asked)
    t.eq("cannot read the project", claude.waiting()[1].reason)
    claude.reset()
  end)
end)
