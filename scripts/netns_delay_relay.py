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

What it charges is what a link of that RTT charges, no more:
- The event loop waits on select(2), whose timeout has microsecond
  resolution. epoll's (asyncio's default on Linux) has milliseconds, and
  asyncio rounds a shorter wait up to a whole one, so a hold of 0.1 ms
  took 1 ms or more and each round trip through a 0.2 ms relay about
  2.5 ms: a protocol with round trips paid ten times the RTT promised,
  a one-way stream almost nothing. The process's timer slack is 1 ns
  (the default 50 us is late on every hold).
- The kernel completes a connection to the relay at once, where a link
  of that RTT takes one round trip (SYN, SYN-ACK) before the client's
  first bytes leave. So the client's bytes are delivered no earlier than
  1.5 RTT after the connection was accepted (the handshake's round trip
  and their own half), the server's no earlier than 2 RTT after it (the
  server's accept needs the handshake's last ACK): every connection
  pays its handshake, as it would over netem.

And it holds about what a link of that RTT holds, no more: a direction
stops reading while --max-held bytes (1 MiB by default) wait for their
time, so the sender's TCP window closes as it would behind the link (10
Gbit/s holds 125 KB in a 0.1 ms one-way trip). Unbounded, a relay
takes in whatever a sender faster than its own delivery writes (35 MiB
of QEMU's migration at 10 Gbit/s on 2 cores, the last of it delivered
150 ms late), and the sender counts its stream sent long before a link
could have carried it.
"""

import argparse
import asyncio
import ctypes
import selectors
import sys
import time


def hostport(s):
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{s!r}: HOST:PORT")
    return host, int(port)


async def pump(reader, writer, delay, not_before, max_held):
    """Copies reader into writer, each chunk delivered `delay` seconds
    after it arrived and not before the monotonic time `not_before` (the
    connection's handshake; chunks keep their order). Reading waits while
    `max_held` bytes or more are waiting to be delivered."""
    queue = asyncio.Queue()
    held = 0
    room = asyncio.Event()
    room.set()

    async def deliver():
        nonlocal held
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                at, data = item
                wait = max(at + delay, not_before) - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
                held -= len(data)
                if held < max_held:
                    room.set()
        finally:
            # A delivery that failed (the far side reset) wakes a reader
            # waiting for room, which then stops.
            room.set()
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass

    task = asyncio.ensure_future(deliver())
    try:
        while True:
            await room.wait()
            if task.done():
                break
            data = await reader.read(1 << 16)
            if not data:
                break
            held += len(data)
            if held >= max_held:
                room.clear()
            await queue.put((time.monotonic(), data))
    except (ConnectionError, OSError):
        pass
    await queue.put(None)
    try:
        await task
    except (ConnectionError, OSError):
        pass


async def handle(cr, cw, to, delay, max_held):
    accepted = time.monotonic()
    try:
        ur, uw = await asyncio.open_connection(*to)
    except OSError as e:
        print(f"relay: {to[0]}:{to[1]}: {e}", file=sys.stderr)
        cw.close()
        return
    # The handshake a link of this RTT would take (see the module's text):
    # the client's bytes arrive 1.5 RTT after it began, the server's 2 RTT.
    await asyncio.gather(
        pump(cr, uw, delay, accepted + 3 * delay, max_held),
        pump(ur, cw, delay, accepted + 4 * delay, max_held),
    )
    for w in (cw, uw):
        w.close()


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=hostport, required=True)
    ap.add_argument("--to", type=hostport, required=True)
    ap.add_argument("--rtt-ms", type=float, required=True)
    ap.add_argument("--max-held", type=int, default=1 << 20,
                    help="bytes a direction holds before it stops reading (default 1 MiB)")
    a = ap.parse_args()
    if not 0 <= a.rtt_ms <= 10_000:
        ap.error("--rtt-ms: 0 to 10000")
    if not 1 << 16 <= a.max_held <= 1 << 30:
        ap.error("--max-held: 64 KiB to 1 GiB")
    delay = a.rtt_ms / 2000.0
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, a.to, delay, a.max_held), a.listen[0], a.listen[1]
    )
    port = server.sockets[0].getsockname()[1]
    print(
        f"relay: listening on {a.listen[0]}:{port}, rtt {a.rtt_ms:g} ms "
        f"(each direction held {a.rtt_ms / 2:g} ms)",
        flush=True,
    )
    async with server:
        await server.serve_forever()


def precise_timers():
    """Timer slack of 1 ns (prctl PR_SET_TIMERSLACK): each hold ends when
    it is due, not up to 50 us later. Nothing happens where prctl is not
    there."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    precise_timers()
    # select(2): a timeout of microseconds (epoll's is whole milliseconds).
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(main())
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()
