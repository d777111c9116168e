#!/usr/bin/env python3
"""Prints a real `corralctl mcp` session like the one in README.md ("Use
corral as your agent's shell"): raw JSON-RPC lines in and out, driven over
the server's stdin and stdout. Needs a running corrald:

    CORRAL_SOCKET=/tmp/corral.sock python3 tests/mcp/transcript.py [bin/corralctl]
"""

import json
import os
import subprocess
import sys

corralctl = sys.argv[1] if len(sys.argv) > 1 else "bin/corralctl"
p = subprocess.Popen([corralctl, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
next_id = 0


def send(m):
    print("->", json.dumps(m, ensure_ascii=False))
    p.stdin.write(json.dumps(m) + "\n")
    p.stdin.flush()


def request(method, params):
    global next_id
    next_id += 1
    send({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params})
    while True:
        m = json.loads(p.stdout.readline())
        if m.get("id") == next_id:
            if method == "tools/list":  # the schemas are long
                m = {"jsonrpc": "2.0", "id": m["id"], "result": {"tools": [
                    {"name": t["name"], "annotations": t.get("annotations"), "inputSchema": "..."} for t in m["result"]["tools"]]}}
            print("<-", json.dumps(m, ensure_ascii=False))
            return m


def tool(name, args):
    return request("tools/call", {"name": name, "arguments": args})["result"].get("structuredContent")


request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "demo", "version": "1"}})
send({"jsonrpc": "2.0", "method": "notifications/initialized"})
request("tools/list", {})
tool("exec_command", {"cmd": "uname -s; ls /nonexistent"})
s = tool("exec_command", {"cmd": "for i in 1 2 3; do echo step $i; sleep 1; done", "yield_time_ms": 1500})
tool("read_output", {"id": s["id"], "wait_ms": 10000})
tool("read_output", {"id": s["id"], "wait_ms": 10000})
s = tool("exec_command", {"argv": ["python3", "-q"], "tty": True, "yield_time_ms": 500})
tool("write_stdin", {"id": s["id"], "chars": "sum(range(10))\n"})
tool("cancel_execution", {"id": s["id"]})
s = tool("exec_command", {"cmd": "sleep 600", "yield_time_ms": 0})
tool("cancel_execution", {"id": s["id"]})
tool("read_output", {"id": "no-such-id"})
p.stdin.close()
sys.exit(p.wait())
