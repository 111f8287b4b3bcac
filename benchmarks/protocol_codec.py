"""How fast the sans-I/O protocol layer encodes and decodes small NEXT frames.

Run: .venv/bin/python benchmarks/protocol_codec.py [--frames N] [--repeat R]

Each line is the best of R runs, in frames (or items) per second of one CPU. Baselines are the
raw msgpack operations the field notes measured, so the protocol's own cost is visible as the
gap. The machine is shared and noisy: read the numbers as ratios.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import msgpack

from rsnet.protocol import Connection, FrameDecoder, Role

CHUNK = 65536  # what one socket read typically returns


def item(i: int) -> dict[str, object]:
    return {"i": i, "v": "x"}


def open_pair(demand: int) -> tuple[Connection, Connection, int]:
    """A handshaken client/server pair with one stream the server publishes."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(client.data_to_send())
    server.send_welcome()
    client.receive_data(server.data_to_send())
    stream_id = client.send_subscribe("bench", initial_demand=demand)
    server.receive_data(client.data_to_send())
    server.send_accept(stream_id)
    client.receive_data(server.data_to_send())
    server.events_received()
    client.events_received()
    return client, server, stream_id


def chunks(data: bytes) -> list[bytes]:
    return [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]


def best(repeat: int, run: Callable[[], int]) -> float:
    rates = []
    for _ in range(repeat):
        start = time.perf_counter()
        count = run()
        rates.append(count / (time.perf_counter() - start))
    return max(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n, batch = args.frames, 256
    items = [item(i) for i in range(n)]

    def packer_baseline() -> int:
        packer = msgpack.Packer(autoreset=False)
        for value in items:
            packer.pack([21, 1, value])
        return n

    def send_next() -> int:
        _, server, stream_id = open_pair(n)
        send = server.send_next
        for value in items:
            send(stream_id, value)
        server.data_to_send()
        return n

    def send_batch() -> int:
        _, server, stream_id = open_pair(n)
        for i in range(0, n, batch):
            server.send_batch(stream_id, items[i : i + batch])
        server.data_to_send()
        return n

    _, server, stream_id = open_pair(n)
    for value in items:
        server.send_next(stream_id, value)
    next_wire = chunks(bytes(server.data_to_send()))
    _, server, stream_id = open_pair(n)
    for i in range(0, n, batch):
        server.send_batch(stream_id, items[i : i + batch])
    batch_wire = chunks(bytes(server.data_to_send()))

    def unpacker_baseline() -> int:
        unpacker = msgpack.Unpacker(max_buffer_size=1 << 20)
        count = 0
        for chunk in next_wire:
            unpacker.feed(chunk)
            for _ in unpacker:
                count += 1
        return count

    def frame_decoder() -> int:
        decoder = FrameDecoder()
        count = 0
        for chunk in next_wire:
            for _ in decoder.frames(chunk):
                count += 1
        return count

    def receive(wire: list[bytes]) -> Callable[[], int]:
        def run() -> int:
            client, _, _ = open_pair(n)
            count = 0
            for chunk in wire:
                client.receive_data(chunk)
                for event in client.events_received():
                    count += len(event.items)
            assert count == n, count
            return count

        return run

    print(f"{n} small NEXT frames ({len(msgpack.packb([21, 1, item(0)]))} bytes each), best of {args.repeat}")
    for name, run in [
        ("baseline msgpack Packer(autoreset=False).pack", packer_baseline),
        ("encode  Connection.send_next", send_next),
        (f"encode  Connection.send_batch ({batch} items/frame)", send_batch),
        ("baseline msgpack Unpacker.feed(64 KiB) + iterate", unpacker_baseline),
        ("decode  FrameDecoder.frames (64 KiB chunks)", frame_decoder),
        ("decode  Connection.receive_data, NEXT frames -> Items", receive(next_wire)),
        (f"decode  Connection.receive_data, BATCH frames ({batch} items)", receive(batch_wire)),
    ]:
        print(f"{name:58s} {best(args.repeat, run) / 1e6:6.2f} M/s")


if __name__ == "__main__":
    main()
