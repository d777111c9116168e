// Drives `corralctl mcp` with the official TypeScript MCP SDK, a client
// that is not corral's own. Run by tests/mcp (mcp_test.go), which starts a
// real corrald and passes:
//   CORRALCTL      path of the corralctl binary
//   CORRAL_SOCKET  corrald's socket
//   MCP_USER_A, MCP_USER_B  users the two MCP servers run as (ownership)
// Each check prints one JSON line {"check", "ok", "detail"}; a line
// {"pause": WHAT} asks the Go test to act on corrald (stop, start,
// restart) and the script waits for a line on stdin before going on.
// Exits 0 when every check passed.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import fs from "node:fs";
import readline from "node:readline";

const corralctl = process.env.CORRALCTL;
const socket = process.env.CORRAL_SOCKET;
const userA = process.env.MCP_USER_A;
const userB = process.env.MCP_USER_B;
const callOpts = { timeout: 120000 };

let failed = 0;
function report(check, ok, detail) {
  if (!ok) failed++;
  console.log(JSON.stringify({ check, ok, detail: detail ?? "" }));
}

const stdinLines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function pause(what) {
  console.log(JSON.stringify({ pause: what }));
  await stdinLines.next();
}

// serverFor starts `corralctl mcp` as user (via setpriv) with the socket.
async function serverFor(user, sock = socket) {
  const args = [`--reuid=${user}`, `--regid=${user}`, "--init-groups", corralctl, "mcp"];
  const transport = new StdioClientTransport({
    command: "setpriv", args, cwd: "/", stderr: "inherit",
    env: { CORRAL_SOCKET: sock, PATH: "/usr/local/bin:/usr/bin:/bin" },
  });
  const client = new Client({ name: "corral-ts-test", version: "1.0.0" });
  await client.connect(transport);
  return client;
}

function text(res) {
  return (res.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
}

// check runs fn, reporting a thrown error or an assertion as a failure.
async function check(name, fn) {
  try {
    const detail = await fn();
    report(name, true, detail);
  } catch (e) {
    report(name, false, e?.stack ?? String(e));
  }
}

function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitGone(pid, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (!fs.existsSync(`/proc/${pid}`)) return true;
    await sleep(50);
  }
  return !fs.existsSync(`/proc/${pid}`);
}

// readUntil calls read_output with wait_ms until pred(all output) holds or
// the execution ends; it returns the output and the last status.
async function readUntil(client, id, pred, rounds = 30) {
  let out = "";
  let st;
  for (let i = 0; i < rounds; i++) {
    const r = await client.callTool({ name: "read_output", arguments: { id, wait_ms: 5000 } }, undefined, callOpts);
    assert(!r.isError, `read_output: ${text(r)}`);
    st = r.structuredContent;
    out += st.stdout;
    if (pred(out) || !st.running) break;
  }
  return { out, st };
}

const a = await serverFor(userA);
const started = [];

await check("initialize", async () => {
  const v = a.getServerVersion();
  const caps = a.getServerCapabilities();
  assert(v?.name === "corral", `server name ${JSON.stringify(v)}`);
  assert(caps?.tools, `no tools capability: ${JSON.stringify(caps)}`);
  return `server ${v.name} ${v.version}`;
});

