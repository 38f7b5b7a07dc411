"""A stand-in for a pool's Service in e2e/interop/frozen-node: a TCP proxy on 127.0.0.1
that sends its first connection to one node and every later one to another, as
kube-proxy gives each new connection to some pod. The first node is the one the harness
freezes; a call retried on a fresh connection then reaches the live one. Usage:

    service_proxy.py LISTEN_PORT FIRST_PORT LATER_PORT

Prints "listening" once it accepts connections; runs until it is terminated.
"""

import asyncio
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass  # the other side went away: close this one too
    finally:
        writer.close()


async def main(listen: int, first: int, later: int) -> None:
    accepted = 0

    async def serve(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        port = first if accepted == 1 else later
        try:
            node_reader, node_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, node_writer), pipe(node_reader, client_writer))

    server = await asyncio.start_server(serve, "127.0.0.1", listen)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    asyncio.run(main(*(int(port) for port in sys.argv[1:])))
