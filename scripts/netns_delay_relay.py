#!/usr/bin/env python3
"""Latency where the kernel has no netem: a TCP relay that holds each
direction's bytes for half the round-trip time before passing them on.

    netns_delay_relay.py --listen HOST:PORT --to HOST:PORT --rtt-ms MS

Run it inside one of the namespaces scripts/netns-link.sh makes (ip netns
exec NAME-d ...), listening on that namespace's address and forwarding to
the destination there: every connection through it then sees MS more
round-trip time on top of the veth's. It prints "relay: listening on
HOST:PORT, rtt MS ms (each direction held MS/2 ms)" once bound, and
serves until killed. Bytes are forwarded in order; a connection's end (or
reset) ends its other side once the bytes before it are delivered.
"""

import argparse
import asyncio
import sys
import time


def hostport(s):
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{s!r}: HOST:PORT")
    return host, int(port)


async def pump(reader, writer, delay):
    """Copies reader into writer, each chunk delivered `delay` seconds
    after it arrived (chunks keep their order)."""
    queue = asyncio.Queue()

    async def deliver():
        while True:
            item = await queue.get()
            if item is None:
                break
            at, data = item
            wait = at + delay - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass

    task = asyncio.ensure_future(deliver())
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            await queue.put((time.monotonic(), data))
    except (ConnectionError, OSError):
        pass
    await queue.put(None)
    try:
        await task
    except (ConnectionError, OSError):
        pass


async def handle(cr, cw, to, delay):
    try:
        ur, uw = await asyncio.open_connection(*to)
    except OSError as e:
        print(f"relay: {to[0]}:{to[1]}: {e}", file=sys.stderr)
        cw.close()
        return
    await asyncio.gather(pump(cr, uw, delay), pump(ur, cw, delay))
    for w in (cw, uw):
        w.close()


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=hostport, required=True)
    ap.add_argument("--to", type=hostport, required=True)
    ap.add_argument("--rtt-ms", type=float, required=True)
    a = ap.parse_args()
    if not 0 <= a.rtt_ms <= 10_000:
        ap.error("--rtt-ms: 0 to 10000")
    delay = a.rtt_ms / 2000.0
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, a.to, delay), a.listen[0], a.listen[1]
    )
    port = server.sockets[0].getsockname()[1]
    print(
        f"relay: listening on {a.listen[0]}:{port}, rtt {a.rtt_ms:g} ms "
        f"(each direction held {a.rtt_ms / 2:g} ms)",
        flush=True,
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