await check("tools/list has the five tools with schemas and annotations", async () => {
  const { tools } = await a.listTools();
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  const want = ["exec_command", "write_stdin", "read_output", "list_executions", "cancel_execution"];
  assert(JSON.stringify(Object.keys(byName).sort()) === JSON.stringify([...want].sort()), `tools: ${Object.keys(byName)}`);
  for (const n of want) {
    const t = byName[n];
    assert(t.inputSchema?.type === "object", `${n}: inputSchema ${JSON.stringify(t.inputSchema)}`);
    assert(t.outputSchema?.type === "object", `${n}: no outputSchema`);
    assert(t.description, `${n}: no description`);
  }
  const ex = byName.exec_command.inputSchema.properties;
  for (const p of ["cmd", "argv", "workdir", "env", "timeout_ms", "idle_timeout_ms", "yield_time_ms", "tty", "network", "max_output_bytes", "labels"]) {
    assert(ex[p], `exec_command has no property ${p}`);
  }
  assert(ex.cmd.type === "string" && ex.argv.type === "array", "cmd string, argv array");
  assert(ex.yield_time_ms.default === 10000, `yield_time_ms default ${ex.yield_time_ms.default}`);
  assert(ex.max_output_bytes.default === 16384, `max_output_bytes default ${ex.max_output_bytes.default}`);
  assert(JSON.stringify(ex.network.enum) === JSON.stringify(["host", "none"]), "network enum");
  assert(byName.write_stdin.inputSchema.required?.includes("id"), "write_stdin requires id");
  assert(byName.read_output.inputSchema.properties.wait_ms, "read_output has wait_ms");
  const outProps = byName.exec_command.outputSchema.properties;
  for (const p of ["id", "state", "outcome", "exit_code", "signal", "running", "stdout", "stderr", "stdout_total_bytes",
    "stderr_total_bytes", "stdout_next_offset", "stderr_next_offset", "wall_time_ms"]) {
    assert(outProps[p], `exec_command output has no ${p}`);
  }
  assert(byName.exec_command.annotations?.destructiveHint === true, "exec_command destructiveHint");
  assert(byName.cancel_execution.annotations?.destructiveHint === true, "cancel_execution destructiveHint");
  assert(byName.read_output.annotations?.readOnlyHint === true, "read_output readOnlyHint");
  assert(byName.list_executions.annotations?.readOnlyHint === true, "list_executions readOnlyHint");
  return want.join(", ");
});

await check("exec_command quick: exit code and output", async () => {
  const r = await a.callTool({ name: "exec_command", arguments: { cmd: "echo hello; echo oops >&2; exit 3" } }, undefined, callOpts);
  assert(!r.isError, text(r));
  const s = r.structuredContent;
  started.push(s.id);
  assert(s.running === false && s.outcome === "exited" && s.exit_code === 3, `status ${JSON.stringify(s)}`);
  assert(s.stdout === "hello\n" && s.stderr === "oops\n", `output ${JSON.stringify([s.stdout, s.stderr])}`);
  assert(s.stdout_total_bytes === 6 && s.stdout_next_offset === 6, `offsets ${JSON.stringify(s)}`);
  assert(text(r).includes("exited with code 3") && text(r).includes("hello"), `text block: ${text(r)}`);
  return text(r);
});

await check("exec_command argv, env and workdir", async () => {
  const r = await a.callTool({ name: "exec_command", arguments: { argv: ["sh", "-c", 'echo "$GREETING" $(pwd)'], env: { GREETING: "hi" }, workdir: "/tmp" } }, undefined, callOpts);
  assert(!r.isError, text(r));
  started.push(r.structuredContent.id);
  assert(r.structuredContent.stdout === "hi /tmp\n", `stdout ${JSON.stringify(r.structuredContent.stdout)}`);
});

await check("exec_command of a program that cannot start: outcome start_failed with the reason", async () => {
  const r = await a.callTool({ name: "exec_command", arguments: { argv: ["/no/such/program"] } }, undefined, callOpts);
  assert(!r.isError, `a command that cannot start is an outcome, not a failed call: ${text(r)}`);
  const s = r.structuredContent;
  started.push(s.id);
  assert(s.outcome === "start_failed" && s.error && !s.running, `status ${JSON.stringify(s)}`);
  assert(text(r).includes("start_failed") && text(r).includes(s.error), `text block: ${text(r)}`);
  return text(r);
});

