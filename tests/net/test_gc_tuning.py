"""The garbage collector's tuning for serving processes (rsnet/net/gc_tuning.py): what it sets,
that cyclic garbage is still collected after it, and that ``rsnet serve`` applies it.

Each check runs in a child process: the tuning is for a whole process (it freezes every object
alive), and this one runs the rest of the suite."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import trio

import rsnet
from rsnet.net.gc_tuning import MIDDLE, OLD, YOUNG

from .test_processes import Process


def _run_python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line, returned here."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_tuning_freezes_what_start_up_made_and_raises_the_young_threshold():
    found = _run_python(
        """
        import gc, json
        from rsnet.net.gc_tuning import tune_for_serving
        made_at_start_up = [[n] for n in range(20_000)]  # lists: always tracked
        before = gc.get_threshold()
        tune_for_serving()
        walked = {id(o) for o in gc.get_objects()}  # what collections still walk (not the frozen)
        print(json.dumps({
            "before": before,
            "after": gc.get_threshold(),
            "frozen": gc.get_freeze_count(),
            "still_walked": sum(id(o) in walked for o in made_at_start_up),
        }))
        """
    )
    assert found["before"] == [700, 10, 10]
    assert found["after"] == [YOUNG, MIDDLE, OLD]
    assert found["frozen"] > 20_000
    assert found["still_walked"] == 0


def test_cyclic_garbage_is_still_collected_after_tuning():
    """Ten young thresholds' worth of objects in reference cycles, made and dropped one by one,
    never explicitly collected: the collector frees them as it goes, so at no time do more
    than about a threshold's worth wait."""
    found = _run_python(
        f"""
        import gc, json
        from rsnet.net.gc_tuning import tune_for_serving
        tune_for_serving()
        alive = 0
        most = 0

        class Cycle:
            def __init__(self):
                global alive
                alive += 1
                self.me = self  # a reference cycle: reference counting alone never frees it

            def __del__(self):
                global alive
                alive -= 1

        for _ in range(10 * {YOUNG}):
            Cycle()
            most = max(most, alive)
        print(json.dumps({{"most": most, "alive": alive, "young": gc.get_stats()[0]["collections"]}}))
        """
    )
    assert found["young"] >= 5, "young collections ran"
    assert found["most"] <= 2 * YOUNG, f"{found['most']} cycles waited at once"
    assert found["alive"] <= 2 * YOUNG


async def test_rsnet_serve_tunes_its_process(tmp_path):
    """A publisher served by ``rsnet serve`` reports its own process's collector settings."""
    (tmp_path / "collector_probe.py").write_text(
        textwrap.dedent(
            """
            import gc
            import rsnet

            server = rsnet.Server()

            @server.publisher("collector")
            def collector(params, ctx):
                return rsnet.from_iterable([*gc.get_threshold(), gc.get_freeze_count()])
            """
        )
    )
    server = await Process.start("serve", "collector_probe:server", "--tcp", "127.0.0.1:0", "--app-dir", str(tmp_path))
    try:
        while "serving tcp://" not in (line := await server.line("stderr")):
            pass
        url = line.split("serving ", 1)[1].strip()
        with trio.fail_after(10):
            async with rsnet.connect(url) as conn:
                *thresholds, frozen = [item async for item in conn.subscribe("collector")]
    finally:
        server.kill()
        await server.wait()
    assert thresholds == [YOUNG, MIDDLE, OLD]
    assert frozen > 10_000  # the modules rsnet serve imported, at least
