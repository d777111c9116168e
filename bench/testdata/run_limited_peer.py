#!/usr/bin/env python3
"""Peer for corral's benchmark suite: the asyncio run_limited of the seed
article (/work/shared/seeds/003_e7d1960a1770eace.txt, section 5), unchanged,
driven by one command per line on stdin:

    true          run_limited(["/bin/true"])
    drain N       run_limited(["/usr/bin/head", "-c", N, "/dev/zero"])
    quit          exit

For each command it prints one JSON line: the time run_limited took
(time.perf_counter_ns around the await), its exit code, bytes kept on
stdout and the truncated flag. The event loop lives as long as the peer, so
interpreter start-up is not part of any figure.
"""
import asyncio
import json
import os
import signal
import sys
import time


# --- the article's function, verbatim ------------------------------------
async def run_limited(cmd: list[str], timeout_s: float = 30.0, max_bytes: int = 256_000):
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    out_buf, err_buf = bytearray(), bytearray()
    truncated = False

    async def pump(stream, buf):
        nonlocal truncated
        while True:
            chunk = await stream.read(4096)
            if not chunk:
                break
            if len(buf) < max_bytes:
                need = max_bytes - len(buf)
                buf += chunk[:need]
                if len(chunk) > need:
                    truncated = True
            else:
                truncated = True

    try:
        await asyncio.wait_for(
            asyncio.gather(pump(proc.stdout, out_buf), pump(proc.stderr, err_buf)),
            timeout=timeout_s,
        )
        code = await asyncio.wait_for(proc.wait(), timeout=5)
    except asyncio.TimeoutError:
        truncated = True
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            await asyncio.sleep(2)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        code = await proc.wait()
    return code, bytes(out_buf), bytes(err_buf), truncated
# --------------------------------------------------------------------------


async def main() -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            return 0
        words = line.decode().split()
        if not words:
            continue
        if words[0] == "quit":
            return 0
        if words[0] == "true":
            cmd = ["/bin/true"]
        elif words[0] == "drain" and len(words) == 2:
            cmd = ["/usr/bin/head", "-c", words[1], "/dev/zero"]
        else:
            print(json.dumps({"error": "unknown command " + line.decode().strip()}), flush=True)
            continue
        t0 = time.perf_counter_ns()
        code, out, _err, truncated = await run_limited(cmd, timeout_s=300.0)
        ns = time.perf_counter_ns() - t0
        print(json.dumps({"ns": ns, "code": code, "stdout_kept": len(out), "truncated": truncated}), flush=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