await check("exec_command long: running after yield_time_ms, then read_output with wait_ms until it ends", async () => {
  const r = await a.callTool({ name: "exec_command", arguments: { cmd: "echo start; sleep 2; echo end", yield_time_ms: 300 } }, undefined, callOpts);
  assert(!r.isError, text(r));
  const s = r.structuredContent;
  started.push(s.id);
  assert(s.running === true && s.outcome === null && s.exit_code === null, `first status ${JSON.stringify(s)}`);
  let out = s.stdout;
  let st = s;
  for (let i = 0; i < 20 && st.running; i++) {
    const t0 = Date.now();
    const rr = await a.callTool({ name: "read_output", arguments: { id: s.id, wait_ms: 30000 } }, undefined, callOpts);
    assert(!rr.isError, text(rr));
    // The long-poll returns when output or the end arrives, not at wait_ms.
    assert(Date.now() - t0 < 25000, `read_output took ${Date.now() - t0} ms for a command that ends after 2 s`);
    st = rr.structuredContent;
    out += st.stdout;
  }
  assert(!st.running && st.exit_code === 0, `final status ${JSON.stringify(st)}`);
  assert(out === "start\nend\n", `output over the reads ${JSON.stringify(out)}`);
  return `output ${JSON.stringify(out)}`;
});

await check("exec_command output budget: head and tail with the middle marked", async () => {
  const r = await a.callTool({ name: "exec_command", arguments: { cmd: "seq 1 100000", max_output_bytes: 200 } }, undefined, callOpts);
  assert(!r.isError, text(r));
  const s = r.structuredContent;
  started.push(s.id);
  assert(s.stdout.startsWith("1\n2\n3\n") && s.stdout.endsWith("99999\n100000\n"), `stdout ${JSON.stringify(s.stdout)}`);
  assert(/\[\.\.\. \d+ bytes omitted \.\.\.\]/.test(s.stdout), `no omitted marker: ${JSON.stringify(s.stdout)}`);
  assert(s.stdout.length < 300, `stdout ${s.stdout.length} bytes for a budget of 200`);
  assert(s.stdout_total_bytes === 588895, `total ${s.stdout_total_bytes}`);
});

await check("exec_command output never cut inside a character, binary shown safely", async () => {
  const r = await a.callTool({ name: "exec_command", arguments: { argv: ["python3", "-c", "print('\u20ac' * 10000)"], max_output_bytes: 101 } }, undefined, callOpts);
  assert(!r.isError, text(r));
  started.push(r.structuredContent.id);
  const out = r.structuredContent.stdout;
  assert(/^€+\n\[\.\.\. \d+ bytes omitted \.\.\.\]\n€+\n$/.test(out) && !out.includes("\ufffd"), `stdout ${JSON.stringify(out)}`);
  const b = await a.callTool({ name: "exec_command", arguments: { cmd: "head -c 4000 /dev/urandom" } }, undefined, callOpts);
  assert(!b.isError, text(b));
  started.push(b.structuredContent.id);
  assert(/^\[binary output: \d+ bytes, not shown as text; first 32 bytes: ([0-9a-f]{2} ){31}[0-9a-f]{2}\]\n/.test(b.structuredContent.stdout), `binary stdout ${JSON.stringify(b.structuredContent.stdout)}`);
  assert(b.structuredContent.stdout_total_bytes === 4000, `total ${b.structuredContent.stdout_total_bytes}`);
});

await check("exec_command redacts secrets unless asked not to", async () => {
  const cmd = "echo 'Authorization: Bearer abcdefghijklmnop0123'";
  const r = await a.callTool({ name: "exec_command", arguments: { cmd } }, undefined, callOpts);
  assert(!r.isError, text(r));
  started.push(r.structuredContent.id);
  assert(r.structuredContent.stdout === "Authorization: Bearer [REDACTED]\n", `redacted stdout ${JSON.stringify(r.structuredContent.stdout)}`);
  assert(!text(r).includes("abcdefghijklmnop"), `the text block shows the token: ${text(r)}`);
  const plain = await a.callTool({ name: "exec_command", arguments: { cmd, redact: false } }, undefined, callOpts);
  assert(!plain.isError && plain.structuredContent.stdout.includes("abcdefghijklmnop0123"), `redact: false: ${text(plain)}`);
  started.push(plain.structuredContent.id);
});

await check("write_stdin to python3 -i on a terminal", async () => {
  const r = await a.callTool({ name: "exec_command", arguments: { argv: ["python3", "-i", "-q"], tty: true, yield_time_ms: 1000, timeout_ms: 60000 } }, undefined, callOpts);
  assert(!r.isError, text(r));
  const id = r.structuredContent.id;
  started.push(id);
  assert(r.structuredContent.running, `python3 -i not running: ${text(r)}`);
  const w = await a.callTool({ name: "write_stdin", arguments: { id, chars: "import os; print(6*7, os.isatty(0), os.isatty(1))\n", yield_time_ms: 5000 } }, undefined, callOpts);
  assert(!w.isError, text(w));
  let out = w.structuredContent.stdout;
  if (!out.includes("42 True True")) {
    out += (await readUntil(a, id, (o) => o.includes("42 True True"))).out;
  }
  assert(out.includes("42 True True"), `python did not answer on a terminal: ${JSON.stringify(out)}`);
  // Ctrl-C on the terminal interrupts the foreground program, not the tree.
  const sl = await a.callTool({ name: "write_stdin", arguments: { id, chars: "import time; time.sleep(60)\n", yield_time_ms: 500 } }, undefined, callOpts);
  assert(!sl.isError && sl.structuredContent.running, text(sl));
  const cc = await a.callTool({ name: "write_stdin", arguments: { id, chars: "\u0003", yield_time_ms: 5000 } }, undefined, callOpts);
  assert(!cc.isError, text(cc));
  let intr = cc.structuredContent.stdout;
  if (!intr.includes("KeyboardInterrupt")) intr += (await readUntil(a, id, (o) => o.includes("KeyboardInterrupt"))).out;
  assert(intr.includes("KeyboardInterrupt"), `Ctrl-C did not interrupt python: ${JSON.stringify(intr)}`);
  const q = await a.callTool({ name: "write_stdin", arguments: { id, chars: "exit()\n", yield_time_ms: 5000 } }, undefined, callOpts);
  assert(!q.isError, text(q));
  let st = q.structuredContent;
  if (st.running) st = (await readUntil(a, id, () => false)).st;
  assert(!st.running && st.exit_code === 0, `python3 after exit(): ${JSON.stringify(st)}`);
  return JSON.stringify(out);
});

await check("cancel_execution of a tree with a double-forked child: all gone", async () => {
  // The inner shell forks a sleep and exits: the sleep is orphaned, in a
  // session of its own, out of the main process's reach.
  const r = await a.callTool({ name: "exec_command", arguments: { cmd: "setsid sh -c 'sleep 1000 & echo $!'; echo main $$; exec sleep 1000", yield_time_ms: 1500 } }, undefined, callOpts);
  assert(!r.isError, text(r));
  const s = r.structuredContent;
  started.push(s.id);
  assert(s.running, `not running: ${text(r)}`);
  const re = /^(\d+)\nmain (\d+)\n$/;
  let pids = s.stdout;
  if (!re.test(pids)) pids += (await readUntil(a, s.id, (o) => re.test(pids + o))).out;
  const m = re.exec(pids);
  assert(m, `stdout ${JSON.stringify(pids)}`);
  const [orphan, main] = [m[1], m[2]];
  assert(fs.existsSync(`/proc/${orphan}`) && fs.existsSync(`/proc/${main}`), "processes not there before cancel");
  const c = await a.callTool({ name: "cancel_execution", arguments: { id: s.id, reason: "ts test" } }, undefined, callOpts);
  assert(!c.isError, text(c));
  const cs = c.structuredContent;
  assert(cs.state === "cleaned" && cs.outcome === "cancelled" && !cs.running, `after cancel ${JSON.stringify(cs)}`);
  assert(await waitGone(main, 5000), `main process ${main} still there`);
  assert(await waitGone(orphan, 5000), `double-forked child ${orphan} still there`);
  const again = await a.callTool({ name: "cancel_execution", arguments: { id: s.id } }, undefined, callOpts);
  assert(!again.isError && again.structuredContent.outcome === "cancelled", `second cancel: ${text(again)}`);
  return `main ${main} and orphan ${orphan} gone`;
});

await check("list_executions", async () => {
  const l = await a.callTool({ name: "list_executions", arguments: {} }, undefined, callOpts);
  assert(!l.isError, text(l));
  const ids = l.structuredContent.executions.map((e) => e.id);
  for (const id of started) assert(ids.includes(id), `list lacks ${id}: ${ids}`);
  const e = l.structuredContent.executions.find((x) => x.id === started[0]);
  assert(e.state === "cleaned" && e.outcome === "exited" && e.exit_code === 3 && e.argv[0] === "/bin/sh" && e.age, `entry ${JSON.stringify(e)}`);
  const lr = await a.callTool({ name: "list_executions", arguments: { state: "running" } }, undefined, callOpts);
  assert(!lr.isError && lr.structuredContent.executions.every((x) => x.state === "running"), `state filter: ${text(lr)}`);
  return `${ids.length} executions`;
});

// Bad inputs: each must be a tool result with isError and a message, and
// the server must still answer afterwards.
const bad = [
  ["unknown tool", { name: "no_such_tool", arguments: {} }, /unknown tool.*exec_command/],
  ["exec_command without cmd or argv", { name: "exec_command", arguments: {} }, /missing command/],
  ["exec_command with both cmd and argv", { name: "exec_command", arguments: { cmd: "true", argv: ["true"] } }, /not both/],
  ["exec_command cmd of the wrong type", { name: "exec_command", arguments: { cmd: 5 } }, /cmd/],
  ["exec_command yield_time_ms of the wrong type", { name: "exec_command", arguments: { cmd: "true", yield_time_ms: "soon" } }, /yield_time_ms/],
  ["exec_command negative timeout", { name: "exec_command", arguments: { cmd: "true", timeout_ms: -5 } }, /timeout_ms/],
  ["exec_command unknown argument", { name: "exec_command", arguments: { cmd: "true", bogus: 1 } }, /bogus/],
  ["exec_command huge cmd", { name: "exec_command", arguments: { cmd: "x".repeat(300000) } }, /300000 bytes/],
  ["exec_command bad network", { name: "exec_command", arguments: { cmd: "true", network: "wifi" } }, /network/],
  ["write_stdin without id", { name: "write_stdin", arguments: { chars: "x" } }, /id/],
  ["write_stdin unknown id", { name: "write_stdin", arguments: { id: "no-such-id", chars: "x" } }, /no execution "no-such-id".*list_executions/],
  ["read_output unknown id", { name: "read_output", arguments: { id: "no-such-id" } }, /no execution "no-such-id".*list_executions/],
  ["read_output negative offset", { name: "read_output", arguments: { id: "x", stdout_offset: -1 } }, /stdout_offset/],
  ["cancel_execution unknown id", { name: "cancel_execution", arguments: { id: "no-such-id" } }, /no execution "no-such-id"/],
  ["list_executions bad state", { name: "list_executions", arguments: { state: "sleeping" } }, /state/],
];
for (const [name, call, want] of bad) {
  await check(`bad input answered with isError: ${name}`, async () => {
    const r = await a.callTool(call, undefined, callOpts);
    assert(r.isError === true, `not an error: ${JSON.stringify(r)}`);
    assert(want.test(text(r)), `message ${JSON.stringify(text(r))} does not match ${want}`);
    return text(r);
  });
}

await check("write_stdin to a command without stdin says what to do", async () => {
  const r = await a.callTool({ name: "exec_command", arguments: { cmd: "sleep 5", yield_time_ms: 0 } }, undefined, callOpts);
  assert(!r.isError, text(r));
  const id = r.structuredContent.id;
  const w = await a.callTool({ name: "write_stdin", arguments: { id, chars: "x" } }, undefined, callOpts);
  assert(w.isError && /stdin_open|tty/.test(text(w)), `write_stdin: ${text(w)}`);
  await a.callTool({ name: "cancel_execution", arguments: { id } }, undefined, callOpts);
  return text(w);
});

await check("ownership: another user's MCP session cannot see or cancel this one's executions", async () => {
  const b = await serverFor(userB);
  try {
    const r = await b.callTool({ name: "exec_command", arguments: { cmd: "sleep 30", yield_time_ms: 0 } }, undefined, callOpts);
    assert(!r.isError, text(r));
    const id = r.structuredContent.id;
    for (const call of [
      { name: "read_output", arguments: { id } },
      { name: "cancel_execution", arguments: { id } },
      { name: "write_stdin", arguments: { id, chars: "x" } },
    ]) {
      const x = await a.callTool(call, undefined, callOpts);
      assert(x.isError && /no execution/.test(text(x)), `${call.name} of ${userB}'s execution as ${userA}: ${text(x)}`);
    }
    const l = await a.callTool({ name: "list_executions", arguments: {} }, undefined, callOpts);
    assert(!l.structuredContent.executions.some((e) => e.id === id), `${userA} lists ${userB}'s ${id}`);
    const lb = await b.callTool({ name: "list_executions", arguments: {} }, undefined, callOpts);
    assert(!lb.structuredContent.executions.some((e) => started.includes(e.id)), `${userB} lists ${userA}'s executions`);
    const still = await b.callTool({ name: "read_output", arguments: { id } }, undefined, callOpts);
    assert(!still.isError && still.structuredContent.running, `${userB}'s execution after ${userA}'s cancel: ${text(still)}`);
    const c = await b.callTool({ name: "cancel_execution", arguments: { id } }, undefined, callOpts);
    assert(!c.isError && c.structuredContent.outcome === "cancelled", `${userB} cancels its own: ${text(c)}`);
  } finally {
    await b.close();
  }
});

await check("corrald down: isError that says what to do, then the same session works once it is back", async () => {
  await pause("stop");
  const r = await a.callTool({ name: "exec_command", arguments: { cmd: "echo x" } }, undefined, callOpts);
  assert(r.isError && /not reachable/.test(text(r)) && /call the tool again/.test(text(r)), `with corrald down: ${JSON.stringify(r)}`);
  await pause("start");
  const ok = await a.callTool({ name: "exec_command", arguments: { cmd: "echo back" } }, undefined, callOpts);
  assert(!ok.isError && ok.structuredContent.stdout === "back\n", `after start: ${text(ok)}`);
  return text(r);
});

await check("corrald restarting: the session reconnects", async () => {
  const before = await a.callTool({ name: "exec_command", arguments: { cmd: "echo one" } }, undefined, callOpts);
  assert(!before.isError, text(before));
  await pause("restart");
  const after = await a.callTool({ name: "exec_command", arguments: { cmd: "echo two" } }, undefined, callOpts);
  assert(!after.isError && after.structuredContent.stdout === "two\n", `after restart: ${text(after)}`);
  const old = await a.callTool({ name: "read_output", arguments: { id: before.structuredContent.id } }, undefined, callOpts);
  assert(!old.isError && old.structuredContent.exit_code === 0, `record from before the restart: ${text(old)}`);
});

await check("corrald handover (SIGHUP) in the middle of a command: the session carries on, output whole", async () => {
  const r = await a.callTool({ name: "exec_command", arguments: { cmd: "for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.4; done; exit 4", yield_time_ms: 300, timeout_ms: 60000 } }, undefined, callOpts);
  assert(!r.isError && r.structuredContent.running, text(r));
  const id = r.structuredContent.id;
  let out = r.structuredContent.stdout;
  await pause("handover");
  let st = r.structuredContent;
  for (let i = 0; i < 40 && st.running; i++) {
    const rr = await a.callTool({ name: "read_output", arguments: { id, wait_ms: 10000 } }, undefined, callOpts);
    assert(!rr.isError, `read_output after the handover: ${text(rr)}`);
    st = rr.structuredContent;
    out += st.stdout;
  }
  assert(!st.running && st.outcome === "exited" && st.exit_code === 4, `after the handover: ${JSON.stringify(st)}`);
  assert(out === [1, 2, 3, 4, 5, 6].map((i) => `tick ${i}\n`).join(""), `output across the handover ${JSON.stringify(out)}`);
});

await check("server still answers after all of that", async () => {
  const r = await a.callTool({ name: "exec_command", arguments: { argv: ["true"] } }, undefined, callOpts);
  assert(!r.isError && r.structuredContent.exit_code === 0, text(r));
});

await a.close();
process.exit(failed ? 1 : 0);
